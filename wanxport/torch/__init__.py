"""PyTorch over wanxport: a hierarchical DDP comm hook and the ``"wanxport"`` process group.

Needs the ``torch`` extra (``pip install 'wanxport[torch]'``, torch >= 2.3; tested with
2.13.0). Importing this package registers the ``"wanxport"`` torch.distributed backend.

- ``allreduce_hook`` + ``HookState``: DDP inside each site over the site's own world,
  wanxport between sites (``ddp.register_comm_hook(HookState(group), allreduce_hook)``,
  ``group = cross_site_group(store, site, n_sites)`` with ports from ``LOCAL_RANK``);
  ``allreduce_tensor`` is the same path for any 1-D CPU tensor, outside DDP.
- ``init_process_group("wanxport", store=..., rank=site, world_size=n_sites,
  pg_options=SiteConfig.load(FILE))``: one rank per site (DiLoCo's outer group).
- one global world (gloo/NCCL): ``new_group(ranks, backend="wanxport")`` or
  ``init_device_mesh(..., backend_override={"replicate": "wanxport"})`` (FSDP2 HSDP),
  ``WanxportOptions`` for the site config and ports.
- ``compression(codec)``: cross-site all-reduces in the block travel as bf16/int8.
- ``cross_site_bytes(pg)``: payload bytes this site's wanxport group moved (both ways).
- ``serve_metrics(base_port)``: this rank's Prometheus endpoint on ``base_port + LOCAL_RANK``.
- ``elastic_group(store, site, n_sites)`` + ``TrainingState(model, optimizer)``: training
  that goes on among the live sites when one dies, and takes a restarted site back at a
  step boundary with the state copied to it (``MembershipChanged``: redo the step).
"""

from wanxport.collective import CollectiveError, MembershipChanged
from wanxport.torch.backend import BACKEND, WanxportOptions, WanxportProcessGroup, compression
from wanxport.torch.config import CONFIG_ENV, ConfigError, SiteConfig
from wanxport.torch.elastic import TrainingState, elastic_group
from wanxport.torch.hook import HookState, allreduce_hook, allreduce_tensor
from wanxport.torch.metrics import serve_metrics
from wanxport.torch.registry import cross_site_bytes, register
from wanxport.torch.rendezvous import cross_site_group

__all__ = ["BACKEND", "CONFIG_ENV", "CollectiveError", "ConfigError", "HookState", "MembershipChanged",
           "SiteConfig", "TrainingState", "WanxportOptions", "WanxportProcessGroup", "allreduce_hook",
           "allreduce_tensor", "compression", "cross_site_bytes", "cross_site_group", "elastic_group",
           "register", "serve_metrics"]

register()
