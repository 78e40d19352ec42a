"""Fuzz target: the scenario file parser (TOML text from a user or a shared repository).

``parse_scenario`` must raise only ``ScenarioError`` (one line naming the
field) for any text; a scenario it accepts must also give an ideal time
(``ideal_time_s``) without an exception, since every run computes one.

    python fuzz/fuzz_scenario.py -max_total_time=600 /tmp/fuzz-scenario fuzz/corpus/scenario
"""

from __future__ import annotations

import harness


def load() -> harness.Check:
    from wanxport.scenario.ideal import ideal_time_s
    from wanxport.scenario.model import ScenarioError
    from wanxport.scenario.parse import parse_scenario

    def check(data: bytes) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return  # load_scenario refuses non-UTF-8 before parsing
        try:
            scenario = parse_scenario(text, "fuzz.toml")
        except ScenarioError:
            return
        ideal_time_s(scenario)

    return check


if __name__ == "__main__":
    harness.run(load)
