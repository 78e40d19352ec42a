"""examples/diloco_elastic.py: the state a joining site receives, an abandoned step's roll-back,
and a short run of three loopback sites."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch", reason="the example needs the torch extra (wanxport[torch])")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "diloco_elastic.py"
pytestmark = [pytest.mark.timeout(300)]


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diloco_elastic", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_joining_site_receives_the_state_bit_for_bit_and_then_trains_alike() -> None:
    d = example()
    live = d.Trainer(16, 0)
    live.inner_steps(0, 1, 3)
    live.pseudo_gradient()
    live.outer_step()
    joiner = d.Trainer(16, 99)  # another initial model: everything it keeps must come from the state
    joiner.unpack({name: array.copy() for name, array in live.pack().items()})
    assert joiner.step == 1 and joiner.digest() == live.digest()
    for name, tensor in live.state_arrays().items():
        assert torch.equal(joiner.state_arrays()[name], tensor), name
    assert joiner.inner_steps(0, 1, 3) == live.inner_steps(0, 1, 3)
    assert torch.equal(torch.from_numpy(joiner.pseudo_gradient()), torch.from_numpy(live.pseudo_gradient()))


def test_an_abandoned_outer_step_rolls_the_replica_and_adam_back() -> None:
    d = example()
    trainer = d.Trainer(16, 0)
    trainer.inner_steps(0, 0, 2)
    trainer.pseudo_gradient()
    trainer.outer_step()
    before = {name: t.clone() for name, t in trainer.state_arrays().items()}
    trainer.inner_steps(0, 0, 2)
    assert trainer.pseudo_gradient().any()  # the inner steps moved the replica, not the global copy
    trainer.roll_back()
    for name, tensor in trainer.state_arrays().items():
        assert torch.equal(tensor, before[name]), name
    assert not trainer.pseudo_gradient().any()


def test_the_held_out_loss_has_the_noise_floor_and_its_excess_is_what_training_reduces() -> None:
    d = example()
    model = d.make_model(16, 0)
    total, excess = d.eval_losses(model, 0.5)
    assert abs(total - excess - 0.25) < 0.03  # the targets' noise adds its variance, 0.5 ** 2
    assert d.eval_losses(model, 0.0) == (excess, excess)  # no noise: the loss is all excess
    noisy = d.batches(0, 1, 0, 2, 0.5)
    clean = d.batches(0, 1, 0, 2, 0.0)
    for (x, y), (x0, y0) in zip(noisy, clean, strict=True):
        assert torch.equal(x, x0) and torch.equal(y0, d.teacher(x0)) and not torch.equal(y, y0)


@pytest.mark.slow
def test_three_loopback_sites_end_with_the_same_model(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    command = [sys.executable, str(EXAMPLE), "local", "--sites", "3", "--outer-steps", "3",
               "--inner-steps", "2", "--hidden", "16", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["identical"] and result["errors"] == []
    assert result["params"] == 16 * 32 + 16 + 16 * 16 + 16 + 16 * 16 + 16 + 16 + 1


class _Group:
    """The one thing the hold reads of an elastic group: the epoch in force."""

    def __init__(self, members: tuple[int, ...], start: int) -> None:
        from wanxport.collective.membership import Epoch

        self.epoch = Epoch(1, members, start)


def _store() -> object:
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))


SPEC = {"names": ["p", "q", "r"], "awaited": ["r"]}


def test_past_the_last_step_the_sites_hold_until_the_awaited_site_has_completed_a_step() -> None:
    d = example()
    store = _store()
    assert d.RejoinHold(_Group((0, 1), -1), store, {**SPEC, "hold_s": 60.0}).holding(10)  # r is out
    assert d.RejoinHold(_Group((0, 1, 2), 12), store, {**SPEC, "hold_s": 60.0}).holding(12)  # admitted at 12
    assert not d.RejoinHold(_Group((0, 1, 2), 12), store, {**SPEC, "hold_s": 60.0}).holding(13)  # back
    assert not d.RejoinHold(_Group((0, 1), -1), store, {"names": SPEC["names"], "hold_s": 60.0}).holding(10)


def test_a_hold_that_runs_out_ends_every_site_at_the_step_the_first_offered() -> None:
    d = example()
    store = _store()
    impatient = d.RejoinHold(_Group((0, 1), -1), store, {**SPEC, "hold_s": 0.0})
    patient = d.RejoinHold(_Group((0, 1), -1), store, {**SPEC, "hold_s": 60.0})
    assert patient.holding(10)  # its own wait has just begun
    assert impatient.holding(11)  # gives up: the last step is 13 ...
    late = d.RejoinHold(_Group((0, 1), -1), store, {**SPEC, "hold_s": 0.0})
    assert [patient.holding(s) for s in (11, 12, 13)] == [True, True, False]  # ... for every site
    assert [late.holding(s) for s in (12, 13)] == [True, False]  # a later offer does not move it
