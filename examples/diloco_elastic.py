"""DiLoCo among N sites that keeps training when a site dies, one process per site.

    python examples/diloco_elastic.py local [--sites 3] [--outer-steps 10] [--inner-steps 20]
                                            [--hidden 2048] [--compress int8] [--noise 0.5]
                                            [--json FILE]
    python examples/diloco_elastic.py store PORT          # the job's c10d TCPStore
    python examples/diloco_elastic.py site '<json spec>'  # one site

Each site trains its own replica of a fixed MLP (about 5 M parameters at the default width,
Adam inner optimizer) for H inner steps on its own data, then the sites average their
pseudo-gradients (global - local) with one all-reduce over wanxport and apply the mean with an
outer Nesterov-momentum SGD (DiLoCo's recipe). With three sites or more the group is elastic
(``wanxport.collective.elastic_join_sync``, membership agreed through the job's c10d store):
when a site dies or is cut off, the survivors average over the live sites and go on; a site
that restarts joins at an outer-step boundary and receives the state (global parameters,
outer momentum, Adam's moments, the step) bit-identical from a live site; a site cut off
from the majority waits, then rejoins the same way. ``local`` runs every site as a process on this
machine over loopback paths, with the store in this process; ``python -m emulation diloco``
starts ``store`` in its control namespace and one ``site`` per site namespace, then kills,
blackholes or partitions sites while they train (past the last outer step the sites train on
until a site the faults bring back is back: ``RejoinHold``).

The sites learn a fixed function from inputs whose targets carry noise no model can predict
(``--noise``, a standard deviation), as real data do: the held-out loss levels off near the
noise's variance, and ``done`` also gives its excess over that floor. Every batch is drawn
from a generator seeded by (seed, site, outer step), so a run's data do not depend on when a
process started: a site that restarts and receives the state at step k
trains on exactly what an uninterrupted site would have. A site prints, one JSON object a
line: ``ready`` (group joined), ``outer`` per completed outer step (its start and end on
CLOCK_MONOTONIC, which every network namespace shares, the members that averaged it), and
``done`` (held-out loss of the global model and its excess over the noise's floor, a digest
of the parameters, the state's size).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import resource
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from wanxport.collective import MembershipChanged

FEATURES, BATCH, DEFAULT_HIDDEN, HEAD = 32, 32, 2048, 384
INNER_LR, OUTER_LR, OUTER_MOMENTUM = 1e-3, 0.7, 0.9
EVAL_SAMPLES, EVAL_SEED = 4096, 12345
# The targets' noise (standard deviation), which no model can predict: as real data's, it puts a
# floor of NOISE ** 2 under the held-out loss, so the loss levels off as a language model's does
# at the text's entropy instead of falling by orders of magnitude for as long as training runs.
DEFAULT_NOISE = 0.5


def make_model(hidden: int, seed: int) -> nn.Module:
    """The same initial model at every site: 5.05 M parameters at hidden = 2048."""
    torch.manual_seed(seed)
    head = min(HEAD, hidden)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, head), nn.GELU(), nn.Linear(head, 1))


_TEACHER = torch.Generator().manual_seed(4242)
TEACHER_WAVES = torch.randn(FEATURES, 4, generator=_TEACHER) / FEATURES ** 0.5
TEACHER_LINEAR = torch.randn(FEATURES, 1, generator=_TEACHER) / FEATURES ** 0.5


def teacher(x: torch.Tensor) -> torch.Tensor:
    """The function every site learns: a linear part learnt in a few steps, waves that take
    longer (the held-out loss starts near 1.7 and a width of 256 reaches 0.31 in 200 Adam steps)."""
    return torch.sin(1.5 * (x @ TEACHER_WAVES)).sum(dim=1, keepdim=True) / 2 + x @ TEACHER_LINEAR


def noisy(x: torch.Tensor, noise: float, gen: torch.Generator) -> torch.Tensor:
    """The teacher's value at ``x`` plus the targets' unpredictable noise."""
    y = teacher(x)
    return y + noise * torch.randn(y.shape, generator=gen) if noise else y


def batches(seed: int, site: int, outer: int, inner_steps: int, noise: float,
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Site ``site``'s H batches of outer step ``outer``; inputs shifted per site (non-IID)."""
    key = seed * 1_000_003 + site * 7_919 + outer
    gen, noise_gen = torch.Generator().manual_seed(key), torch.Generator().manual_seed(key + 1 << 40)
    out = []
    for _ in range(inner_steps):  # the inputs do not depend on the noise
        x = torch.randn(BATCH, FEATURES, generator=gen) + 0.3 * (site - 1)
        out.append((x, noisy(x, noise, noise_gen)))
    return out


