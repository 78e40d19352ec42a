"""``python -m emulation allreduce``: argument checks (one line, exit 2) without namespaces."""

from __future__ import annotations

import pytest

from emulation.allreduce import AllreduceOptions, check_options
from emulation.cli import main


@pytest.mark.parametrize(("options", "message"), [
    (AllreduceOptions("gloo", compress="int8"), "gloo has no compression"),
    (AllreduceOptions("mpi"), "--comm"),
    (AllreduceOptions("wanxport", ranks_per_site=0), "--ranks-per-site"),
    (AllreduceOptions("wanxport", steps=0), "--steps"),
    (AllreduceOptions("wanxport", ranks_per_site=2, size_bytes=6), "--size"),
])
def test_bad_options_are_one_line_errors(options: AllreduceOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_options(options)


def test_usage_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["allreduce", "allreduce-4route", "--comm", "gloo", "--compress", "bf16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gloo has no compression" in err[0]


def test_bundled_scenario_ideal_is_a_few_seconds() -> None:
    from emulation.bundled import resolve_scenario
    from wanxport.scenario import ideal_time_s

    for name in ("allreduce-4route", "allreduce-4route-blackhole"):
        scenario = resolve_scenario(name)
        assert len(scenario.paths) == 4
        assert 1.0 < ideal_time_s(scenario, 64 << 20, "both") < 5.0
