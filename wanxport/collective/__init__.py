"""Collectives between sites over persistent wanxport sessions (DESIGN.md section 8).

::

    from wanxport.collective import join
    group = await join(0, ["gw-a", "gw-b"], identity="pki/gw-a", ca="pki/ca.pem",
                       paths=["10.0.0.2:7500", "10.0.1.2:7500"])
    await group.all_reduce(grads, op="mean", compress="int8", name="bucket0")
    handle = group.all_reduce_async(bucket1)     # overlaps with what follows
    await handle
    await group.close()

``join_sync`` gives the same group to non-async code. See docs/notes/collective.md.
"""

from .codec import CODECS, INT8_BLOCK, error_bound
from .errors import CollectiveError
from .group import DEFAULT_TIMEOUT_S, CallStats, Group, Handle, part_bounds
from .mesh import join
from .sync import SyncGroup, SyncHandle, join_sync

__all__ = ["CODECS", "DEFAULT_TIMEOUT_S", "INT8_BLOCK", "CallStats", "CollectiveError", "Group", "Handle",
           "SyncGroup", "SyncHandle", "error_bound", "join", "join_sync", "part_bounds"]