def eval_losses(model: nn.Module, noise: float) -> tuple[float, float]:
    """The held-out loss (targets with their noise, as a validation set's) and its excess over
    the noise's floor (against the noise-free teacher: what training can still reduce)."""
    gen = torch.Generator().manual_seed(EVAL_SEED)
    x = torch.randn(EVAL_SAMPLES, FEATURES, generator=gen)
    with torch.no_grad():
        out = model(x)
        return (float(nn.functional.mse_loss(out, noisy(x, noise, gen))),
                float(nn.functional.mse_loss(out, teacher(x))))


class Trainer:
    """One site's replica, inner Adam, and the outer state every site holds alike (the global
    parameters and the outer momentum) plus the outer step counter: the state a restarted
    site needs."""

    # Equal at every site as far along (``StateHolder.shared_arrays``): a joiner takes them in
    # parts from each such site at once, and Adam's moments (each site's own) from one.
    shared_arrays = ("params", "momentum")

    def __init__(self, hidden: int, seed: int, noise: float = DEFAULT_NOISE) -> None:
        self.noise = noise
        self.model = make_model(hidden, seed)
        self.params = list(self.model.parameters())
        self.global_flat = parameters_to_vector(self.params).detach().clone()
        self.momentum = torch.zeros_like(self.global_flat)
        self.inner = torch.optim.Adam(self.params, lr=INNER_LR)
        self.pseudo = torch.empty_like(self.global_flat)
        self.step = 0  # completed outer steps
        self._adam_before: dict[nn.Parameter, dict[str, torch.Tensor]] = {}

    @property
    def n_params(self) -> int:
        return self.global_flat.numel()

    def inner_steps(self, seed: int, site: int, inner_steps: int) -> float:
        """H inner steps on this site's batches for the coming outer step; their mean loss."""
        self._adam_before = {p: {k: v.clone() for k, v in st.items()} for p, st in self.inner.state.items()}
        total = 0.0
        for x, y in batches(seed, site, self.step, inner_steps, self.noise):
            self.inner.zero_grad()
            loss = nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.inner.step()
            total += float(loss.detach())
        return total / inner_steps

    def pseudo_gradient(self) -> np.ndarray:
        """global - local, as the float32 array the all-reduce averages in place."""
        torch.sub(self.global_flat, parameters_to_vector(self.params).detach(), out=self.pseudo)
        return self.pseudo.numpy()

    def outer_step(self) -> None:
        """Nesterov outer SGD on the averaged pseudo-gradient; the replica restarts from the result."""
        self.momentum.mul_(OUTER_MOMENTUM).add_(self.pseudo)
        self.global_flat.sub_(OUTER_LR * (self.pseudo + OUTER_MOMENTUM * self.momentum))
        self._replica_from_global()
        self.step += 1

    def _replica_from_global(self) -> None:
        """Copy the global parameters into the replica's (``vector_to_parameters`` would make
        the parameters views of the global vector, and the inner steps would move it too)."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(self.global_flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def roll_back(self) -> None:
        """Undo the inner steps of an outer step whose all-reduce was abandoned (the membership
        changed under it): the replica back to the global parameters, Adam to before."""
        self._replica_from_global()
        self.inner.state.clear()
        self.inner.state.update(self._adam_before)

    def pack(self) -> dict[str, np.ndarray]:
        """The state as named numpy arrays (``StateHolder``: what a joining site receives)."""
        return {name: t.numpy() for name, t in self.state_arrays().items()}

    def unpack(self, arrays: dict[str, np.ndarray]) -> None:
        self.load_state_arrays({name: torch.from_numpy(a) for name, a in arrays.items()})

    def state_arrays(self) -> dict[str, torch.Tensor]:
        """What a site that joins receives, as flat tensors: parameters, outer momentum, the
        inner Adam moments and the counters (Adam's per-parameter step and the outer step)."""
        moments = [self.inner.state.get(p, {}) for p in self.params]
        zeros = [torch.zeros_like(p) for p in self.params]
        return {
            "params": self.global_flat, "momentum": self.momentum,
            "exp_avg": torch.cat([m.get("exp_avg", z).reshape(-1)
                                  for m, z in zip(moments, zeros, strict=True)]),
            "exp_avg_sq": torch.cat([m.get("exp_avg_sq", z).reshape(-1)
                                     for m, z in zip(moments, zeros, strict=True)]),
            "counters": torch.tensor([float(self.step), float(moments[0].get("step", 0))]),
        }

    def load_state_arrays(self, arrays: dict[str, torch.Tensor]) -> None:
        """The inverse of ``state_arrays`` (bit-identical: copies, no arithmetic)."""
        self.global_flat.copy_(arrays["params"])
        self.momentum.copy_(arrays["momentum"])
        self._replica_from_global()
        step, adam_step = (int(v) for v in arrays["counters"].tolist())
        self.step = step
        if adam_step:
            offset = 0
            for p in self.params:
                n = p.numel()
                self.inner.state[p] = {
                    "step": torch.tensor(float(adam_step)),
                    "exp_avg": arrays["exp_avg"][offset:offset + n].view_as(p).clone(),
                    "exp_avg_sq": arrays["exp_avg_sq"][offset:offset + n].view_as(p).clone()}
                offset += n

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_arrays().values())

    def digest(self) -> str:
        return hashlib.sha256(self.global_flat.numpy().tobytes()).hexdigest()[:16]


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round(usage.ru_utime + usage.ru_stime, 2)


