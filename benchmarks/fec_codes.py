"""Erasure-code candidates for the tail, measured on wanxport's block shapes.

Why: the tail's erasure code is picked by measurement. A block is k data
datagrams of ~1400 B plus m repair ones; the sender encodes one block per
call and the receiver decodes one block with up to m symbols lost. Each
candidate is timed on the same blocks (the same random bytes, the same lost
symbols), encode and decode, in data megabytes per second, best of a few
repetitions (the machine is small and shared: relative figures are what
count). ``wanxport._fec`` (ISA-L, called from C) is measured next to the PyPI
packages it was chosen over:

    pip install zfec reed-solomon-leopard pyeclib raptorq   # or: pip install -e '.[fec-bench]'
    python benchmarks/fec_codes.py --out results/fec-codes.json

Candidates not installed are reported as such. Every decode is checked byte
for byte against the original block.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

SYMBOL = 1400
SHAPES = [(16, 1), (16, 2), (32, 4), (64, 4), (128, 8), (200, 16), (239, 16), (256, 16)]

Block = list[bytes]
Codec = tuple[Callable[[Block, int], Any], Callable[[Block, Any, int, list[int]], Block]]


def _zfec() -> Codec:
    zfec = importlib.import_module("zfec")

    def encode(data: Block, m: int) -> Any:
        k = len(data)
        return zfec.Encoder(k, k + m).encode(data, tuple(range(k, k + m)))

    def decode(data: Block, repair: Any, m: int, lost: list[int]) -> Block:
        k = len(data)
        keep = [i for i in range(k) if i not in lost]
        blocks = [data[i] for i in keep] + list(repair[: len(lost)])
        nums = keep + list(range(k, k + len(lost)))
        return list(zfec.Decoder(k, k + m).decode(blocks, nums))
    return encode, decode


def _leopard() -> Codec:
    leo = importlib.import_module("reed_solomon_leopard")

    def encode(data: Block, m: int) -> Any:
        return leo.encode(data, m)

    def decode(data: Block, repair: Any, m: int, lost: list[int]) -> Block:
        k = len(data)
        original = {i: data[i] for i in range(k) if i not in lost}
        restored = leo.decode(k, m, original, dict(enumerate(repair[: len(lost)])))
        return [original[i] if i in original else restored[i] for i in range(k)]
    return encode, decode


def _pyeclib() -> Codec:
    ec = importlib.import_module("pyeclib.ec_iface")
    drivers: dict[tuple[int, int], Any] = {}

    def driver(k: int, m: int) -> Any:
        if (k, m) not in drivers:
            drivers[k, m] = ec.ECDriver(k=k, m=m, ec_type="isa_l_rs_cauchy")
        return drivers[k, m]

    def encode(data: Block, m: int) -> Any:
        return driver(len(data), m).encode(b"".join(data))

    def decode(data: Block, fragments: Any, m: int, lost: list[int]) -> Block:
        k = len(data)
        keep = [fragments[i] for i in range(k) if i not in lost] + list(fragments[k:k + len(lost)])
        whole = driver(k, m).decode(keep)
        return [whole[i * SYMBOL:(i + 1) * SYMBOL] for i in range(k)]
    return encode, decode


def _raptorq() -> Codec:
    rq = importlib.import_module("raptorq")

    def encode(data: Block, m: int) -> Any:
        return rq.Encoder.with_defaults(b"".join(data), SYMBOL).get_encoded_packets(m)

    def decode(data: Block, packets: Any, m: int, lost: list[int]) -> Block:
        k = len(data)
        decoder = rq.Decoder.with_defaults(k * SYMBOL, SYMBOL)
        survivors = [p for i, p in enumerate(packets[:k]) if i not in lost] + packets[k:k + len(lost)]
        whole = None
        for packet in survivors:  # one Python call per datagram: the API has no other way
            whole = decoder.decode(packet)
            if whole is not None:
                break
        assert whole is not None
        return [whole[i * SYMBOL:(i + 1) * SYMBOL] for i in range(k)]
    return encode, decode


def _wanxport() -> Codec:
    fec = importlib.import_module("wanxport._fec")

    def encode(data: Block, m: int) -> Any:
        return fec.encode(b"".join(data), len(data), m, SYMBOL)

    def decode(data: Block, repair: Any, m: int, lost: list[int]) -> Block:
        k = len(data)
        held = b"".join(bytes(SYMBOL) if i in lost else data[i] for i in range(k))
        present = bytes(0 if i in lost else 1 for i in range(k))
        rebuilt = fec.decode(held, k, m, SYMBOL, present, repair[: len(lost) * SYMBOL],
                             bytes(range(len(lost))))
        out = list(data)
        for t, i in enumerate(sorted(lost)):
            out[i] = rebuilt[t * SYMBOL:(t + 1) * SYMBOL]
        return out
    return encode, decode


CANDIDATES: dict[str, tuple[Callable[[], Codec], str, int]] = {
    # name: (loader, callable from C?, most symbols k+m per block)
    "wanxport._fec (ISA-L)": (_wanxport, "yes: ISA-L's C API (libisal-dev), GIL released", 255),
    "pyeclib (liberasurecode + ISA-L)": (_pyeclib, "yes: liberasurecode C API, 80 B header a fragment", 255),
    "zfec": (_zfec, "no public C library (C inside the Python extension)", 256),
    "reed-solomon-leopard": (_leopard, "no (Rust crate behind a Python module)", 65535),
    "raptorq": (_raptorq, "no (Rust crate behind a Python module); decode is per packet", 56403),
}


def best_of(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def measure(name: str, codec: Codec, k: int, m: int, reps: int, rng: random.Random) -> dict[str, Any]:
    encode, decode = codec
    data = [rng.randbytes(SYMBOL) for _ in range(k)]
    lost = sorted(rng.sample(range(k), m))
    enc_s, repair = best_of(lambda: encode(data, m), reps)
    dec_s, rebuilt = best_of(lambda: decode(data, repair, m, lost), reps)
    ok = [bytes(b)[:SYMBOL] for b in rebuilt] == data
    mb = k * SYMBOL / 1e6
    return {"codec": name, "k": k, "m": m, "encode_MBps": round(mb / enc_s, 1),
            "decode_MBps": round(mb / dec_s, 1), "encode_us": round(enc_s * 1e6, 1),
            "decode_us": round(dec_s * 1e6, 1), "correct": ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    rng = random.Random(18)
    rows: list[dict[str, Any]] = []
    for name, (loader, c_api, max_symbols) in CANDIDATES.items():
        try:
            codec = loader()
        except ImportError as exc:
            rows.append({"codec": name, "missing": str(exc)})
            print(f"{name}: not installed ({exc})")
            continue
        for k, m in SHAPES:
            if k + m > max_symbols:
                rows.append({"codec": name, "k": k, "m": m, "unsupported": f"k+m > {max_symbols}"})
                continue
            row = measure(name, codec, k, m, args.reps, rng)
            row["c_api"] = c_api
            rows.append(row)
            print(f"{name:34s} k={k:3d} m={m:2d}  encode {row['encode_MBps']:8.1f} MB/s  "
                  f"decode {row['decode_MBps']:8.1f} MB/s  {'ok' if row['correct'] else 'WRONG'}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"symbol_bytes": SYMBOL, "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                       "rows": rows}, out, separators=(",", ":"))
            out.write("\n")
    return 0 if all(r.get("correct", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
