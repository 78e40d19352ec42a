"""Frames on the control stream: length prefix, envelopes, sequence numbers.

One QUIC stream carries ``u32 length`` + a JSON envelope, back to back. The
envelope exists so a *logical* control session can outlive one QUIC
connection: every message gets a sequence number (1, 2, ...) and every frame
may acknowledge the highest sequence number received in order. After a
reconnect the two sides exchange ``attach``/``attached`` with their
acknowledgement, and each re-sends what the other has not acknowledged; the
receiver drops sequence numbers it already delivered. Nothing is lost or
delivered twice across a switch of address.

Envelopes::

    {"k": "attach",   "session": <32 hex>, "ack": n, "resume": bool}  client -> server
    {"k": "attached", "session": <32 hex>, "ack": n, "new": bool}  server -> client
    {"k": "refused",  "reason": str}                               server -> client
    {"k": "msg",      "seq": n, "ack": n, "m": {message}}          both
    {"k": "ack",      "ack": n}                                    both
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any

from .messages import ControlProtocolError

MAX_FRAME_BYTES = 64 * 1024
_LEN = struct.Struct("!I")
_SESSION = re.compile(r"^[0-9a-f]{32}$")
_MAX_SEQ = 2**62 - 1


@dataclass(frozen=True)
class Attach:
    """Client opens (``resume`` false) or re-attaches to a logical session."""

    session: str
    ack: int
    resume: bool


@dataclass(frozen=True)
class Attached:
    session: str
    ack: int
    new: bool


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class MsgFrame:
    """A message with its sequence number; ``body`` is decoded by the channel
    so that a bad message can be a counted drop without corrupting the stream."""

    seq: int
    ack: int
    body: dict[str, Any]


@dataclass(frozen=True)
class Ack:
    ack: int


Frame = Attach | Attached | Refused | MsgFrame | Ack


def encode_frame(frame: Frame) -> bytes:
    """Length-prefixed JSON for one envelope."""
    obj: dict[str, Any]
    if isinstance(frame, Attach):
        obj = {"k": "attach", "session": frame.session, "ack": frame.ack, "resume": frame.resume}
    elif isinstance(frame, Attached):
        obj = {"k": "attached", "session": frame.session, "ack": frame.ack, "new": frame.new}
    elif isinstance(frame, Refused):
        obj = {"k": "refused", "reason": frame.reason}
    elif isinstance(frame, MsgFrame):
        obj = {"k": "msg", "seq": frame.seq, "ack": frame.ack, "m": frame.body}
    else:
        obj = {"k": "ack", "ack": frame.ack}
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise ControlProtocolError(
            f"frame: {len(data)} bytes exceeds the {MAX_FRAME_BYTES}-byte control message cap"
        )
    return _LEN.pack(len(data)) + data


def _seq(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if type(value) is not int or not 0 <= value <= _MAX_SEQ:
        raise ControlProtocolError(f"frame.{key}: expected an integer in [0, 2^62-1]")
    return value


def _flag(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key)
    if type(value) is not bool:
        raise ControlProtocolError(f"frame.{key}: expected true or false")
    return value


def _session(obj: dict[str, Any]) -> str:
    value = obj.get("session")
    if not isinstance(value, str) or not _SESSION.match(value):
        raise ControlProtocolError("frame.session: expected 32 lowercase hex digits")
    return value


def parse_frame(data: bytes) -> Frame:
    """Decode one envelope body (without its length prefix)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ControlProtocolError(f"frame: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ControlProtocolError("frame: expected a JSON object")
    kind = obj.get("k")
    if kind == "msg":
        body = obj.get("m")
        if not isinstance(body, dict):
            raise ControlProtocolError("frame.m: expected a message object")
        return MsgFrame(seq=_seq(obj, "seq"), ack=_seq(obj, "ack"), body=body)
    if kind == "ack":
        return Ack(ack=_seq(obj, "ack"))
    if kind == "attach":
        return Attach(session=_session(obj), ack=_seq(obj, "ack"), resume=_flag(obj, "resume"))
    if kind == "attached":
        return Attached(session=_session(obj), ack=_seq(obj, "ack"), new=_flag(obj, "new"))
    if kind == "refused":
        reason = obj.get("reason")
        return Refused(reason=reason if isinstance(reason, str) else "")
    raise ControlProtocolError(
        f"frame.k: {kind!r} is not valid; use attach, attached, refused, msg or ack"
    )


class FrameDecoder:
    """Reassembles frames from stream bytes that arrive in arbitrary pieces."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[Frame]:
        """Return every complete frame; raise ControlProtocolError on a bad one."""
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= _LEN.size:
            (length,) = _LEN.unpack_from(self._buf)
            if length > self._max:
                raise ControlProtocolError(
                    f"frame: length {length} exceeds the {self._max}-byte control message cap"
                )
            if len(self._buf) < _LEN.size + length:
                break
            body = bytes(self._buf[_LEN.size : _LEN.size + length])
            del self._buf[: _LEN.size + length]
            frames.append(parse_frame(body))
        return frames
