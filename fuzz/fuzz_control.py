"""Fuzz target: the control channel's parsers (stream framing, envelopes, messages).

The peer is authenticated by TLS, but may run another version or be
compromised: ``FrameDecoder`` (length prefixes over arbitrary stream pieces),
``parse_frame`` (envelopes) and ``decode_message`` (message bodies) must raise
only ``ControlProtocolError``. A message that decodes re-encodes to one that
decodes equal. The first input byte chooses how the rest is split into
stream pieces, so reassembly across reads is exercised too.

    python fuzz/fuzz_control.py -runs=1000000 /tmp/fuzz-control fuzz/corpus/control
"""

from __future__ import annotations

import harness


def load() -> harness.Check:
    from wanxport.control.framing import FrameDecoder, MsgFrame
    from wanxport.control.messages import (
        ControlProtocolError,
        decode_message,
        encode_message,
        message_from_dict,
    )

    def message(obj: object) -> None:
        try:
            msg = message_from_dict(obj)
        except ControlProtocolError:
            return
        assert decode_message(encode_message(msg)) == msg, "message does not round-trip"

    def check(data: bytes) -> None:
        if not data:
            return
        step, body = data[0] % 17 + 1, data[1:]
        try:
            decode_message(body)
        except ControlProtocolError:
            pass
        decoder = FrameDecoder(max_frame_bytes=4096)
        try:
            for i in range(0, len(body), step):
                for frame in decoder.feed(body[i : i + step]):
                    if isinstance(frame, MsgFrame):
                        message(frame.body)
        except ControlProtocolError:
            pass

    return check


if __name__ == "__main__":
    harness.run(load)
