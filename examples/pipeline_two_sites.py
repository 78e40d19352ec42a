"""Pipeline parallelism across two sites: stage 0 at site A, stage 1 at site B, wanxport between.

    python examples/pipeline_two_sites.py [--steps 3] [--microbatches 4] [--hidden 32] [--json FILE]

A model is cut in two: stage 0 (``Linear`` + ``Tanh``) runs at site A, stage 1 (``Linear``
and the loss) at site B. Every training step splits the batch into M microbatches and
runs an explicit schedule on point-to-point messages of a two-site
``wanxport.collective`` group:

* site A runs every microbatch's forward and sends each activation to B as soon as it
  exists (``isend``), then runs each microbatch's backward as its activation gradient
  comes back (receives posted up front, waited in microbatch order);
* site B receives each activation, runs forward, loss and backward for that microbatch
  at once and sends the gradient of the activation back (``isend``).

So activations cross A -> B and their gradients B -> A while both sites compute: the
first microbatch's gradient is on its way back while later activations are still in
flight (GPipe's fill at the first stage, one-forward-one-backward at the last). Each
site then takes its own optimizer step. The loss of microbatch k is the mean over its
rows divided by M, so the accumulated gradients are the whole batch's.

The same model, data and optimizer run in one process (``reference``) on the whole
batch; the two sites' loss and every parameter's gradient must equal it at every step
(``torch.allclose``, rtol 1e-5, atol 1e-6): the schedule changes where the work runs and
how the sums are grouped, nothing else. The sites are processes on this machine over
loopback paths. ``python -m emulation pipeline`` runs this schedule between the sites
of an emulated WAN and times it against gloo.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loopback import PATHS_PER_PAIR, free_ports, make_pki, site_name  # noqa: E402

N_SITES = 2
FEATURES, CLASSES = 8, 4
RTOL, ATOL = 1e-5, 1e-6
ACTIVATION_TAG, GRADIENT_TAG = 1, 2
LR = 0.1


class Pending(Protocol):
    def wait(self) -> Any: ...


class PointToPoint(Protocol):
    """What the schedule needs of a communicator: a wanxport ``SyncGroup`` has it as is;
    ``emulation.baselines.pipeline_app`` adapts torch.distributed (gloo) to it."""

    def isend(self, array: Any, dst: int, tag: int = 0) -> Pending: ...
    def irecv(self, array: Any, src: int, tag: int = 0) -> Pending: ...


def make_stages(hidden: int) -> tuple[nn.Module, nn.Module]:
    """The two halves of the model, the same at every site and in the reference."""
    torch.manual_seed(0)
    return (nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh()), nn.Linear(hidden, CLASSES))


def microbatch(step: int, k: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Microbatch ``k`` of step ``step``: inputs (site A's) and labels (site B's)."""
    gen = torch.Generator().manual_seed(1000 * step + k)
    x = torch.randn(rows, FEATURES, generator=gen)
    return x, (x[:, :CLASSES] * 3).argmax(dim=1)


