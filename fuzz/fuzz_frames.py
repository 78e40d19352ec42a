"""Fuzz target: the plaintext frame parser, which sees a peer's bytes after authentication.

An authenticated peer can still be hostile or buggy, so ``decode_frames`` must
refuse anything malformed with ``WireError`` and nothing else. Whatever it
accepts must re-encode to frames that decode to the same values (the encoder
and decoder agree on every accepted input).

    python fuzz/fuzz_frames.py -runs=1000000 /tmp/fuzz-frames fuzz/corpus/frames
"""

from __future__ import annotations

import harness


def load() -> harness.Check:
    from wanxport.wire.errors import WireError
    from wanxport.wire.frames import DataFrame, decode_frames, encode_frames

    def values(frames: list) -> list:  # DATA carries a memoryview: compare its bytes
        return [(f.shard_id, f.offset, f.length, bytes(f.data)) if isinstance(f, DataFrame) else f
                for f in frames]

    def check(data: bytes) -> None:
        try:
            frames = decode_frames(data)
        except WireError:
            return
        again = decode_frames(encode_frames(frames))
        assert values(again) == values(frames), "accepted frames do not round-trip"

    return check


if __name__ == "__main__":
    harness.run(load)
