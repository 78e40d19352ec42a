"""DATA queued unsealed and sealed as it leaves (ext/datapath/pacer.h).

``Pacer.enqueue_data`` queues a data run; the release thread seals each
datagram just before its send. So the pacer must keep what it reads alive
(the shard's buffer, the key) until the run's last datagram left, and a
datagram a send refused must leave later exactly as it was sealed, never
sealed a second time under the same nonce.
"""

from __future__ import annotations

import gc
import socket
import sys

import pytest

from wanxport.aio import native_io
from wanxport.wire import native

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

KEY, IV = bytes(range(32)), bytes(range(12))
SEGMENT = 1200
SO_NO_CHECK = 11  # linux/socket.h: UDP without checksums, which UDP GSO refuses (EINVAL)


def pair() -> tuple[socket.socket, socket.socket]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5.0)
    tx.connect(rx.getsockname())
    return rx, tx


def expected(data: bytes, first_pn: int) -> list[bytes]:
    seal = native.Protector("aes-256-gcm", KEY, IV)
    burst = native.build_data_datagrams(seal, 9, 0, first_pn, 0, 5, data, 0, len(data), SEGMENT)
    return [bytes(burst.datagram(i)) for i in range(burst.count)]


def test_the_pacer_holds_the_shard_buffer_until_its_last_datagram_left() -> None:
    rx, tx = pair()
    data = bytearray(bytes(range(256)) * 30)  # 7680 bytes: 6 full datagrams and a short one
    want = expected(bytes(data), 100)
    try:
        with native_io.Pacer(1, capacity=64, slot_size=2048, spin_ns=0) as pacer:
            seal = native.Protector("aes-256-gcm", KEY, IV)
            assert pacer.enqueue_data(0, seal, 9, 100, 0, 5, data, 0, len(data), SEGMENT) == len(want)
            del seal  # the queued run keeps its key
            gc.collect()
            with pytest.raises(BufferError):  # exported to the pacer: it cannot move or shrink
                data.extend(b"x")
            pacer.set_path(0, tx)
            got = [rx.recv(65535) for _ in want]
            assert pacer.wait_idle(5.0)  # any call into the pacer releases finished runs
            data.extend(b"x")
        assert got == want
    finally:
        tx.close()
        rx.close()


def test_datagrams_a_send_refused_leave_as_they_were_sealed() -> None:
    """A GSO send that the kernel refuses (here: a socket without UDP checksums) leaves
    its sealed datagrams in the path's carry; they go out one by one, byte for byte the
    datagrams the reference builds, and the path stops asking for GSO."""
    rx, tx = pair()
    tx.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    data = bytes(range(256)) * 40  # 8 full datagrams and a short one
    want = expected(data, 7)
    try:
        with native_io.Pacer(1, capacity=64, slot_size=2048, spin_ns=0, gso=True) as pacer:
            if not pacer.name.endswith("+gso"):
                pytest.skip("this kernel has no UDP GSO")
            seal = native.Protector("aes-256-gcm", KEY, IV)
            assert pacer.enqueue_data(0, seal, 9, 7, 0, 5, data, 0, len(data), SEGMENT) == len(want)
            pacer.set_path(0, tx)
            got = [rx.recv(65535) for _ in want]
            assert pacer.wait_idle(5.0)
            stats = pacer.stats()[0]
        assert got == want
        assert not stats.gso and stats.gso_sends == 0 and stats.send_errors == 0
        assert stats.sent_datagrams == len(want)
    finally:
        tx.close()
        rx.close()


def test_a_closed_pacer_releases_what_it_still_held() -> None:
    data = bytearray(5000)
    pacer = native_io.Pacer(1, capacity=64, slot_size=2048, spin_ns=0)
    seal = native.Protector("aes-256-gcm", KEY, IV)
    assert pacer.enqueue_data(0, seal, 9, 0, 0, 5, data, 0, len(data), SEGMENT) == 5  # no socket
    with pytest.raises(BufferError):
        data.extend(b"x")
    pacer.close()
    data.extend(b"x")  # released with the queue it will never send


def test_finished_runs_give_back_every_reference() -> None:
    """Hundreds of runs sent and finished leave the key's and the buffer's reference counts
    where they were: nothing the pacer took for a run outlives it."""
    rx, tx = pair()
    rx.setblocking(False)
    data = bytearray(4 * SEGMENT)
    seal = native.Protector("aes-256-gcm", KEY, IV)
    key = seal._c  # what the pacer holds: the native key object inside the wrapper
    keys_before, data_before = sys.getrefcount(key), sys.getrefcount(data)
    try:
        with native_io.Pacer(1, capacity=64, slot_size=2048, spin_ns=0) as pacer:
            pacer.set_path(0, tx)
            for k in range(300):
                assert pacer.enqueue_data(0, seal, 9, 4 * k, 0, 5, data, 0, len(data), SEGMENT) == 4
                assert pacer.wait_idle(5.0)
                while True:
                    try:
                        rx.recv(65535)
                    except BlockingIOError:
                        break
            assert sys.getrefcount(key) == keys_before and sys.getrefcount(data) == data_before
    finally:
        tx.close()
        rx.close()
