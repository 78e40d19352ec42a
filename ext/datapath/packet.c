/*
 * Building and protecting datagrams on the send side.
 *
 * build_data_datagrams() is the hot path: it cuts a slice of a shard into
 * DATA datagrams and seals them into one buffer with a fixed stride, so the
 * pacer can hand runs of them to the kernel as one UDP GSO send without
 * copying them again. seal_packet()/open_packet() and the *_batch variants
 * protect control datagrams that Python builds and parses.
 */
#include "datapath.h"

int wx_int_in_range(PyObject *obj, const char *name, long long lo, long long hi, long long *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s: %R is out of range [%lld, %lld]", name, obj, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int wx_data_run_count(long long first_pn, long long length, long long max_payload, long long *count) {
    long long n = (length + max_payload - 1) / max_payload;
    if (n > 0 && (unsigned long long)first_pn + (unsigned long long)n - 1 > WX_MAX_PN) {
        PyErr_Format(PyExc_ValueError, "first_pn: %lld + %lld datagrams exceeds 2^62-1", first_pn, n);
        return -1;
    }
    *count = n;
    return 0;
}

static int check_header(const Py_buffer *h) {
    if (h->len != WX_HEADER_LEN) {
        PyErr_Format(PyExc_ValueError, "header: must be %d bytes, got %zd", WX_HEADER_LEN, h->len);
        return -1;
    }
    return 0;
}

static int check_plaintext(const WxProtector *p, const Py_buffer *pt) {
    Py_ssize_t max = WX_MAX_UDP_PAYLOAD - WX_HEADER_LEN - (Py_ssize_t)p->tag_len;
    if (pt->len > max) {
        PyErr_Format(PyExc_ValueError, "plaintext: %zd bytes exceeds the maximum of %zd", pt->len,
                     max);
        return -1;
    }
    return 0;
}

/* Seal header+plaintext into a new bytes object: the whole datagram. */
static PyObject *seal_one(WxProtector *p, const Py_buffer *hdr, const Py_buffer *pt) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, WX_HEADER_LEN + pt->len + p->tag_len);
    if (out == NULL) return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    int rc;
    memcpy(o, hdr->buf, WX_HEADER_LEN);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&p->lock);
    rc = wx_seal(p, o, pt->buf, (size_t)pt->len, NULL, 0, o + WX_HEADER_LEN);
    pthread_mutex_unlock(&p->lock);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to seal the datagram");
        return NULL;
    }
    return out;
}

PyObject *wx_seal_packet(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"protector", "header", "plaintext", NULL};
    PyObject *pobj;
    Py_buffer hdr = {0}, pt = {0};
    PyObject *res = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oy*y*:seal_packet", kwlist, &pobj, &hdr, &pt))
        return NULL;
    WxProtector *p = wx_as_protector(pobj, "protector");
    if (p && check_header(&hdr) == 0 && check_plaintext(p, &pt) == 0) res = seal_one(p, &hdr, &pt);
    PyBuffer_Release(&hdr);
    PyBuffer_Release(&pt);
    return res;
}

PyObject *wx_open_packet(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"protector", "datagram", NULL};
    PyObject *pobj;
    Py_buffer dg = {0};
    PyObject *res = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oy*:open_packet", kwlist, &pobj, &dg))
        return NULL;
    WxProtector *p = wx_as_protector(pobj, "protector");
    if (p == NULL) goto done;
    if (dg.len < WX_HEADER_LEN + (Py_ssize_t)p->tag_len || dg.len > WX_MAX_UDP_PAYLOAD) {
        res = Py_NewRef(Py_None); /* malformed network input: a drop, not an error */
        goto done;
    }
    Py_ssize_t body = dg.len - WX_HEADER_LEN - (Py_ssize_t)p->tag_len;
    res = PyBytes_FromStringAndSize(NULL, body);
    if (res == NULL) goto done;
    const uint8_t *d = dg.buf;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&p->lock);
    rc = wx_open(p, d, d + WX_HEADER_LEN, (size_t)(dg.len - WX_HEADER_LEN),
                 (uint8_t *)PyBytes_AS_STRING(res));
    pthread_mutex_unlock(&p->lock);
    Py_END_ALLOW_THREADS
    if (rc != 0) Py_SETREF(res, Py_NewRef(Py_None));
done:
    PyBuffer_Release(&dg);
    return res;
}

/* A batch of independent datagrams: buffers are taken with the GIL, the
 * crypto runs without it, results are built with it again. */
