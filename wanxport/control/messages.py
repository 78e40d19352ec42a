"""Control-protocol messages and their strict JSON encoding.

The control channel carries few, small messages, so JSON is chosen for being
readable in logs and trivially versionable. Decoding is strict because the
peer, although authenticated, may run another version: every field is checked
for presence and type, unknown fields and types are refused, and byte fields
(keys, IVs) travel as lowercase hex with an exact length. A failure is a
``ControlProtocolError`` naming the message type and field, never a crash.

A message is encoded as a JSON object ``{"type": <name>, <fields>...}``.
Framing (length prefix, sequence numbers) is the job of ``framing``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

# 2: Hello and Welcome carry the process's instance id (one session per pair).
# 3: shard and piece digests are BLAKE3 (``core.digest``), fields ``digest``, no longer ``sha256``.
# 4: a file's mode, mtime and symlink entries (ShardAnnounce of a zero-size entry, and the
#    piece meta of a data shard); ShardComplete.reason says why a shard was not verified.
# 5: a shard may travel on the data plane alone: its announcement rides in its data-plane
#    meta and the receiver's verification is its data-plane acknowledgement, with no
#    ShardAnnounce or ShardComplete (``gateway.session``, ``DATA_PLANE_ONLY``); and a shard's
#    first datagrams may leave before it is hashed, its digest following on the data plane
#    (SHARD_OPEN_UNHASHED, SHARD_DIGEST: ``core.late_digest``).
# Two gateways agree on the lower of their versions, down to MIN_PROTOCOL_VERSION: fields
# newer than the agreed version are never sent (``for_version``), since a gateway refuses
# fields it does not know.
PROTOCOL_VERSION = 5
MIN_PROTOCOL_VERSION = 3
CIPHERS = ("aes-256-gcm", "chacha20-poly1305")
ROLES = ("initiator", "responder")
DIRECTIONS = ("initiator->responder", "responder->initiator")
SHARD_STATUSES = ("verified", "integrity-failure", "aborted", "exists")  # exists: overwrite refused
MAX_U32 = 2**32 - 1
MAX_U62 = 2**62 - 1
RESUME_BATCH = 512  # pieces per ResumeQuery: 512 digests fit the 64 KiB control frame
MAX_LINK_TARGET = 4095  # PATH_MAX less its NUL
MAX_REASON = 2000
# Fields added after protocol 3, by message type: left out for a peer of an older version.
SINCE_VERSION_4 = {"shard_announce": ("mode", "mtime_ns", "symlink"), "shard_complete": ("reason",)}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_INSTANCE = re.compile(r"[0-9a-f]{16}")
_ENDPOINT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):([0-9]{1,5})$")


class ControlProtocolError(Exception):
    """The peer sent something this side cannot accept; the message says what."""


def _check_endpoint(what: str, value: str) -> None:
    match = _ENDPOINT.match(value)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ControlProtocolError(
            f"{what}: {value!r} is not a valid endpoint; use host:port or [v6addr]:port"
        )


def _check_range(what: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ControlProtocolError(f"{what}: {value} is out of range [{low}, {high}]")


def _check_instance(what: str, value: str | None) -> None:
    """A process's instance id: 16 lowercase hex digits (64 random bits). A gateway daemon
    tells a peer's restart (a new id: its old sessions are gone) from a second session of
    the same process (a simultaneous dial) by it."""
    if value is not None and _INSTANCE.fullmatch(value) is None:
        raise ControlProtocolError(f"{what}: {value!r} is not valid; use 16 lowercase hex digits")


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ControlProtocolError(f"{what}: {value!r} is not valid; use one of {choices}")


@dataclass(frozen=True)
class Message:
    """Base of all control messages; subclasses set ``TYPE`` and validate."""

    TYPE: ClassVar[str] = ""

    def validate(self) -> None:
        """Check value constraints beyond types; raise ControlProtocolError."""


@dataclass(frozen=True)
class Hello(Message):
    """First message of the initiator: who it is and what it can do.

    ``endpoints`` are the sender's data-plane UDP endpoints in path order;
    ``conn_id`` is the id the sender wants on datagrams addressed to it.
    """

    TYPE: ClassVar[str] = "hello"
    version: int
    role: str
    gateway: str
    endpoints: list[str]
    ciphers: list[str]
    conn_id: int
    mtu: int | None = None  # data-plane MTU of every path (the session config both derive)
    segments: int | None = None  # datagrams per core packet
    instance: str | None = None  # the dialling process's random id (a restart changes it)

    def validate(self) -> None:
        _check_range("hello.version", self.version, 1, 255)
        _check_instance("hello.instance", self.instance)
        if self.mtu is not None:
            _check_range("hello.mtu", self.mtu, 576, 65535)
        if self.segments is not None:
            _check_range("hello.segments", self.segments, 1, 4096)
        _check_choice("hello.role", self.role, ROLES)
        if not self.gateway:
            raise ControlProtocolError("hello.gateway: must be a non-empty name")
        if not 1 <= len(self.endpoints) <= 256:
            raise ControlProtocolError("hello.endpoints: give 1..256 endpoints (one per path)")
        for i, endpoint in enumerate(self.endpoints):
            _check_endpoint(f"hello.endpoints[{i}]", endpoint)
        if not self.ciphers:
            raise ControlProtocolError(f"hello.ciphers: must list at least one of {CIPHERS}")
        _check_range("hello.conn_id", self.conn_id, 0, MAX_U32)


@dataclass(frozen=True)
class Welcome(Message):
    """The responder's answer: chosen cipher, agreed paths and both conn ids.

    ``paths[i] = [initiator endpoint, responder endpoint]`` is path ``i``.
    """

    TYPE: ClassVar[str] = "welcome"
    version: int
    gateway: str
    cipher: str
    paths: list[list[str]]
    conn_id: int
    peer_conn_id: int
    credit_bytes: int | None = None  # the responder's receive budget (its peer's credit)
    instance: str | None = None  # the answering process's random id (a restart changes it)

    def validate(self) -> None:
        _check_range("welcome.version", self.version, 1, 255)
        _check_instance("welcome.instance", self.instance)
        if self.credit_bytes is not None:
            _check_range("welcome.credit_bytes", self.credit_bytes, 1, MAX_U62)
        _check_choice("welcome.cipher", self.cipher, CIPHERS)
        if not 1 <= len(self.paths) <= 256:
            raise ControlProtocolError("welcome.paths: give 1..256 path pairs")
        for i, pair in enumerate(self.paths):
            if len(pair) != 2:
                raise ControlProtocolError(
                    f"welcome.paths[{i}]: must be [initiator endpoint, responder endpoint]"
                )
            for j, endpoint in enumerate(pair):
                _check_endpoint(f"welcome.paths[{i}][{j}]", endpoint)
        _check_range("welcome.conn_id", self.conn_id, 0, MAX_U32)
        _check_range("welcome.peer_conn_id", self.peer_conn_id, 0, MAX_U32)


@dataclass(frozen=True)
class Keys(Message):
    """Key material for the datagrams the *sender* of this message will seal.

    Each side draws its own sending keys, so neither side's randomness can
    weaken the other direction. ``repr`` hides the secrets so keys never end
    up in logs.
    """

    TYPE: ClassVar[str] = "keys"
    direction: str
    key_phase: int
    cipher: str
    key: bytes = field(repr=False)
    iv: bytes = field(repr=False)

    def validate(self) -> None:
        _check_choice("keys.direction", self.direction, DIRECTIONS)
        _check_range("keys.key_phase", self.key_phase, 0, MAX_U62)
        _check_choice("keys.cipher", self.cipher, CIPHERS)
        if len(self.key) != 32:
            raise ControlProtocolError(f"keys.key: must be 32 bytes, got {len(self.key)}")
        if len(self.iv) != 12:
            raise ControlProtocolError(f"keys.iv: must be 12 bytes, got {len(self.iv)}")


@dataclass(frozen=True)
class KeyUpdate(Message):
    """The receiver of ``Keys(key_phase)`` confirms it installed them.

    Only after this confirmation does the sender seal with the new phase, so
    no datagram is ever sealed with a key the receiver does not hold yet.
    """

    TYPE: ClassVar[str] = "key_update"
    direction: str
    key_phase: int

    def validate(self) -> None:
        _check_choice("key_update.direction", self.direction, DIRECTIONS)
        _check_range("key_update.key_phase", self.key_phase, 0, MAX_U62)


@dataclass(frozen=True)
class ShardAnnounce(Message):
    """A shard is coming: its size, identity and integrity digest."""

    TYPE: ClassVar[str] = "shard_announce"
    shard_id: int
    size_bytes: int
    digest: str  # BLAKE3 of the shard, hex (core.digest)
    step: int
    name: str | None = None
    dtype: str | None = None
    shape: list[int] | None = None
    # Protocol 4, on a zero-size file entry only (a data shard's piece meta carries them):
    mode: int | None = None  # st_mode & 0o7777 of the source
    mtime_ns: int | None = None
    symlink: str | None = None  # the entry is a symlink to this (relative) target

    def validate(self) -> None:
        _check_range("shard_announce.shard_id", self.shard_id, 0, MAX_U32)
        _check_range("shard_announce.size_bytes", self.size_bytes, 0, MAX_U62)
        _check_range("shard_announce.step", self.step, 0, MAX_U62)
        if self.mode is not None:
            _check_range("shard_announce.mode", self.mode, 0, 0o7777)
        if self.mtime_ns is not None:
            _check_range("shard_announce.mtime_ns", self.mtime_ns, 0, 2**63 - 1)
        link = self.symlink
        if link is not None and (not 0 < len(link) <= MAX_LINK_TARGET or "\0" in link):
            raise ControlProtocolError(f"shard_announce.symlink: give a target of 1..{MAX_LINK_TARGET} "
                                       "characters, no NUL")
        if link is not None and self.size_bytes:
            raise ControlProtocolError("shard_announce.symlink: only a zero-size entry is a symlink")
        if not _HEX64.match(self.digest):
            raise ControlProtocolError("shard_announce.digest: must be 64 lowercase hex digits")
        if self.shape is not None and any(dim < 0 for dim in self.shape):
            raise ControlProtocolError("shard_announce.shape: dimensions must be >= 0")


@dataclass(frozen=True)
class ShardComplete(Message):
    """The receiver's verdict on a shard."""

    TYPE: ClassVar[str] = "shard_complete"
    shard_id: int
    status: str
    reason: str | None = None  # protocol 4: why it was not verified, for the sender's report

    def validate(self) -> None:
        _check_range("shard_complete.shard_id", self.shard_id, 0, MAX_U32)
        _check_choice("shard_complete.status", self.status, SHARD_STATUSES)
        if self.reason is not None and len(self.reason) > MAX_REASON:
            raise ControlProtocolError(f"shard_complete.reason: at most {MAX_REASON} characters")


