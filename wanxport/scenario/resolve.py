"""A scenario named on a command line: a file path, or the name of a bundled scenario.

The directory of bundled scenarios is an argument, not a constant of this
package: the files belong to whoever ships them (the emulation ships
``emulation/scenarios/*.toml``), and this foundation layer must not know any
upper layer's layout. Callers pass their directory in; the rule for what a
name means (``NAME`` is ``DIRECTORY/NAME.toml`` unless a file ``NAME`` exists)
lives here, once.
"""

from __future__ import annotations

from pathlib import Path

from wanxport.scenario.model import Scenario, ScenarioError
from wanxport.scenario.parse import load_scenario


def bundled_names(directory: Path) -> list[str]:
    """The names of the scenarios in ``directory`` (file stems of ``*.toml``), sorted."""
    return sorted(path.stem for path in directory.glob("*.toml"))


def resolve(arg: str, bundled: Path | None = None) -> Scenario:
    """Load ``arg`` as a file if it exists, else as a scenario name in ``bundled``.

    Raises ScenarioError (one line) when it is neither, listing the bundled names.
    """
    path = Path(arg)
    if path.exists() or bundled is None:
        return load_scenario(path)
    candidate = bundled / f"{arg}.toml"
    if candidate.exists():
        return load_scenario(candidate)
    raise ScenarioError(
        f"{arg}: no such file, nor a bundled scenario of that name; "
        f"give a scenario .toml file or one of: {', '.join(bundled_names(bundled))}"
    )