def join_group(spec: dict[str, Any], store: Any) -> Any:
    """This site's wanxport group, one session with every other site on the spec's paths:
    elastic (through the store) with three sites or more, else a plain group. The same
    call starts a site and restarts it."""
    from wanxport.collective import elastic_join_sync, join_sync

    pki, names = spec["pki"], spec["names"]
    kwargs = {"identity": f"{pki}/{names[spec['site']]}", "ca": f"{pki}/ca.pem",
              "paths": {int(peer): given for peer, given in spec["paths"].items()},
              "timeout": spec["timeout"], "join_timeout": spec.get("join_timeout", 120.0)}
    if len(names) < 3:
        return join_sync(spec["site"], names, **kwargs)
    return elastic_join_sync(store, spec["site"], names, **kwargs)


class MembershipLog:
    """Emits a ``membership`` line whenever the group's epoch is not the one last seen."""

    def __init__(self, group: Any, names: list[str]) -> None:
        self.group, self.names, self.seen = group, names, None

    def check(self) -> None:
        epoch = getattr(self.group, "epoch", None)
        if epoch is None or epoch.number == self.seen:
            return
        self.seen = epoch.number
        emit({"event": "membership", "t": time.monotonic(), "epoch": epoch.number,
              "members": [self.names[m] for m in epoch.members], "changes": self.group.changes})

    def members(self) -> list[int]:
        return list(getattr(self.group, "members", range(len(self.names))))


def connect_store(spec: dict[str, Any]) -> Any:
    """The job's TCPStore (on the emulation's control network)."""
    import torch.distributed as dist

    host, _, port = spec["store"].rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=spec["timeout"]),
                         wait_for_workers=False)


def finish_together(store: Any, membership: MembershipLog, spec: dict[str, Any]) -> None:
    """Close only when every live site has its last result: the site that ends a collective
    first must not tear its sessions down while a peer still waits for its last bytes."""
    names = spec["names"]
    store.set(f"diloco/finished/{names[spec['site']]}", "1")
    try:
        store.wait([f"diloco/finished/{names[m]}" for m in membership.members()],
                   timedelta(seconds=spec["timeout"]))
    except Exception as exc:  # noqa: BLE001 - a site lost at the very end: close anyway
        emit({"event": "finish_wait", "error": f"{type(exc).__name__}: {exc}"})


