"""Elastic training across sites from torch: the group, and the state a returning site receives.

``elastic_group(store, site, n_sites)`` meets the other sites through the job's
c10d store (as ``cross_site_group``) and joins an elastic group
(``wanxport.collective.elastic``): when a site dies or is cut off the others go on,
and a site that restarts calls the same function and is admitted at a step
boundary. ``TrainingState(model, optimizer, extra)`` is what it then receives:
the model's and optimizer's state dicts and any further tensors (DiLoCo's global
parameters and outer momentum), bit for bit. The step loop::

    group = wt.elastic_group(store, site, n_sites)
    state = wt.TrainingState(model, optimizer)
    step = 0
    while step < total:
        step = group.boundary(step, state)     # admits joiners; a joiner gets the state and step
        try:
            ...; group.all_reduce(tensor, op="mean")   # the mean over the live sites
        except wt.MembershipChanged:
            continue                           # redo the step: the next boundary equalises the state
        step += 1
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from wanxport.collective import JOIN_TIMEOUT_S, ElasticSyncGroup, elastic_join_sync
from wanxport.torch.config import SiteConfig
from wanxport.torch.rendezvous import PORTS, PORTS_PER_RANK, local_rank, meet_through_store

__all__ = ["TrainingState", "elastic_group"]

_META = "meta"  # the array holding the JSON skeleton of the optimizer's state dict


def elastic_group(store: Any, site: int, n_sites: int, *, config: SiteConfig | None = None,
                  rank_in_site: int | None = None, ports_per_rank: int = PORTS_PER_RANK,
                  timeout: float = 60.0, join_timeout: float = JOIN_TIMEOUT_S,
                  liveness_min_s: float | None = None) -> ElasticSyncGroup:
    """This rank's elastic group with the same-index rank of every other site (``n_sites`` >= 3).

    ``store``: a c10d store every site reaches (a ``TCPStore`` on the control network,
    hosted outside the sites' training processes). Each rank meets its peers under
    ``wanxport/elastic/<rank in site>/`` and has sessions of its own, but the ranks of a
    site share one membership record (``wanxport/elastic/group/``): every rank's group
    enters the same epochs at the same steps, so a site's ranks lose a site together and
    admit a restarted one at the same step (its ranks all take part from there, as DDP
    inside the site needs). ``config``, ``rank_in_site``, ``ports_per_rank``
    as ``cross_site_group``. ``timeout``: each call's; ``join_timeout``: setting up (a
    restarted site waits this long for the members' next step boundary);
    ``liveness_min_s``: the least silence that counts a site as gone."""
    from torch.distributed import PrefixStore

    config = config or SiteConfig.from_env()
    here = local_rank() if rank_in_site is None else rank_in_site
    paths, release = PORTS.take(config, here, ports_per_rank, n_sites - 1)
    try:
        names, pairs = meet_through_store(PrefixStore(f"wanxport/elastic/{here}/", store), site, n_sites,
                                          config, join_timeout, paths)
        extra = {} if liveness_min_s is None else {"liveness_min_s": liveness_min_s}
        shared = PrefixStore("wanxport/elastic/", store)
        return elastic_join_sync(shared, site, names, identity=config.identity, ca=config.ca, paths=pairs,
                                 timeout=timeout, join_timeout=join_timeout, prefix=f"{here}/group/",
                                 membership_prefix="group/", **extra)
    except BaseException:
        release()
        raise


def _array(tensor: torch.Tensor) -> npt.NDArray[Any]:
    """A numpy view of a CPU tensor (bfloat16, which numpy lacks, as its int16 bits)."""
    plain = tensor.detach().cpu()
    if plain.dtype == torch.bfloat16:
        plain = plain.view(torch.int16)
    return plain.numpy()


def _tensor(array: npt.NDArray[Any], like: str) -> torch.Tensor:
    tensor = torch.from_numpy(np.array(array))
    return tensor.view(torch.bfloat16) if like == str(torch.bfloat16) else tensor


class TrainingState:
    """A site's training state for ``boundary``: ``model.state_dict()``, the optimizer's state
    dict (tensors as arrays, the rest as JSON) and ``extra`` tensors, loaded back in place."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 extra: Mapping[str, torch.Tensor] | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.extra = dict(extra or {})

    def pack(self) -> dict[str, npt.NDArray[Any]]:
        arrays: dict[str, npt.NDArray[Any]] = {}
        dtypes: dict[str, str] = {}

        def put(name: str, tensor: torch.Tensor) -> None:
            arrays[name] = _array(tensor)
            dtypes[name] = str(tensor.dtype)

        for key, tensor in self.model.state_dict().items():
            put(f"model/{key}", tensor)
        for key, tensor in self.extra.items():
            put(f"extra/{key}", tensor)
        skeleton: dict[str, Any] = {"dtypes": dtypes}
        if self.optimizer is not None:
            optim = self.optimizer.state_dict()
            plain: dict[str, dict[str, Any]] = {}
            for index, entry in optim["state"].items():
                plain[str(index)] = {}
                for key, value in entry.items():
                    if isinstance(value, torch.Tensor):
                        put(f"optim/{index}/{key}", value)
                    else:
                        plain[str(index)][key] = value
            skeleton["optim"] = {"state": plain, "param_groups": optim["param_groups"]}
        arrays[_META] = np.frombuffer(json.dumps(skeleton).encode(), dtype=np.uint8)
        return arrays

    def unpack(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        skeleton = json.loads(arrays.pop(_META).tobytes())
        dtypes = skeleton["dtypes"]
        model = {name[len("model/"):]: _tensor(a, dtypes[name]) for name, a in arrays.items()
                 if name.startswith("model/")}
        self.model.load_state_dict(model)
        with torch.no_grad():
            for key, tensor in self.extra.items():
                tensor.copy_(_tensor(arrays[f"extra/{key}"], dtypes[f"extra/{key}"]))
        if self.optimizer is not None and "optim" in skeleton:
            optim = skeleton["optim"]
            state: dict[int, dict[str, Any]] = {int(i): dict(entry) for i, entry in optim["state"].items()}
            for name, array in arrays.items():
                if name.startswith("optim/"):
                    _, index, key = name.split("/", 2)
                    state.setdefault(int(index), {})[key] = _tensor(array, dtypes[name])
            self.optimizer.load_state_dict({"state": state, "param_groups": optim["param_groups"]})