@dataclass(frozen=True)
class PathStatus(Message):
    """A path went up or down as seen by the sender of this message."""

    TYPE: ClassVar[str] = "path_status"
    path_id: int
    up: bool
    reason: str = ""

    def validate(self) -> None:
        _check_range("path_status.path_id", self.path_id, 0, 65535)


@dataclass(frozen=True)
class Bye(Message):
    """Orderly end of the session; the peer may release everything."""

    TYPE: ClassVar[str] = "bye"
    reason: str = ""


@dataclass(frozen=True)
class ResumeQuery(Message):
    """Which pieces of a file does the receiver already hold (after a crash or a lost session)?

    Pieces ``first_piece ..`` of ``piece_bytes`` each (the last one shorter), with their
    BLAKE3 digest: the receiver answers only for data that matches, so a resume is decided by
    content, never by a name alone. Large files take several queries (the frame cap).
    """

    TYPE: ClassVar[str] = "resume_query"
    query_id: int
    name: str
    file_size: int
    piece_bytes: int
    first_piece: int
    digest: list[str]

    def validate(self) -> None:
        _check_range("resume_query.query_id", self.query_id, 0, MAX_U32)
        _check_range("resume_query.file_size", self.file_size, 1, MAX_U62)
        _check_range("resume_query.piece_bytes", self.piece_bytes, 1, MAX_U62)
        _check_range("resume_query.first_piece", self.first_piece, 0, MAX_U32)
        _check_range("resume_query.pieces", len(self.digest), 1, RESUME_BATCH)
        if (self.first_piece + len(self.digest) - 1) * self.piece_bytes >= self.file_size:
            raise ControlProtocolError("resume_query.digest: more pieces than the file has")
        if not all(_HEX64.match(digest) for digest in self.digest):
            raise ControlProtocolError("resume_query.digest: must be 64 lowercase hex digits each")


