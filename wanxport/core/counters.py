"""The session's counters, grouped and typed, each kept in place where its events happen.

In the manner of quinn-proto's ``ConnectionStats`` (``PathStats``, ``UdpStats``,
``FrameStats``): the part that sees an event bumps a field of its group (the loss
detector counts packets, the transmitter payload, the health machine failures), and
``Session.stats()`` copies each group's fields (``core.stats``) instead of asking
some ten objects for their figures.
"""

from __future__ import annotations

__all__ = ["PATH_FIELDS", "REPAIR_RECEIVE_FIELDS", "SHARD_FIELDS", "PathCounters", "RepairReceiveCounters",
           "ShardCounters"]

#: Each group's fields in declaration order (its ``__slots__``; the snapshots' order too).
PATH_FIELDS = (
    "payload_bytes", "retransmitted_bytes", "hedged_bytes", "repair_bytes",
    "packets_sent", "bytes_sent", "packets_lost", "spurious_losses",
    "failures", "resumes", "resumes_dropped", "late_wakes", "rtt_probes", "reroutes",
)
SHARD_FIELDS = ("shards_submitted", "shards_acknowledged", "shards_received", "bytes_submitted",
                "bytes_received", "data_dropped")
REPAIR_RECEIVE_FIELDS = ("repaired_bytes", "retransmitted_after_repair_bytes", "blocks_rebuilt",
                         "blocks_short")


class PathCounters:
    """One path's counters (quinn-proto's ``PathStats``), each bumped by the part that sees it.

    Payload, by the transmitter; core packets, by the loss detector (``core.recovery``);
    failures, by the health machine (``core.health``); careful resumes, by the path;
    late pacing wake-ups, by the transmitter; RTT freshness probes, by the freshness clock
    (``core.freshness``); reroutes, by the idle guard (``core.warm``).
    """

    __slots__ = PATH_FIELDS

    def __init__(self) -> None:
        # Payload
        self.payload_bytes = 0  # payload sent, retransmissions and hedges included
        self.retransmitted_bytes = 0
        self.hedged_bytes = 0
        self.repair_bytes = 0  # erasure-code repair symbols sent (core.fec)
        # Core packets
        self.packets_sent = 0
        self.bytes_sent = 0  # datagram bytes (headers and tags included) of every packet sent
        self.packets_lost = 0
        self.spurious_losses = 0  # declared lost, acknowledged later
        # Events
        self.failures = 0  # times the path entered the failed state
        self.resumes = 0  # careful resumes from a previous session's saved state ...
        self.resumes_dropped = 0  # ... and saved states dropped because the route's RTT had moved
        self.late_wakes = 0  # pacing wake-ups served more than 2 ms late
        self.rtt_probes = 0  # probes sent because the RTT estimate had gone unsampled (core.freshness)
        self.reroutes = 0  # idle restarts whose first round trip showed another route


class ShardCounters:
    """A session's shards both ways, and the DATA it could not accept."""

    __slots__ = SHARD_FIELDS

    def __init__(self) -> None:
        self.shards_submitted = 0
        self.shards_acknowledged = 0  # shards the peer reported done (verified or not)
        self.shards_received = 0  # incoming shards checked and handed to the application
        self.bytes_submitted = 0
        self.bytes_received = 0  # payload bytes of the shards handed to the application
        self.data_dropped = 0  # DATA the session could not accept (unknown shard, out of bounds)


class RepairReceiveCounters:
    """What the erasure code did for incoming shards (``core.fec_receive``)."""

    __slots__ = REPAIR_RECEIVE_FIELDS

    def __init__(self) -> None:
        self.repaired_bytes = 0  # incoming bytes rebuilt from repair instead of received
        self.retransmitted_after_repair_bytes = 0  # DATA for bytes already rebuilt: waste
        self.blocks_rebuilt = 0  # blocks whose lost data repair rebuilt
        self.blocks_short = 0  # blocks completed by retransmission: repair was not enough