class RejoinHold:
    """Past the last outer step, the sites go on training while a site the run's faults take
    out and bring back (``spec["awaited"]``) is not back, for up to ``spec["hold_s"]``.
    Without it a restart slower than the rest of the run (a busy host importing torch) finds
    the group ended, and the run measures nothing of the rejoin.

    Every site must stop at the same step. A site is back once it is a member of the epoch in
    force and that epoch began before this step (it has completed a step with the group), and
    the members agree on the epoch. A site that has held for ``hold_s`` offers the step two
    ahead of its own as the last one (the store keeps the first offer) and every site stops
    there: the sites are at most one step apart, since each step's all-reduce needs them all.
    """

    KEY = "diloco/held_until"

    def __init__(self, group: Any, store: Any, spec: dict[str, Any]) -> None:
        self.group, self.store = group, store
        self.awaited = {spec["names"].index(name) for name in spec.get("awaited", [])}
        self.hold_s = float(spec.get("hold_s", 0.0))
        self.since: float | None = None

    def holding(self, step: int) -> bool:
        """At the boundary of ``step``, past the last outer step: whether to train on."""
        epoch = self.group.epoch
        if self.awaited <= set(epoch.members) and epoch.start < step:
            return False
        if self.store.check([self.KEY]):
            return step < int(self.store.get(self.KEY))
        if self.since is None:
            self.since = time.monotonic()
            emit({"event": "hold", "t": self.since, "step": step})
        if time.monotonic() - self.since < self.hold_s:
            return True
        return step < int(self.store.compare_set(self.KEY, "", str(step + 2)))


def run_site(spec: dict[str, Any]) -> dict[str, Any]:
    """One site's whole run; emits ``ready``, one ``outer`` per step and returns ``done``."""
    torch.set_num_threads(1)
    site, seed = spec["site"], spec["seed"]
    noise = spec.get("noise", DEFAULT_NOISE)
    trainer = Trainer(spec["hidden"], seed, noise)
    store = connect_store(spec)
    group = join_group(spec, store)
    elastic = hasattr(group, "boundary")
    emit({"event": "ready", "t": time.monotonic(), "params": trainer.n_params,
          "state_bytes": trainer.state_bytes(), "elastic": elastic,
          "initial_loss": eval_losses(trainer.model, noise)[0], "noise": noise})
    if not spec.get("no_go"):
        sys.stdin.readline()
    membership = MembershipLog(group, spec["names"])
    hold = RejoinHold(group, store, spec) if elastic else None
    error = None
    try:
        while True:
            if elastic:
                trainer.step = group.boundary(trainer.step, trainer)
                membership.check()
            if trainer.step >= spec["outer_steps"] and not (hold and hold.holding(trainer.step)):
                break
            t0 = time.monotonic()
            loss = trainer.inner_steps(seed, site, spec["inner_steps"])
            t_sync = time.monotonic()
            try:
                group.all_reduce(trainer.pseudo_gradient(), op="mean", compress=spec.get("compress"),
                                 name="pseudo")
            except MembershipChanged:
                membership.check()
                trainer.roll_back()  # the next boundary makes the state equal again
                continue
            trainer.outer_step()
            membership.check()
            emit({"event": "outer", "step": trainer.step, "t0": t0, "t_sync": t_sync,
                  "t1": time.monotonic(), "train_loss": loss, "members": membership.members()})
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which names the site
        error = f"{type(exc).__name__}: {exc}"
    if error is None:
        finish_together(store, membership, spec)
    group.close()
    final_loss, excess = eval_losses(trainer.model, noise)
    return {"event": "done", "t": time.monotonic(), "steps": trainer.step,
            "final_loss": final_loss, "final_excess_loss": excess, "noise": noise,
            "digest": trainer.digest(), "params": trainer.n_params, "state_bytes": trainer.state_bytes(),
            "cpu_s": cpu_s(), "error": error}


def serve_store(port: int) -> None:
    """The job's c10d store: a TCPStore server until stdin closes or a signal ends it."""
    import torch.distributed as dist

    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))
    emit({"event": "ready", "t": time.monotonic()})
    sys.stdin.read()
    del store


def _local_site(spec: dict[str, Any], out: str) -> None:
    Path(out).write_text(json.dumps(run_site(spec)))