typedef struct {
    Py_buffer a; /* header (seal) or whole datagram (open) */
    Py_buffer b; /* plaintext (seal only) */
    PyObject *out;
    int ok;
} BatchItem;

static void release_items(BatchItem *items, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyBuffer_Release(&items[i].a);
        PyBuffer_Release(&items[i].b);
        Py_XDECREF(items[i].out);
    }
    PyMem_Free(items);
}

PyObject *wx_seal_batch(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"protector", "packets", NULL};
    PyObject *pobj, *seq_obj, *seq, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:seal_batch", kwlist, &pobj, &seq_obj))
        return NULL;
    WxProtector *p = wx_as_protector(pobj, "protector");
    if (p == NULL) return NULL;
    seq = PySequence_Fast(seq_obj, "packets: expected a sequence of (header, plaintext)");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), filled = 0;
    BatchItem *items = PyMem_Calloc(n ? n : 1, sizeof(BatchItem));
    if (items == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (; filled < n; filled++) {
        BatchItem *it = &items[filled];
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, filled);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "packets[%zd]: expected a (header, plaintext) tuple",
                         filled);
            goto fail;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 0), &it->a, PyBUF_SIMPLE) != 0) goto fail;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 1), &it->b, PyBUF_SIMPLE) != 0) {
            PyBuffer_Release(&it->a);
            goto fail;
        }
        if (check_header(&it->a) != 0 || check_plaintext(p, &it->b) != 0) {
            filled++;
            goto fail;
        }
        it->out = PyBytes_FromStringAndSize(NULL, WX_HEADER_LEN + it->b.len + p->tag_len);
        if (it->out == NULL) {
            filled++;
            goto fail;
        }
        memcpy(PyBytes_AS_STRING(it->out), it->a.buf, WX_HEADER_LEN);
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&p->lock);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t *o = (uint8_t *)PyBytes_AS_STRING(items[i].out);
        if (wx_seal(p, o, items[i].b.buf, (size_t)items[i].b.len, NULL, 0, o + WX_HEADER_LEN))
            failed = 1;
    }
    pthread_mutex_unlock(&p->lock);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to seal a datagram");
        goto fail;
    }
    result = PyList_New(n);
    if (result == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyList_SET_ITEM(result, i, items[i].out);
        items[i].out = NULL;
    }
fail:
    release_items(items, filled);
    Py_DECREF(seq);
    return result;
}

PyObject *wx_open_batch(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"protector", "datagrams", NULL};
    PyObject *pobj, *seq_obj, *seq, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:open_batch", kwlist, &pobj, &seq_obj))
        return NULL;
    WxProtector *p = wx_as_protector(pobj, "protector");
    if (p == NULL) return NULL;
    seq = PySequence_Fast(seq_obj, "datagrams: expected a sequence of bytes-like objects");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), filled = 0;
    Py_ssize_t min_len = WX_HEADER_LEN + (Py_ssize_t)p->tag_len;
    BatchItem *items = PyMem_Calloc(n ? n : 1, sizeof(BatchItem));
    if (items == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (; filled < n; filled++) {
        BatchItem *it = &items[filled];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, filled), &it->a, PyBUF_SIMPLE) != 0)
            goto fail;
        if (it->a.len >= min_len && it->a.len <= WX_MAX_UDP_PAYLOAD) {
            it->out = PyBytes_FromStringAndSize(NULL, it->a.len - min_len);
            if (it->out == NULL) {
                filled++;
                goto fail;
            }
        }
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&p->lock);
    for (Py_ssize_t i = 0; i < n; i++) {
        BatchItem *it = &items[i];
        if (it->out == NULL) continue;
        const uint8_t *d = it->a.buf;
        it->ok = wx_open(p, d, d + WX_HEADER_LEN, (size_t)(it->a.len - WX_HEADER_LEN),
                         (uint8_t *)PyBytes_AS_STRING(it->out)) == 0;
    }
    pthread_mutex_unlock(&p->lock);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i].ok) {
            PyList_SET_ITEM(result, i, items[i].out);
            items[i].out = NULL;
        } else {
            PyList_SET_ITEM(result, i, Py_NewRef(Py_None));
        }
    }
fail:
    release_items(items, filled);
    Py_DECREF(seq);
    return result;
}

