"""Fuzz target: the scenario file parser (TOML text from a user or a shared repository).

``parse_scenario`` must raise only ``ScenarioError`` (one line naming the
field) for any text; a scenario it accepts must also give its ideal times
(``ideal_time_s``, the all-reduce bound, and every pair's direct and relayed
bounds between its sites) without an exception, since runs compute them.

    python fuzz/fuzz_scenario.py -max_total_time=600 /tmp/fuzz-scenario fuzz/corpus/scenario
"""

from __future__ import annotations

import harness


def load() -> harness.Check:
    from wanxport.scenario.ideal import allreduce_ideal_time_s, ideal_time_s, pair_ideal_time_s
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
        allreduce_ideal_time_s(scenario, scenario.transfer.size_bytes)
        for src in scenario.sites:
            for dst in scenario.sites:
                if src != dst:
                    pair_ideal_time_s(scenario, src, dst, scenario.transfer.size_bytes, relay=True)

    return check


if __name__ == "__main__":
    harness.run(load)
