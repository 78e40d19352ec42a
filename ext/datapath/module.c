/*
 * wanxport._native: the per-datagram work of the data path in C.
 *
 * Python decides per burst and per acknowledgement batch; this module does
 * what has to happen per datagram (segment, seal, open, replay-check, place,
 * pace, send, receive) over whole batches with the GIL released.
 */
#include "datapath.h"
#include "replay.h"

static PyMethodDef module_methods[] = {
    {"seal_packet", (PyCFunction)(void (*)(void))wx_seal_packet, METH_VARARGS | METH_KEYWORDS,
     "seal_packet(protector, header, plaintext) -> bytes: the sealed datagram."},
    {"open_packet", (PyCFunction)(void (*)(void))wx_open_packet, METH_VARARGS | METH_KEYWORDS,
     "open_packet(protector, datagram) -> bytes | None: the plaintext, None if not authentic."},
    {"seal_batch", (PyCFunction)(void (*)(void))wx_seal_batch, METH_VARARGS | METH_KEYWORDS,
     "seal_batch(protector, packets: [(header, plaintext)]) -> list[bytes]."},
    {"open_batch", (PyCFunction)(void (*)(void))wx_open_batch, METH_VARARGS | METH_KEYWORDS,
     "open_batch(protector, datagrams) -> list[bytes | None]."},
    {"build_data_datagrams", (PyCFunction)(void (*)(void))wx_build_data_datagrams,
     METH_VARARGS | METH_KEYWORDS,
     "build_data_datagrams(protector, conn_id, path_id, first_pn, key_phase, shard_id, "
     "shard_buffer, offset, length, max_payload) -> (bytearray, stride, count)."},
    {"recv_batch", (PyCFunction)(void (*)(void))wx_recv_batch, METH_VARARGS | METH_KEYWORDS,
     "recv_batch(fd, buffer, max_datagrams, want_addrs=False, quic_addrs=False) -> "
     "(count, descriptors: bytes, addrs | None, truncated, rxq_overflow); rxq_overflow: the "
     "SO_RXQ_OVFL drop count on the newest message (-1 if none); quic_addrs: addresses of "
     "QUIC-looking datagrams only (None for the rest)."},
    {"enable_timestamps", (PyCFunction)wx_enable_timestamps, METH_VARARGS,
     "enable_timestamps(fd): ask the kernel for SO_TIMESTAMPNS receive timestamps."},
    {"enable_gro", (PyCFunction)wx_enable_gro, METH_VARARGS,
     "enable_gro(fd) -> bool: turn on UDP GRO if the kernel supports it."},
    {"fold_runs", (PyCFunction)wx_fold_runs, METH_O,
     "fold_runs(records) -> list[(path_id, first_pn, count, shard_id, offset, length)]: "
     "consecutive placed records folded into runs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "wanxport._native",
    .m_doc = "Native data path: AEAD, segmentation, receive placement, pacer, batched UDP I/O.",
    .m_size = -1,
    .m_methods = module_methods,
};

static int add_type(PyObject *m, PyTypeObject *t, const char *name) {
    if (PyType_Ready(t) < 0) return -1;
    Py_INCREF(t);
    if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

/* The values this build was compiled with. The Python wire modules define
 * each once; wanxport/wire/native.py refuses an extension that disagrees (a
 * stale build) and tests/test_native_constants.py fails on any difference. */
static int add_constants(PyObject *m) {
    static const struct {
        const char *name;
        long long value;
    } constants[] = {
        {"HEADER_LEN", WX_HEADER_LEN},
        {"MARKER", WX_MARKER},
        {"QUIC_FIXED_BIT", WX_QUIC_FIXED_BIT},
        {"KEY_PHASE_BIT", WX_FLAG_KEY_PHASE},
        {"MAX_PACKET_NUMBER", (long long)WX_MAX_PN},
        {"TAG_LEN", WX_TAG_LEN},
        {"KEY_LEN", WX_KEY_LEN},
        {"IV_LEN", WX_NONCE_LEN},
        {"FRAME_DATA", WX_FRAME_DATA},
        {"DATA_FRAME_HEADER_LEN", WX_DATA_FRAME_HEADER_LEN},
        {"MAX_OFFSET", (long long)WX_MAX_OFFSET},
        {"REPLAY_WINDOW", WX_REPLAY_WINDOW},
        {"RECORD_SIZE", (long long)sizeof(WxRecord)},
        {"DESC_SIZE", (long long)sizeof(WxDesc)},
        {"ACK_RANGES_KEPT", ACK_RANGES_KEPT},
        {"ACK_FRAME_RANGES", ACK_FRAME_RANGES},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        PyObject *v = PyLong_FromLongLong(constants[i].value);
        if (v == NULL || PyModule_AddObject(m, constants[i].name, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
    }
    return 0;
}

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    if (add_type(m, &WxProtector_Type, "Protector") < 0 ||
        add_type(m, &WxReceiver_Type, "Receiver") < 0 || add_type(m, &WxPacer_Type, "Pacer") < 0 ||
        add_type(m, &WxAckRecord_Type, "AckRecord") < 0 ||
        add_constants(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