int wx_seal_data(WxProtector *p, uint8_t *d, uint32_t conn_id, uint16_t path_id, uint64_t pn,
                 int key_phase, uint32_t shard_id, uint64_t offset, const uint8_t *data, size_t n) {
    uint8_t frame[WX_DATA_FRAME_HEADER_LEN];
    d[0] = WX_MARKER;
    d[1] = (uint8_t)key_phase;
    wx_put_u16(d + 2, path_id);
    wx_put_u32(d + 4, conn_id);
    wx_put_u64(d + 8, pn);
    frame[0] = WX_FRAME_DATA;
    wx_put_u32(frame + 1, shard_id);
    wx_put_u64(frame + 5, offset);
    wx_put_u16(frame + 13, (uint16_t)n);
    return wx_seal(p, d, frame, sizeof frame, data, n, d + WX_HEADER_LEN);
}

PyObject *wx_build_data_datagrams(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"protector", "conn_id", "path_id", "first_pn", "key_phase",
                             "shard_id", "shard_buffer", "offset", "length", "max_payload",
                             NULL};
    PyObject *pobj, *o_conn, *o_path, *o_pn, *o_phase, *o_shard, *o_off, *o_len, *o_max;
    Py_buffer shard = {0};
    PyObject *out = NULL, *res = NULL;
    long long conn_id, path_id, first_pn, key_phase, shard_id, offset, length, max_payload;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOy*OOO:build_data_datagrams", kwlist,
                                     &pobj, &o_conn, &o_path, &o_pn, &o_phase, &o_shard, &shard,
                                     &o_off, &o_len, &o_max))
        return NULL;
    WxProtector *p = wx_as_protector(pobj, "protector");
    if (p == NULL) goto done;
    const long long max_payload_limit =
        WX_MAX_UDP_PAYLOAD - WX_HEADER_LEN - WX_DATA_FRAME_HEADER_LEN - (long long)p->tag_len;
    if (wx_int_in_range(o_conn, "conn_id", 0, 0xFFFFFFFFLL, &conn_id) ||
        wx_int_in_range(o_path, "path_id", 0, 0xFFFF, &path_id) ||
        wx_int_in_range(o_pn, "first_pn", 0, (long long)WX_MAX_PN, &first_pn) ||
        wx_int_in_range(o_phase, "key_phase", 0, 1, &key_phase) ||
        wx_int_in_range(o_shard, "shard_id", 0, 0xFFFFFFFFLL, &shard_id) ||
        wx_int_in_range(o_off, "offset", 0, (long long)shard.len, &offset) ||
        wx_int_in_range(o_len, "length", 0, (long long)shard.len - offset, &length) ||
        wx_int_in_range(o_max, "max_payload", 1,
                        max_payload_limit < 0xFFFF ? max_payload_limit : 0xFFFF, &max_payload))
        goto done;
    long long count;
    if (wx_data_run_count(first_pn, length, max_payload, &count)) goto done;
    const Py_ssize_t overhead = WX_HEADER_LEN + WX_DATA_FRAME_HEADER_LEN + (Py_ssize_t)p->tag_len;
    const Py_ssize_t stride = overhead + (Py_ssize_t)max_payload;
    /* Every datagram but the last is `stride` long; the last carries the rest. */
    Py_ssize_t total = count ? (Py_ssize_t)(count * overhead + length) : 0;
    if (count > PY_SSIZE_T_MAX / stride) {
        PyErr_SetString(PyExc_ValueError, "length: too many datagrams for one buffer");
        goto done;
    }
    out = PyByteArray_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    uint8_t *o = (uint8_t *)PyByteArray_AS_STRING(out);
    const uint8_t *src = (const uint8_t *)shard.buf + offset;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&p->lock);
    for (long long i = 0; i < count && !failed; i++) {
        uint8_t *d = o + i * stride;
        uint64_t chunk_off = (uint64_t)(i * max_payload);
        size_t chunk = (size_t)(length - (long long)chunk_off < max_payload
                                    ? length - (long long)chunk_off
                                    : max_payload);
        failed = wx_seal_data(p, d, (uint32_t)conn_id, (uint16_t)path_id, (uint64_t)first_pn + (uint64_t)i,
                              (int)key_phase, (uint32_t)shard_id, (uint64_t)offset + chunk_off,
                              src + chunk_off, chunk);
    }
    pthread_mutex_unlock(&p->lock);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to seal a datagram");
        goto done;
    }
    res = Py_BuildValue("(Onn)", out, stride, (Py_ssize_t)count);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&shard);
    return res;
}
