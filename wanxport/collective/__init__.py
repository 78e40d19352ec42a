"""Collectives between sites over persistent wanxport sessions (docs/design.md section 8).

::

    from wanxport.collective import join
    group = await join(0, ["gw-a", "gw-b"], identity="pki/gw-a", ca="pki/ca.pem",
                       paths=["10.0.0.2:7500", "10.0.1.2:7500"])
    await group.all_reduce(grads, op="mean", compress="int8", name="bucket0")
    handle = group.all_reduce_async(bucket1)     # overlaps with what follows
    await handle
    await group.send(activations, dst=1, tag=7)     # point-to-point (``recv`` at site 1)
    pair = group.new_group([0, 1])                  # a subgroup on the same sessions
    await group.close()

``join_sync`` gives the same group to non-async code. See docs/notes/collective.md.
"""

from .codec import CODECS, INT8_BLOCK, error_bound
from .elastic import ElasticGroup
from .elastic_join import elastic_join
from .elastic_state import ArrayState, StateHolder
from .elastic_sync import ElasticSyncGroup, elastic_join_sync
from .errors import CollectiveError, GroupEnded, MembershipChanged
from .group import DEFAULT_TIMEOUT_S, CallStats, Group, Handle, part_bounds
from .link import LIVENESS_MIN_S
from .mesh import JOIN_TIMEOUT_S, join
from .state import ElasticState, GroupEvent, GroupState
from .sync import SyncGroup, SyncHandle, join_sync
from .world import World

__all__ = ["CODECS", "DEFAULT_TIMEOUT_S", "INT8_BLOCK", "JOIN_TIMEOUT_S", "LIVENESS_MIN_S", "ArrayState",
           "CallStats", "CollectiveError", "ElasticGroup", "ElasticState", "ElasticSyncGroup", "Group",
           "GroupEnded", "GroupEvent", "GroupState", "Handle", "MembershipChanged", "StateHolder",
           "SyncGroup", "SyncHandle", "World", "elastic_join", "elastic_join_sync", "error_bound", "join",
           "join_sync", "part_bounds"]
