"""The session's counters, grouped and typed, each kept in place where its events happen.

In the manner of quinn-proto's ``UdpStats``/``FrameStats``/``PathStats``: the part
that sees an event bumps a field of its group (the loss detector counts
datagrams, the transmitter payload, the health machine failures), and
``Session.stats()`` copies each group with one C-level ``attrgetter`` call
(``core.stats``) instead of asking some ten objects for their figures.
"""

from __future__ import annotations

from operator import attrgetter

__all__ = ["DatagramCounters", "PathEventCounters", "PayloadCounters", "RepairReceiveCounters",
           "ShardCounters"]


class PayloadCounters:
    """The data a path carried: every payload byte, and which were re-sends, hedges or repair."""

    __slots__ = FIELDS = ("payload_bytes", "retransmitted_bytes", "hedged_bytes", "repair_bytes")

    def __init__(self) -> None:
        self.payload_bytes = 0  # payload sent, retransmissions and hedges included
        self.retransmitted_bytes = 0
        self.hedged_bytes = 0
        self.repair_bytes = 0  # erasure-code repair symbols sent (core.fec)


class DatagramCounters:
    """A path's core packets as the loss detector saw them (``core.recovery``)."""

    __slots__ = FIELDS = ("packets_sent", "bytes_sent", "packets_lost", "spurious_losses")

    def __init__(self) -> None:
        self.packets_sent = 0
        self.bytes_sent = 0  # datagram bytes (headers and tags included) of every packet sent
        self.packets_lost = 0
        self.spurious_losses = 0  # declared lost, acknowledged later


class PathEventCounters:
    """What happened to a path: failures, careful resumes, late pacing wake-ups, route changes."""

    __slots__ = FIELDS = ("failures", "resumes", "resumes_dropped", "late_wakes", "reroutes")

    def __init__(self) -> None:
        self.failures = 0  # times the path entered the failed state (core.health)
        self.resumes = 0  # careful resumes from a previous session's saved state ...
        self.resumes_dropped = 0  # ... and saved states dropped because the route's RTT had moved
        self.late_wakes = 0  # pacing wake-ups served more than 2 ms late (core.transmitter)
        self.reroutes = 0  # idle restarts whose first round trip showed another route (core.warm)


class ShardCounters:
    """A session's shards both ways, and the DATA it could not accept."""

    __slots__ = FIELDS = ("shards_submitted", "shards_acknowledged", "shards_received", "bytes_submitted",
                          "bytes_received", "data_dropped")

    def __init__(self) -> None:
        self.shards_submitted = 0
        self.shards_acknowledged = 0  # shards the peer reported done (verified or not)
        self.shards_received = 0  # incoming shards checked and handed to the application
        self.bytes_submitted = 0
        self.bytes_received = 0  # payload bytes of the shards handed to the application
        self.data_dropped = 0  # DATA the session could not accept (unknown shard, out of bounds)


class RepairReceiveCounters:
    """What the erasure code did for incoming shards (``core.fec_receive``)."""

    __slots__ = FIELDS = ("repaired_bytes", "retransmitted_after_repair_bytes", "blocks_rebuilt",
                          "blocks_short")

    def __init__(self) -> None:
        self.repaired_bytes = 0  # incoming bytes rebuilt from repair instead of received
        self.retransmitted_after_repair_bytes = 0  # DATA for bytes already rebuilt: waste
        self.blocks_rebuilt = 0  # blocks whose lost data repair rebuilt
        self.blocks_short = 0  # blocks completed by retransmission: repair was not enough


#: Each group's fields in declaration order, as one tuple (one C call per group to copy).
copy_payload = attrgetter(*PayloadCounters.FIELDS)
copy_datagrams = attrgetter(*DatagramCounters.FIELDS)
copy_path_events = attrgetter(*PathEventCounters.FIELDS)
copy_shards = attrgetter(*ShardCounters.FIELDS)
copy_repair_receive = attrgetter(*RepairReceiveCounters.FIELDS)
