"""Control message codec and stream framing: round trips and strict rejection."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.control.framing import (
    MAX_FRAME_BYTES,
    Ack,
    Attach,
    Attached,
    FrameDecoder,
    MsgFrame,
    Refused,
    encode_frame,
)
from wanxport.control.messages import (
    CIPHERS,
    DIRECTIONS,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    ROLES,
    SHARD_STATUSES,
    Bye,
    ControlProtocolError,
    Hello,
    Keys,
    KeyUpdate,
    Message,
    PathStatus,
    ResumeHave,
    ResumeQuery,
    ShardAnnounce,
    ShardComplete,
    Welcome,
    answer_hello,
    decode_message,
    encode_message,
    for_version,
    message_from_dict,
    message_to_dict,
)

u32 = st.integers(0, 2**32 - 1)
instance = st.text("0123456789abcdef", min_size=16, max_size=16)
u62 = st.integers(0, 2**62 - 1)
text = st.text(max_size=20)
name = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=20)
endpoint = st.builds(
    lambda host, port: f"{host}:{port}",
    st.sampled_from(["127.0.0.1", "gw-a.example", "[::1]", "10.0.0.7"]),
    st.integers(1, 65535),
)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Hello, version=st.integers(1, 255), role=st.sampled_from(ROLES), gateway=name,
              endpoints=st.lists(endpoint, min_size=1, max_size=8),
              ciphers=st.lists(st.sampled_from(CIPHERS), min_size=1, max_size=2), conn_id=u32,
              instance=st.none() | instance),
    st.builds(Welcome, version=st.integers(1, 255), gateway=name, cipher=st.sampled_from(CIPHERS),
              paths=st.lists(st.lists(endpoint, min_size=2, max_size=2), min_size=1, max_size=8),
              conn_id=u32, peer_conn_id=u32, instance=st.none() | instance),
    st.builds(Keys, direction=st.sampled_from(DIRECTIONS), key_phase=u62,
              cipher=st.sampled_from(CIPHERS), key=st.binary(min_size=32, max_size=32),
              iv=st.binary(min_size=12, max_size=12)),
    st.builds(KeyUpdate, direction=st.sampled_from(DIRECTIONS), key_phase=u62),
    st.builds(ShardAnnounce, shard_id=u32, size_bytes=u62,
              digest=st.text("0123456789abcdef", min_size=64, max_size=64), step=u62,
              name=st.none() | text, dtype=st.none() | st.sampled_from(["float32", "bfloat16"]),
              shape=st.none() | st.lists(st.integers(0, 2**20), max_size=4)),
    st.builds(ShardComplete, shard_id=u32, status=st.sampled_from(SHARD_STATUSES)),
    st.builds(PathStatus, path_id=st.integers(0, 65535), up=st.booleans(), reason=text),
    st.builds(Bye, reason=text),
    st.builds(lambda first, digests, piece: ResumeQuery(1, "a/b.bin", (first + len(digests)) * piece, piece,
                                                       first, digests),
              u32.map(lambda v: v % 1000),
              st.lists(st.text("0123456789abcdef", min_size=64, max_size=64), min_size=1, max_size=4),
              st.integers(1, 2**30)),
    st.builds(ResumeHave, query_id=u32, pieces=st.lists(u32, max_size=8)),
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_message_round_trip(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg


@settings(max_examples=100, deadline=None)
@given(st.lists(messages, min_size=1, max_size=5), st.integers(1, 50))
def test_frames_reassemble_from_any_split(msgs: list[Message], chunk: int) -> None:
    frames = [MsgFrame(seq=i + 1, ack=i, body=message_to_dict(m)) for i, m in enumerate(msgs)]
    frames += [Ack(3), Attach("ab" * 16, 2, resume=True), Attached("cd" * 16, 0, new=False),
               Refused("no")]
    stream = b"".join(encode_frame(f) for f in frames)
    decoder = FrameDecoder()
    out = []
    for start in range(0, len(stream), chunk):
        out += decoder.feed(stream[start:start + chunk])
    assert out == frames


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    for parse in (decode_message, lambda d: FrameDecoder().feed(struct.pack("!I", len(d)) + d)):
        try:
            parse(data)
        except ControlProtocolError:
            pass


GOOD_HELLO = {"type": "hello", "version": PROTOCOL_VERSION, "role": "initiator", "gateway": "gw-a",
              "endpoints": ["127.0.0.1:9000"], "ciphers": ["aes-256-gcm"], "conn_id": 5}


@pytest.mark.parametrize("change, expected", [
    ({"type": "nope"}, r"message\.type: 'nope' is not valid"),
    ({"conn_id": None}, r"hello\.conn_id: missing required field"),
    ({"conn_id": "5"}, r"hello\.conn_id: expected an integer, got str"),
    ({"conn_id": True}, r"hello\.conn_id: expected an integer, got bool"),
    ({"conn_id": 2**32}, r"hello\.conn_id: 4294967296 is out of range"),
    ({"endpoints": "127.0.0.1:9000"}, r"hello\.endpoints: expected a list"),
    ({"endpoints": ["127.0.0.1"]}, r"hello\.endpoints\[0\]: '127\.0\.0\.1' is not a valid"),
    ({"role": "boss"}, r"hello\.role: 'boss' is not valid"),
    ({"extra": 1}, r"hello: unknown field\(s\) \['extra'\]"),
    ({"instance": "00112233445566"}, r"hello\.instance: '00112233445566' is not valid; use 16 lowercase hex"),
    ({"instance": "0011223344556677\n"}, r"hello\.instance: .* is not valid"),
    ({"instance": 7}, r"hello\.instance: expected str, got int"),
])
def test_malformed_hello_is_rejected_with_the_field_named(change: dict, expected: str) -> None:
    obj = dict(GOOD_HELLO)
    for key, value in change.items():
        if value is None:
            del obj[key]
        else:
            obj[key] = value
    with pytest.raises(ControlProtocolError, match=expected):
        decode_message(json.dumps(obj).encode())


@pytest.mark.parametrize("data, expected", [
    (b"\xff\xfe", "not valid UTF-8 JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b"[" * 100_000, "not valid UTF-8 JSON"),
    (b'{"type": "keys", "direction": "initiator->responder", "key_phase": 0, '
     b'"cipher": "aes-256-gcm", "key": "00", "iv": "' + b"00" * 12 + b'"}',
     r"keys\.key: must be 32 bytes"),
    (b'{"type": "bye", "reason": 1.5}', r"bye\.reason: expected str, got float"),
])
def test_malformed_bytes_are_rejected(data: bytes, expected: str) -> None:
    with pytest.raises(ControlProtocolError, match=expected):
        decode_message(data)


def test_keys_repr_hides_secrets() -> None:
    keys = Keys("initiator->responder", 0, "aes-256-gcm", b"\x11" * 32, b"\x22" * 12)
    assert "11" not in repr(keys) and "key=" not in repr(keys)


def test_frame_size_cap() -> None:
    with pytest.raises(ControlProtocolError, match="exceeds"):
        FrameDecoder().feed(struct.pack("!I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ControlProtocolError, match="exceeds"):
        encode_frame(MsgFrame(1, 0, {"type": "bye", "reason": "x" * MAX_FRAME_BYTES}))


@pytest.mark.parametrize("body, expected", [
    (b'{"k": "msg", "seq": 1, "ack": 0}', r"frame\.m"),
    (b'{"k": "msg", "seq": -1, "ack": 0, "m": {}}', r"frame\.seq"),
    (b'{"k": "attach", "session": "zz", "ack": 0, "resume": false}', r"frame\.session"),
    (b'{"k": "attach", "session": "' + b"a" * 32 + b'", "ack": 0}', r"frame\.resume"),
    (b'{"k": "what"}', r"frame\.k"),
])
def test_malformed_frames(body: bytes, expected: str) -> None:
    with pytest.raises(ControlProtocolError, match=expected):
        FrameDecoder().feed(struct.pack("!I", len(body)) + body)


def test_answer_hello_pairs_paths_and_picks_cipher() -> None:
    hello = Hello(PROTOCOL_VERSION, "initiator", "gw-a", ["10.0.0.1:9000", "10.0.1.1:9000", "10.0.2.1:9000"],
                  ["chacha20-poly1305", "aes-256-gcm"], 7)
    welcome = answer_hello(hello, gateway="gw-b", endpoints=["10.0.0.2:9000", "10.0.1.2:9000"],
                           ciphers=["aes-256-gcm"], conn_id=9)
    assert welcome.cipher == "aes-256-gcm"
    assert welcome.paths == [["10.0.0.1:9000", "10.0.0.2:9000"], ["10.0.1.1:9000", "10.0.1.2:9000"]]
    assert (welcome.conn_id, welcome.peer_conn_id) == (9, 7)
    with pytest.raises(ControlProtocolError, match="hello.ciphers"):
        answer_hello(hello, gateway="gw-b", endpoints=["10.0.0.2:9000"], ciphers=[], conn_id=9)
    with pytest.raises(ControlProtocolError,
                       match=f"hello.version: 2 is not supported; this gateway speaks {PROTOCOL_VERSION}"):
        # A version-2 peer digests shards with SHA-256: refused at the hello, not shard by shard.
        answer_hello(Hello(2, "initiator", "gw-a", ["10.0.0.1:9000"], ["aes-256-gcm"], 7),
                     gateway="gw-b", endpoints=["10.0.0.2:9000"], ciphers=["aes-256-gcm"],
                     conn_id=9)


@pytest.mark.parametrize(("offered", "agreed"), [(3, 3), (4, 4), (5, 5), (9, 5)])
def test_versions_agree_on_the_lower_of_both(offered: int, agreed: int) -> None:
    assert (PROTOCOL_VERSION, MIN_PROTOCOL_VERSION) == (5, 3)
    hello = Hello(offered, "initiator", "gw-a", ["10.0.0.1:9000"], ["aes-256-gcm"], 7)
    welcome = answer_hello(hello, gateway="gw-b", endpoints=["10.0.0.2:9000"], ciphers=["aes-256-gcm"],
                           conn_id=9)
    assert welcome.version == agreed


# What a protocol 3 gateway's decoder knows: it refuses any other field.
V3_FIELDS = {"shard_announce": {"type", "shard_id", "size_bytes", "digest", "step", "name", "dtype", "shape"},
             "shard_complete": {"type", "shard_id", "status"}}


@pytest.mark.parametrize("msg", [
    ShardComplete(4, "aborted", "dest evil/x.bin: 'evil' is a symlink; not followed"),
    ShardAnnounce(5, 0, "0" * 64, 0, name="d/link", mode=0o600, mtime_ns=10**18, symlink="../f"),
])
def test_fields_newer_than_the_agreed_version_are_left_out(msg: Message) -> None:
    at_4 = message_to_dict(for_version(msg, 4))
    assert decode_message(encode_message(for_version(msg, 4))) == msg
    assert set(at_4) > V3_FIELDS[msg.TYPE]
    at_3 = message_to_dict(for_version(msg, 3))
    assert set(at_3) <= V3_FIELDS[msg.TYPE], "a protocol 3 peer would refuse the session"
    assert message_from_dict(at_3) == dataclasses.replace(msg, **{k: None for k in set(at_4) - set(at_3)})
    bare = dataclasses.replace(msg, **{k: None for k in set(at_4) - set(at_3)})
    assert set(message_to_dict(bare)) == set(at_3), "unset new fields are absent, not null"


def test_a_symlink_entry_is_checked() -> None:
    with pytest.raises(ControlProtocolError, match="only a zero-size entry"):
        ShardAnnounce(5, 10, "0" * 64, 0, symlink="f").validate()
    with pytest.raises(ControlProtocolError, match="no NUL"):
        ShardAnnounce(5, 0, "0" * 64, 0, symlink="a\0b").validate()
    with pytest.raises(ControlProtocolError, match="shard_announce.mode"):
        ShardAnnounce(5, 0, "0" * 64, 0, mode=0o10000).validate()


def test_resume_query_is_bounded_by_its_file() -> None:
    digest = "0" * 64
    with pytest.raises(ControlProtocolError, match="more pieces than the file has"):
        ResumeQuery(1, "f", 100, 50, 1, [digest, digest]).validate()
    with pytest.raises(ControlProtocolError, match="resume_query.pieces"):
        ResumeQuery(1, "f", 10**9, 1, 0, [digest] * 513).validate()
    with pytest.raises(ControlProtocolError, match="64 lowercase hex"):
        ResumeQuery(1, "f", 100, 50, 0, ["XYZ"]).validate()


def test_a_peer_of_another_version_with_new_fields_is_refused_by_version() -> None:
    """A newer peer's Hello may carry fields this build does not know: the refusal names the versions."""
    newer = dict(GOOD_HELLO, version=PROTOCOL_VERSION + 1, congestion_hint="bbr3")
    with pytest.raises(ControlProtocolError,
                       match=f"hello.version: {PROTOCOL_VERSION + 1} is not supported; this gateway "
                             f"speaks {PROTOCOL_VERSION}"):
        message_from_dict(newer)
    with pytest.raises(ControlProtocolError, match="unknown field"):  # same version: a defect
        message_from_dict(dict(GOOD_HELLO, congestion_hint="bbr3"))
