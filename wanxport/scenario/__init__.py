"""The scenario contract (docs/design.md section 4): model, parser, ideal bound, name resolution.

A foundation layer: it imports no other wanxport layer (only ``wanxport.units``),
because the simulator, the emulation and every report builder depend on it.
"""

from wanxport.scenario.ideal import ideal_time_s
from wanxport.scenario.model import (
    BurstLoss,
    LinkParams,
    PathEvent,
    PathSpec,
    Scenario,
    ScenarioError,
    Transfer,
)
from wanxport.scenario.parse import load_scenario, parse_scenario
from wanxport.scenario.resolve import bundled_names, resolve

__all__ = [
    "BurstLoss",
    "LinkParams",
    "PathEvent",
    "PathSpec",
    "Scenario",
    "ScenarioError",
    "Transfer",
    "bundled_names",
    "ideal_time_s",
    "load_scenario",
    "parse_scenario",
    "resolve",
]
