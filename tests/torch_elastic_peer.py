"""One site of a DiLoCo-shaped run on ``wanxport.torch.elastic_group``, in its own process:
H local AdamW steps, then the outer step (the mean of the pseudo-gradients over the live
sites, Nesterov momentum), with ``boundary`` once per outer step and
``TrainingState(model, optimizer, extra)`` as what a restarted site receives. Prints one
JSON line per outer step; with ``"stall_at": k`` it stops before outer step k's all-reduce
(for the test to kill it). Digests: of the whole state after each ``boundary``, and at
the end of the model and outer state."""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn
from torch.distributed import TCPStore

import wanxport.torch as wt

H, OUTER_LR, MOMENTUM = 3, 0.7, 0.9


def digest(state: wt.TrainingState, shared_only: bool = False) -> str:
    """Of everything a joiner receives, or (``shared_only``) of what DiLoCo keeps equal at
    every site after an outer step: the model and the outer state, not AdamW's moments."""
    packed = state.pack()
    names = [k for k in sorted(packed) if not shared_only or k.startswith(("model/", "extra/"))]
    return hashlib.sha256(b"".join(packed[k].tobytes() for k in names)).hexdigest()


def main(spec: dict) -> None:
    site, pki = spec["site"], Path(spec["pki"])
    store = TCPStore("127.0.0.1", spec["store_port"], is_master=False, timeout=timedelta(seconds=30))
    config = wt.SiteConfig.make(pki / f"site-{site}", pki / "ca.pem", spec["paths"])
    group = wt.elastic_group(store, site, 3, config=config, timeout=60.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach()
    outer = {"global": flat.clone(), "momentum": torch.zeros_like(flat)}
    state = wt.TrainingState(model, inner, extra=outer)
    step = 0
    while step < spec["until"] or group.size < 3 or step < group.epoch.start + 2:
        step = group.boundary(step, state)
        print(json.dumps({"boundary": step, "state": digest(state)}), flush=True)
        gen = torch.Generator().manual_seed(1000 * site + step)
        for _ in range(H):
            x = torch.randn(16, 8, generator=gen)
            inner.zero_grad()
            nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin()).backward()
            inner.step()
        pseudo = outer["global"] - nn.utils.parameters_to_vector(model.parameters()).detach()
        if step == spec.get("stall_at"):
            print(json.dumps({"stalled": step}), flush=True)
            sys.stdin.read()  # the test kills this process here
        try:
            group.all_reduce(pseudo, op="mean")
        except wt.MembershipChanged:
            continue
        with torch.no_grad():
            outer["momentum"].mul_(MOMENTUM).add_(pseudo)
            outer["global"].sub_(OUTER_LR * (pseudo + MOMENTUM * outer["momentum"]))
            nn.utils.vector_to_parameters(outer["global"].clone(), model.parameters())
        shared = digest(state, shared_only=True)
        print(json.dumps({"step": step, "live": list(group.members), "shared": shared}), flush=True)
        step += 1
    shared = digest(state, shared_only=True)
    print(json.dumps({"final": step, "shared": shared, "admitted_at": group.epoch.start}), flush=True)
    group.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