@dataclass(frozen=True)
class ResumeHave(Message):
    """The receiver's answer: the pieces (indices) it holds, verified against the query."""

    TYPE: ClassVar[str] = "resume_have"
    query_id: int
    pieces: list[int]

    def validate(self) -> None:
        _check_range("resume_have.query_id", self.query_id, 0, MAX_U32)
        _check_range("resume_have.pieces", len(self.pieces), 0, RESUME_BATCH)
        for index in self.pieces:
            _check_range("resume_have.pieces[]", index, 0, MAX_U32)


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (Hello, Welcome, Keys, KeyUpdate, ShardAnnounce, ShardComplete, PathStatus, Bye,
                ResumeQuery, ResumeHave)
}
# Each type's fields and their resolved annotations, once: resolving the string annotations
# (``from __future__ import annotations``) cost ~230 us per decoded message, most of a
# decode, and a warm group decodes two messages per collective message it moves.
_FIELDS: dict[type[Message], dict[str, tuple[dataclasses.Field[Any], Any]]] = {
    cls: {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls)}
    for cls in MESSAGE_TYPES.values()
    for hints in (typing.get_type_hints(cls),)
}


def _to_json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    return value


def message_to_dict(msg: Message) -> dict[str, Any]:
    """The JSON object for ``msg`` (bytes as hex); validates first."""
    msg.validate()
    out: dict[str, Any] = {"type": msg.TYPE}
    newer = SINCE_VERSION_4.get(msg.TYPE, ())
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if value is None and f.name in newer:
            continue  # absent, not null: a protocol 3 peer refuses a field it does not know
        out[f.name] = _to_json_value(value)
    return out


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(what: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against annotation ``tp`` and return the Python value."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        (inner,) = [opt for opt in options if opt is not type(None)]
        return _convert(what, value, inner)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ControlProtocolError(f"{what}: expected a list, got {type(value).__name__}")
        return [_convert(f"{what}[{i}]", item, inner) for i, item in enumerate(value)]
    if tp is bytes:
        if not isinstance(value, str) or not re.fullmatch(r"(?:[0-9a-f]{2})*", value):
            raise ControlProtocolError(f"{what}: expected lowercase hex bytes")
        return bytes.fromhex(value)
    if tp is int:
        # bool is a subclass of int in Python; JSON true is not a number.
        if type(value) is not int:
            raise ControlProtocolError(f"{what}: expected an integer, got {type(value).__name__}")
        return value
    if tp in (str, bool):
        if type(value) is not tp:
            raise ControlProtocolError(
                f"{what}: expected {_type_name(tp)}, got {type(value).__name__}"
            )
        return value
    raise TypeError(f"unsupported field type {tp!r}")  # programming error, not peer input


def message_from_dict(obj: Any) -> Message:
    """Build and validate a message from a decoded JSON object."""
    if not isinstance(obj, dict):
        raise ControlProtocolError("message: expected a JSON object")
    kind = obj.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ControlProtocolError(
            f"message.type: {kind!r} is not valid; use one of {sorted(MESSAGE_TYPES)}"
        )
    fields = _FIELDS[cls]
    unknown = set(obj) - set(fields) - {"type"}
    version = obj.get("version")
    if unknown and "version" in fields and type(version) is int and version != PROTOCOL_VERSION:
        # A peer of another version may add fields: name the versions, not the fields.
        raise ControlProtocolError(f"{kind}.version: {version} is not supported; this gateway "
                                   f"speaks {PROTOCOL_VERSION}")
    if unknown:
        raise ControlProtocolError(f"{kind}: unknown field(s) {sorted(unknown)}")
    values: dict[str, Any] = {}
    for name, (f, hint) in fields.items():
        if name not in obj:
            if f.default is dataclasses.MISSING:
                raise ControlProtocolError(f"{kind}.{name}: missing required field")
            continue
        values[name] = _convert(f"{kind}.{name}", obj[name], hint)
    msg = cls(**values)
    msg.validate()
    return msg


def encode_message(msg: Message) -> bytes:
    """Compact UTF-8 JSON for one message."""
    return json.dumps(message_to_dict(msg), separators=(",", ":")).encode()


def decode_message(data: bytes) -> Message:
    """Parse and validate one message; ControlProtocolError on any defect."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad UTF-8/JSON, huge ints, deep nesting
        raise ControlProtocolError(f"message: not valid UTF-8 JSON ({exc})") from None
    return message_from_dict(obj)


def for_version(msg: Message, version: int) -> Message:
    """``msg`` as a peer speaking ``version`` may receive it: fields newer than that left out."""
    newer = SINCE_VERSION_4.get(msg.TYPE, ()) if version < 4 else ()
    if not any(getattr(msg, name) is not None for name in newer):
        return msg
    return dataclasses.replace(msg, **dict.fromkeys(newer))


def _unsupported(version: int) -> ControlProtocolError:
    """The refusal of a version this gateway cannot speak. Its wording is what a gateway of a
    newer version reads to dial again at an older one (``gateway.handshake``): keep it."""
    return ControlProtocolError(f"hello.version: {version} is not supported; this gateway speaks "
                                f"{PROTOCOL_VERSION}")


def answer_hello(
    hello: Hello, *, gateway: str, endpoints: list[str], ciphers: list[str], conn_id: int
) -> Welcome:
    """The responder's Welcome for ``hello``: the protocol version is the lower of both
    sides' (an initiator older than MIN_PROTOCOL_VERSION is refused), path ``i`` pairs both
    sides' endpoint ``i`` (as many paths as the shorter list), the cipher is the initiator's
    most preferred one that we also support. Raises ControlProtocolError if none fits."""
    if hello.version < MIN_PROTOCOL_VERSION:
        raise _unsupported(hello.version)
    common = [c for c in hello.ciphers if c in ciphers and c in CIPHERS]
    if not common:
        raise ControlProtocolError(
            f"hello.ciphers: none of {hello.ciphers} is supported; use one of {ciphers}"
        )
    welcome = Welcome(
        version=min(hello.version, PROTOCOL_VERSION),
        gateway=gateway,
        cipher=common[0],
        paths=[[mine, theirs] for theirs, mine in zip(endpoints, hello.endpoints, strict=False)],
        conn_id=conn_id,
        peer_conn_id=hello.conn_id,
    )
    welcome.validate()
    return welcome
