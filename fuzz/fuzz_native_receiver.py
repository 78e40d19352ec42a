"""Fuzz target: the native receiver (C, ``ext/datapath/receiver.c``) under AddressSanitizer.

The C receiver opens, replay-checks and places datagrams into shard buffers
without the GIL: a memory error there is a remote write primitive. Each input
becomes a small world (two registered shards of fuzzed sizes, a fuzzed freeze
point, both key phases) and a batch of datagrams: raw bytes (forgeries) or
datagrams sealed with the real key around fuzzed headers and plaintexts (so
the post-authentication placement code is reached, which a fuzzer could
never reach by forging AES-GCM tags). The batch goes through the native
receiver and the pure-Python reference (``wire.receiver.ReferenceReceiver``)
and every observable must agree: counters, placed records, control
plaintexts, QUIC hand-backs, buffer bytes, received ranges. The reference is
instrumented Python, so its coverage steers libFuzzer through the branches
the C code mirrors; ASan checks every C memory access.

Run as ``python fuzz/fuzz_native_receiver.py [libFuzzer flags]``: it builds the
extension with clang ``-fsanitize=address,fuzzer-no-link`` into ``build/asan``
(again when a C source changed) and re-executes itself with ASan + libFuzzer
preloaded (Python itself is not instrumented, so leak checking is off). ``WANXPORT_FUZZ_NO_ASAN=1`` skips both
(the normal build; pytest's corpus replay uses that).

    python fuzz/fuzz_native_receiver.py -runs=1000000 /tmp/fuzz-native fuzz/corpus/native_receiver
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import harness

ASAN_BUILD = harness.REPO / "build" / "asan"
_MARK = "WANXPORT_FUZZ_ASAN"


def _sanitizer_with_fuzzer() -> str:
    """ASan and libFuzzer in one preloadable library, as atheris documents for native code.

    The extension is built with ``-fsanitize=fuzzer-no-link`` so its branches feed
    libFuzzer's coverage; those hooks must resolve to the same libFuzzer atheris
    drives, hence one library holding both runtimes (atheris then reports "Using
    preloaded libfuzzer"). Debian's clang ships both as static archives; ASan's
    ``.preinit_array`` object cannot live in a shared library and is left out.
    """
    out = ASAN_BUILD / "asan_with_fuzzer.so"
    if out.exists():
        return str(out)
    rt = Path(subprocess.run(["clang", "-print-file-name=libclang_rt.asan-x86_64.a"], check=True,
                             capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        asan = Path(tmp) / "asan.a"
        shutil.copy(rt, asan)
        subprocess.run(["ar", "d", str(asan), "asan_preinit.cpp.o"], check=True)
        ASAN_BUILD.mkdir(parents=True, exist_ok=True)
        subprocess.run(["clang", "-shared", "-o", str(out), "-Wl,--whole-archive", str(asan),
                        str(rt.with_name("libclang_rt.fuzzer_no_main-x86_64.a")), "-Wl,--no-whole-archive",
                        "-lpthread", "-ldl", "-lrt", "-lm", "-lstdc++"], check=True)
    return str(out)


def _build_asan_extension() -> str:
    """``wanxport._native`` compiled with ASan (rebuilt when a C source is newer)."""
    sources = glob.glob(str(harness.REPO / "ext" / "datapath" / "*.[ch]")) + \
        glob.glob(str(harness.REPO / "ext" / "common" / "*.h"))
    built = glob.glob(str(ASAN_BUILD / "wanxport" / "_native*.so"))
    if not built or os.path.getmtime(built[0]) < max(map(os.path.getmtime, sources)):
        flags = "-fsanitize=address,fuzzer-no-link -fno-omit-frame-pointer -g -O1"
        env = dict(os.environ, CC="clang", LDSHARED="clang -shared", CFLAGS=flags, LDFLAGS=flags,
                   WANXPORT_ONLY_EXT="wanxport._native")
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(ASAN_BUILD),
                        "--build-temp", str(ASAN_BUILD / "tmp"), "--force"],
                       cwd=harness.REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        built = glob.glob(str(ASAN_BUILD / "wanxport" / "_native*.so"))
    return built[0]


def _use_asan() -> None:
    """Re-exec under the ASan runtime, then import the ASan build as ``wanxport._native``."""
    if os.environ.get("WANXPORT_FUZZ_NO_ASAN") == "1":
        return
    if os.environ.get(_MARK) != "1":
        path = _build_asan_extension()
        env = dict(os.environ, LD_PRELOAD=_sanitizer_with_fuzzer(), **{_MARK: "1", "WANXPORT_ASAN_SO": path})
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    import wanxport

    spec = importlib.util.spec_from_file_location("wanxport._native", os.environ["WANXPORT_ASAN_SO"])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wanxport._native"] = module
    spec.loader.exec_module(module)
    wanxport._native = module  # type: ignore[attr-defined]


def load() -> harness.Check:
    import atheris

    from wanxport.wire import native
    from wanxport.wire.frames import DATA
    from wanxport.wire.header import encode_header
    from wanxport.wire.protection import AeadProtection
    from wanxport.wire.receiver import ReferenceReceiver

    conn, n_paths, shard_ids = 0x10203040, 3, (7, 9)
    key, ivs = bytes(range(32)), (bytes(12), bytes(range(12)))
    sealers = [AeadProtection("aes-256-gcm", key, iv) for iv in ivs]
    protectors = [native.Protector("aes-256-gcm", key, iv) for iv in ivs]

    def plaintext(fdp: atheris.FuzzedDataProvider) -> bytes:
        if fdp.ConsumeBool():
            return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
        shard = shard_ids[fdp.ConsumeIntInRange(0, 1)] if fdp.ConsumeBool() else fdp.ConsumeInt(4)
        offset = fdp.ConsumeIntInRange(0, 5000) if fdp.ConsumeBool() else fdp.ConsumeInt(8)
        data = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 600))
        length = len(data) if fdp.ConsumeBool() else fdp.ConsumeInt(2)
        return (bytes([DATA]) + (shard % 2**32).to_bytes(4, "big") + (offset % 2**64).to_bytes(8, "big")
                + (length % 2**16).to_bytes(2, "big") + data)

    def datagram(fdp: atheris.FuzzedDataProvider) -> bytes:
        if fdp.ConsumeIntInRange(0, 3) == 0:
            return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 100))
        phase = fdp.ConsumeIntInRange(0, 1)
        path = fdp.ConsumeIntInRange(0, n_paths)
        pn = fdp.ConsumeIntInRange(0, 200) if fdp.ConsumeBool() else fdp.ConsumeInt(8) % 2**64
        header = encode_header(path, conn if fdp.ConsumeBool() else fdp.ConsumeInt(4) % 2**32,
                               pn % 2**62, phase)
        if fdp.ConsumeIntInRange(0, 7) == 0:  # a marker, flags or pn the checks must refuse
            marker, flags, pn_top = (fdp.ConsumeInt(1) % 256 for _ in range(3))
            header = bytes([marker, flags]) + header[2:8] + bytes([pn_top]) + header[9:]
        body = plaintext(fdp)
        sealed = sealers[phase].seal(header, path, int.from_bytes(header[8:], "big"), body)
        return header + sealed

    def check(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        sizes = [fdp.ConsumeIntInRange(0, 4096) for _ in shard_ids]
        c_rx, py_rx = native.Receiver(conn, n_paths), ReferenceReceiver(conn, n_paths)
        for phase in (0, 1):
            c_rx.set_key(phase, protectors[phase])
            py_rx.set_key(phase, sealers[phase])
        c_bufs, py_bufs = [bytearray(s) for s in sizes], [bytearray(s) for s in sizes]
        for sid, c_buf, py_buf in zip(shard_ids, c_bufs, py_bufs, strict=True):
            c_rx.add_shard(sid, c_buf)
            py_rx.add_shard(sid, py_buf)
        if fdp.ConsumeBool():
            upto = fdp.ConsumeIntInRange(0, sizes[0])
            c_rx.freeze(shard_ids[0], upto)
            py_rx.freeze(shard_ids[0], upto)
        for _ in range(fdp.ConsumeIntInRange(1, 3)):
            batch = [datagram(fdp) for _ in range(fdp.ConsumeIntInRange(0, 6))]
            c_res = c_rx.process(native.DatagramBatch.from_datagrams(batch))
            py_res = py_rx.process(batch)
            placed = [(int(r["path_id"]), int(r["pn"]), int(r["shard_id"]), int(r["offset"]),
                       int(r["length"])) for r in c_res.records]
            assert placed == [(p.path_id, p.pn, p.shard_id, p.offset, p.length) for p in py_res.placed]
            assert [(c.path_id, c.packet_number, bytes(c.plaintext)) for c in c_res.controls] == \
                [(c.path_id, c.packet_number, c.plaintext) for c in py_res.controls]
            assert [(i, bytes(d)) for i, d in c_res.quic] == py_res.quic
            assert c_rx.counters == py_rx.counters, (c_rx.counters, py_rx.counters)
        assert c_bufs == py_bufs, "buffers differ"
        for sid in shard_ids:
            assert c_rx.ranges(sid) == py_rx.ranges(sid)
            assert c_rx.received_bytes(sid) == py_rx.received_bytes(sid)

    return check


if __name__ == "__main__":
    _use_asan()
    harness.run(load)