def run_local(n_sites: int, outer_steps: int, inner_steps: int, hidden: int, compress: str | None,
              seed: int, timeout: float, noise: float = DEFAULT_NOISE) -> dict[str, Any]:
    """Every site a process on this machine, paths on loopback, the store in this process."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _loopback import PATHS_PER_PAIR, free_ports, make_pki, site_name

    names = [site_name(s) for s in range(n_sites)]
    pairs = [(i, j) for i in range(n_sites) for j in range(i + 1, n_sites)]
    ports = free_ports(len(pairs) * PATHS_PER_PAIR)
    pair_paths = {pair: [f"127.0.0.1:{ports[k * PATHS_PER_PAIR + p]}" for p in range(PATHS_PER_PAIR)]
                  for k, pair in enumerate(pairs)}
    store_port = free_ports(1)[0]
    store = dist.TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="wanxport-diloco-elastic-") as tmp:
        make_pki(Path(tmp) / "pki", n_sites)
        ctx = mp.get_context("spawn")
        procs = []
        for site in range(n_sites):
            spec = {"site": site, "names": names, "pki": f"{tmp}/pki", "store": f"127.0.0.1:{store_port}",
                    "paths": {str(peer): pair_paths[(min(site, peer), max(site, peer))]
                              for peer in range(n_sites) if peer != site},
                    "outer_steps": outer_steps, "inner_steps": inner_steps, "hidden": hidden,
                    "compress": compress, "seed": seed, "noise": noise, "timeout": timeout, "no_go": True}
            procs.append(ctx.Process(target=_local_site, args=(spec, f"{tmp}/site-{site}.json")))
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        done = [json.loads(Path(f"{tmp}/site-{s}.json").read_text()) for s in range(n_sites)]
    del store
    return {"sites": n_sites, "outer_steps": outer_steps, "inner_steps": inner_steps, "hidden": hidden,
            "params": done[0]["params"], "state_bytes": done[0]["state_bytes"], "compress": compress,
            "noise": noise, "initial_loss": eval_losses(make_model(hidden, seed), noise)[0],
            "final_loss": done[0]["final_loss"], "final_excess_loss": done[0]["final_excess_loss"],
            "identical": len({d["digest"] for d in done}) == 1,
            "errors": [d["error"] for d in done if d["error"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    local = sub.add_parser("local", help="every site a process on this machine (loopback paths)")
    local.add_argument("--sites", type=int, default=3)
    local.add_argument("--outer-steps", type=int, default=10)
    local.add_argument("--inner-steps", type=int, default=20, help="H: inner steps per outer step")
    local.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN,
                       help="width (2048: about 5 M parameters)")
    local.add_argument("--compress", choices=("int8", "bf16"), help="pseudo-gradient codec (default none)")
    local.add_argument("--seed", type=int, default=0)
    local.add_argument("--noise", type=float, default=DEFAULT_NOISE,
                       help=f"the targets' noise, the loss's floor its square (default {DEFAULT_NOISE})")
    local.add_argument("--timeout", type=float, default=120.0, help="seconds per collective")
    local.add_argument("--json", type=Path, help="also write the result here")
    store = sub.add_parser("store", help="serve the job's TCPStore on PORT until stdin closes")
    store.add_argument("port", type=int)
    site = sub.add_parser("site", help="one site, from a JSON spec (what the emulation starts)")
    site.add_argument("spec")
    args = parser.parse_args(argv)
    if args.role == "store":
        serve_store(args.port)
        return 0
    if args.role == "site":
        # The group's membership changes and waits are logged (INFO) with a monotonic clock:
        # the emulation keeps them beside the run's own timeline (``--logs``).
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(relativeCreated)9.0f ms %(name)s %(levelname)s %(message)s")
        done = run_site(json.loads(args.spec))
        emit(done)
        return 0 if done["error"] is None else 1
    if args.sites < 2 or args.outer_steps < 1 or args.inner_steps < 1 or args.hidden < 1 or args.noise < 0:
        parser.error("--sites needs at least 2; --outer-steps, --inner-steps and --hidden at least 1; "
                     "--noise at least 0")
    result = run_local(args.sites, args.outer_steps, args.inner_steps, args.hidden, args.compress,
                       args.seed, args.timeout, args.noise)
    print(f"{result['sites']} sites, {result['params']:,} parameters, state {result['state_bytes']:,} B: "
          f"held-out loss {result['initial_loss']:.5f} -> {result['final_loss']:.5f} "
          f"({result['final_excess_loss']:.5f} over the noise's floor), "
          f"replicas identical: {result['identical']}"
          + "".join(f"\n  error: {e}" for e in result["errors"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["identical"] and not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
