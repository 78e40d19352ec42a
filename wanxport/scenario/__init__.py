"""The scenario contract (DESIGN.md section 4): model, parser, ideal bounds, mesh capacity, name resolution.

A foundation layer: it imports no other wanxport layer (only ``wanxport.units``),
because the simulator, the emulation and every report builder depend on it.
"""

from wanxport.scenario.flow import capacities_Bps, egress_ingress_Bps, max_flow_Bps, path_rate_Bps
from wanxport.scenario.ideal import (
    allreduce_ideal_time_s,
    ideal_time_s,
    pair_ideal_time_s,
    relayed_ideal_time_s,
)
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
    "allreduce_ideal_time_s",
    "bundled_names",
    "capacities_Bps",
    "egress_ingress_Bps",
    "ideal_time_s",
    "load_scenario",
    "max_flow_Bps",
    "pair_ideal_time_s",
    "parse_scenario",
    "path_rate_Bps",
    "relayed_ideal_time_s",
    "resolve",
]