def first_stage(stage: nn.Module, comm: PointToPoint, step: int, microbatches: int, rows: int,
                hidden: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Site A's part of one step; leaves the gradients in ``stage``. Returns the activations
    it sent and the gradients it received (for the caller's checks)."""
    outputs, sends = [], []
    for k in range(microbatches):
        x, _ = microbatch(step, k, rows)
        y = stage(x)
        outputs.append(y)
        sends.append(comm.isend(y.detach(), dst=1, tag=ACTIVATION_TAG))
    grads = [torch.empty(rows, hidden) for _ in range(microbatches)]
    receives = [comm.irecv(g, src=1, tag=GRADIENT_TAG) for g in grads]
    for y, grad, receive in zip(outputs, grads, receives, strict=True):
        receive.wait()
        y.backward(grad)
    for send in sends:
        send.wait()
    return [y.detach() for y in outputs], grads


def last_stage(stage: nn.Module, comm: PointToPoint, step: int, microbatches: int, rows: int,
               hidden: int) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
    """Site B's part of one step; leaves the gradients in ``stage``. Returns the step's loss,
    the activations it received and the activation gradients it sent."""
    activations = [torch.empty(rows, hidden) for _ in range(microbatches)]
    receives = [comm.irecv(a, src=0, tag=ACTIVATION_TAG) for a in activations]
    loss, sends, sent = 0.0, [], []
    for k, (activation, receive) in enumerate(zip(activations, receives, strict=True)):
        receive.wait()
        activation.requires_grad_(True)
        _, labels = microbatch(step, k, rows)
        part = nn.functional.cross_entropy(stage(activation), labels) / microbatches
        part.backward()
        loss += float(part)
        assert activation.grad is not None
        sent.append(activation.grad)
        sends.append(comm.isend(activation.grad, dst=0, tag=GRADIENT_TAG))
    for send in sends:
        send.wait()
    return loss, [a.detach() for a in activations], sent


def train_stage(site: int, comm: PointToPoint, steps: int, microbatches: int, rows: int,
                hidden: int) -> dict[str, Any]:
    """This site's stage trained for ``steps`` steps; its loss (site B) and gradients per step."""
    stage = make_stages(hidden)[site]
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    losses, grads = [], []
    for step in range(steps):
        opt.zero_grad()
        if site == 0:
            first_stage(stage, comm, step, microbatches, rows, hidden)
        else:
            losses.append(last_stage(stage, comm, step, microbatches, rows, hidden)[0])
        grads.append([p.grad.clone() for p in stage.parameters()])  # type: ignore[union-attr]
        opt.step()
    return {"losses": losses, "grads": grads}


def reference(steps: int, microbatches: int, rows: int, hidden: int) -> dict[str, Any]:
    """The same model, data and optimizer in one process, on the whole batch at once."""
    first, last = make_stages(hidden)
    opt = torch.optim.SGD([*first.parameters(), *last.parameters()], lr=LR)
    losses, grads = [], []
    for step in range(steps):
        batches = [microbatch(step, k, rows) for k in range(microbatches)]
        x = torch.cat([b[0] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        opt.zero_grad()
        loss = nn.functional.cross_entropy(last(first(x)), labels)
        loss.backward()
        losses.append(loss.item())
        grads.append([[p.grad.clone() for p in stage.parameters()] for stage in (first, last)])  # type: ignore[union-attr]
        opt.step()
    return {"losses": losses, "grads": grads}


def site_worker(site: int, work: Path, first_port: int, steps: int, microbatches: int, rows: int,
                hidden: int, timeout: float) -> None:
    """One site: join the two-site group over loopback paths, train its stage, save the result."""
    from wanxport.collective import join_sync

    torch.set_num_threads(1)
    pki = work / "pki"
    paths = [f"127.0.0.1:{first_port + i}" for i in range(PATHS_PER_PAIR)]
    group = join_sync(site, [site_name(s) for s in range(N_SITES)], identity=pki / site_name(site),
                      ca=pki / "ca.pem", paths=paths, timeout=timeout)
    try:
        torch.save(train_stage(site, group, steps, microbatches, rows, hidden), work / f"site-{site}.pt")
        group.barrier()  # neither site closes its session while the other still reads from it
    finally:
        group.close()


def compare(sites: list[dict[str, Any]], ref: dict[str, Any]) -> dict[str, Any]:
    """Per step: the loss and the largest gradient difference against the reference."""
    close: Callable[[torch.Tensor, torch.Tensor], bool] = \
        lambda a, b: bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))  # noqa: E731
    steps = []
    for step, (loss, ref_loss) in enumerate(zip(sites[1]["losses"], ref["losses"], strict=True)):
        pairs = [(g, r) for site in range(N_SITES)
                 for g, r in zip(sites[site]["grads"][step], ref["grads"][step][site], strict=True)]
        steps.append({"loss": loss, "reference_loss": ref_loss,
                      "loss_close": close(torch.tensor(loss), torch.tensor(ref_loss)),
                      "grads_close": all(close(g, r) for g, r in pairs),
                      "max_abs_grad_diff": max(float((g - r).abs().max()) for g, r in pairs)})
    return {"steps": steps, "equal": all(s["loss_close"] and s["grads_close"] for s in steps)}


def run(steps: int, microbatches: int, rows: int, hidden: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wanxport-pipeline-") as tmp:
        work = Path(tmp)
        make_pki(work / "pki", N_SITES)
        first_port = free_ports(PATHS_PER_PAIR)[0]
        mp.spawn(site_worker, args=(work, first_port, steps, microbatches, rows, hidden, timeout),
                 nprocs=N_SITES)
        sites = [torch.load(work / f"site-{s}.pt") for s in range(N_SITES)]
    result = compare(sites, reference(steps, microbatches, rows, hidden))
    return {"sites": N_SITES, "steps": steps, "microbatches": microbatches, "rows": rows, "hidden": hidden,
            "activation_bytes": rows * hidden * 4, "rtol": RTOL, "atol": ATOL, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8, help="rows per microbatch")
    parser.add_argument("--hidden", type=int, default=32, help="activation width (stage 0's output)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per message")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    for name in ("steps", "microbatches", "rows", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)} is not valid; use >= 1")
    result = run(args.steps, args.microbatches, args.rows, args.hidden, args.timeout)
    for k, step in enumerate(result["steps"]):
        print(f"step {k + 1}: loss {step['loss']:.6f} (one process: {step['reference_loss']:.6f}), "
              f"max |grad - one process| = {step['max_abs_grad_diff']:.3g}")
    verdict = "equal" if result["equal"] else "DIFFER from"
    print(f"stage 0 at site A, stage 1 at site B, {args.microbatches} microbatches: loss and gradients "
          f"{verdict} the one-process run at every step (rtol {RTOL:g}, atol {ATOL:g})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
