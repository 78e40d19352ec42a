"""The scenarios the emulation ships: ``emulation/scenarios/*.toml`` (package data).

The emulation owns these files (they are its experiments' named environments);
``wanxport.scenario.resolve`` owns the rule for what a name means. This leaf
module joins the two, so the CLI, ``run`` and ``compare`` share one lookup
without importing each other.
"""

from __future__ import annotations

from pathlib import Path

from wanxport.scenario import Scenario, bundled_names, resolve

DIRECTORY = Path(__file__).resolve().parent / "scenarios"


def resolve_scenario(arg: str) -> Scenario:
    """A scenario file path, or the name of a bundled scenario (e.g. ``clean-2path``)."""
    return resolve(arg, DIRECTORY)


def names() -> list[str]:
    """The bundled scenarios' names, sorted."""
    return bundled_names(DIRECTORY)
