/*
 * Receiver: open, validate, replay-check and place a batch of datagrams.
 *
 * This is the receive half of the data path that runs without Python per
 * datagram: a DATA datagram for a registered shard is copied straight to its
 * absolute offset (no reorder buffer) and its byte range merged into the
 * shard's received-ranges set. Everything else that authenticates goes back
 * to Python as plaintext. Nothing reaches a shard buffer, and no replay
 * state changes, unless the datagram authenticated.
 *
 * A path's socket is shared with its QUIC control channel, so the first byte
 * demultiplexes: QUIC always sets the fixed bit 0x40 (the control side never
 * greases it, RFC 9287), our marker has both top bits clear. QUIC-looking
 * datagrams are handed back untouched (counted as passed_quic, not rejected)
 * for aioquic; anything else that is not ours is rejected by reason.
 */
#include "datapath.h"
#include "replay.h"

enum {
    C_REJ_SHORT,
    C_REJ_MARKER,
    C_REJ_PATH,
    C_REJ_CONN,
    C_REJ_KEY,
    C_REJ_AUTH,
    C_REJ_REPLAY,
    C_REJ_FRAME,
    C_ACC_DATA,
    C_ACC_CONTROL,
    C_OPEN_PHASE0,
    C_OPEN_PHASE1,
    C_PASS_QUIC,
    C_COUNT,
};
static const char *counter_names[C_COUNT] = {
    "rejected_short",   "rejected_marker", "rejected_path", "rejected_conn",
    "rejected_key",     "rejected_auth",   "rejected_replay", "rejected_frame",
    "accepted_data",    "accepted_control", "opened_phase0", "opened_phase1",
    "passed_quic",
};

typedef struct {
    uint64_t start, end;
} Range;

typedef struct {
    uint32_t id;
    Py_buffer view;
    Range *ranges; /* sorted, disjoint, not touching */
    size_t n, cap;
    uint64_t received;
    uint64_t frozen; /* no writes below this offset: a reader may be hashing it */
} Shard;

typedef struct {
    PyObject_HEAD
    uint32_t conn_id;
    int n_paths;
    int busy; /* set (under the GIL) while process() runs without it */
    WxProtector *keys[2];
    WxReplay *replay;
    /* NULL: every path is this receiver's. Otherwise owned[path] says which are:
     * a data-path worker's receiver keeps its own replay windows, so it must
     * refuse another worker's paths or a datagram could be accepted twice. */
    uint8_t *owned;
    Shard **shards; /* sorted by id */
    size_t n_shards, cap_shards;
    uint64_t counters[C_COUNT];
} Receiver;

/* Merge [a, b) into the shard's ranges. Returns -1 only if out of memory.
 * Runs without the GIL, hence the raw allocator. */
static int ranges_add(Shard *s, uint64_t a, uint64_t b) {
    Range *r = s->ranges;
    size_t n = s->n;
    if (a >= b) return 0;
    if (n && r[n - 1].end == a) { /* in-order arrival: the common case */
        r[n - 1].end = b;
        s->received += b - a;
        return 0;
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r[mid].end < a) lo = mid + 1;
        else hi = mid;
    }
    size_t i = lo;
    if (i == n || r[i].start > b) {
        if (n == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 8;
            Range *nr = PyMem_RawRealloc(s->ranges, cap * sizeof(Range));
            if (nr == NULL) return -1;
            s->ranges = r = nr;
            s->cap = cap;
        }
        memmove(r + i + 1, r + i, (n - i) * sizeof(Range));
        r[i].start = a;
        r[i].end = b;
        s->n = n + 1;
        s->received += b - a;
        return 0;
    }
    uint64_t ns = r[i].start < a ? r[i].start : a, ne = b, covered = 0;
    size_t j = i;
    while (j < n && r[j].start <= b) {
        covered += r[j].end - r[j].start;
        if (r[j].end > ne) ne = r[j].end;
        j++;
    }
    s->received += (ne - ns) - covered;
    r[i].start = ns;
    r[i].end = ne;
    memmove(r + i + 1, r + j, (n - j) * sizeof(Range));
    s->n = n - (j - i - 1);
    return 0;
}

static Shard *find_shard(const Receiver *self, uint32_t id, size_t *pos) {
    size_t lo = 0, hi = self->n_shards;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (self->shards[mid]->id < id) lo = mid + 1;
        else hi = mid;
    }
    if (pos) *pos = lo;
    return lo < self->n_shards && self->shards[lo]->id == id ? self->shards[lo] : NULL;
}

static int check_idle(Receiver *self) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Receiver.process() or drain() is running in another thread");
        return -1;
    }
    return 0;
}

static int Receiver_init(Receiver *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"conn_id", "n_paths", NULL};
    PyObject *o_conn, *o_paths;
    long long conn_id, n_paths;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Receiver", kwlist, &o_conn, &o_paths))
        return -1;
    if (wx_int_in_range(o_conn, "conn_id", 0, 0xFFFFFFFFLL, &conn_id) ||
        wx_int_in_range(o_paths, "n_paths", 1, 65536, &n_paths))
        return -1;
    if (self->replay != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Receiver is already initialised");
        return -1;
    }
    self->replay = PyMem_Calloc((size_t)n_paths, sizeof(WxReplay));
    if (self->replay == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->conn_id = (uint32_t)conn_id;
    self->n_paths = (int)n_paths;
    return 0;
}

static void shard_free(Shard *s) {
    PyBuffer_Release(&s->view);
    PyMem_RawFree(s->ranges);
    PyMem_Free(s);
}

static void Receiver_dealloc(Receiver *self) {
    for (size_t i = 0; i < self->n_shards; i++) shard_free(self->shards[i]);
    PyMem_Free(self->shards);
    PyMem_Free(self->replay);
    PyMem_Free(self->owned);
    Py_XDECREF(self->keys[0]);
    Py_XDECREF(self->keys[1]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(Receiver *self) {
    if (self->replay == NULL) {
        PyErr_SetString(PyExc_ValueError, "Receiver was not initialised");
        return -1;
    }
    return check_idle(self);
}

static PyObject *Receiver_set_key(Receiver *self, PyObject *args) {
    PyObject *o_phase, *o_key;
    long long phase;
    if (!PyArg_ParseTuple(args, "OO:set_key", &o_phase, &o_key)) return NULL;
    if (ready(self) || wx_int_in_range(o_phase, "phase", 0, 1, &phase)) return NULL;
    WxProtector *key = NULL;
    if (o_key != Py_None) {
        key = wx_as_protector(o_key, "protector");
        if (key == NULL) return NULL;
        Py_INCREF(key);
    }
    Py_XSETREF(self->keys[phase], key);
    Py_RETURN_NONE;
}

static PyObject *Receiver_own_paths(Receiver *self, PyObject *arg) {
    if (ready(self)) return NULL;
    PyObject *seq = PySequence_Fast(arg, "path_ids must be a sequence of ints");
    if (seq == NULL) return NULL;
    uint8_t *owned = PyMem_Calloc((size_t)self->n_paths, 1);
    if (owned == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long long path;
        if (wx_int_in_range(PySequence_Fast_GET_ITEM(seq, i), "path_id", 0, self->n_paths - 1,
                            &path)) {
            PyMem_Free(owned);
            Py_DECREF(seq);
            return NULL;
        }
        owned[path] = 1;
    }
    Py_DECREF(seq);
    PyMem_Free(self->owned);
    self->owned = owned;
    Py_RETURN_NONE;
}

static PyObject *Receiver_add_shard(Receiver *self, PyObject *args) {
    PyObject *o_id, *o_buf;
    long long id;
    size_t pos;
    if (!PyArg_ParseTuple(args, "OO:add_shard", &o_id, &o_buf)) return NULL;
    if (ready(self) || wx_int_in_range(o_id, "shard_id", 0, 0xFFFFFFFFLL, &id)) return NULL;
    if (find_shard(self, (uint32_t)id, &pos)) {
        PyErr_Format(PyExc_ValueError, "shard_id: %lld is already registered", id);
        return NULL;
    }
    Shard *s = PyMem_Calloc(1, sizeof(Shard));
    if (s == NULL) return PyErr_NoMemory();
    if (PyObject_GetBuffer(o_buf, &s->view, PyBUF_WRITABLE) != 0) {
        PyMem_Free(s);
        return NULL;
    }
    s->id = (uint32_t)id;
    if (self->n_shards == self->cap_shards) {
        size_t cap = self->cap_shards ? self->cap_shards * 2 : 8;
        Shard **ns = PyMem_Realloc(self->shards, cap * sizeof(Shard *));
        if (ns == NULL) {
            shard_free(s);
            return PyErr_NoMemory();
        }
        self->shards = ns;
        self->cap_shards = cap;
    }
    memmove(self->shards + pos + 1, self->shards + pos, (self->n_shards - pos) * sizeof(Shard *));
    self->shards[pos] = s;
    self->n_shards++;
    Py_RETURN_NONE;
}

static Shard *shard_arg(Receiver *self, PyObject *o_id, size_t *pos) {
    long long id;
    if (wx_int_in_range(o_id, "shard_id", 0, 0xFFFFFFFFLL, &id)) return NULL;
    Shard *s = find_shard(self, (uint32_t)id, pos);
    if (s == NULL) PyErr_Format(PyExc_KeyError, "shard_id %lld is not registered", id);
    return s;
}

static PyObject *Receiver_remove_shard(Receiver *self, PyObject *o_id) {
    size_t pos;
    if (ready(self)) return NULL;
    Shard *s = shard_arg(self, o_id, &pos);
    if (s == NULL) return NULL;
    memmove(self->shards + pos, self->shards + pos + 1,
            (self->n_shards - pos - 1) * sizeof(Shard *));
    self->n_shards--;
    shard_free(s);
    Py_RETURN_NONE;
}

static PyObject *Receiver_ranges(Receiver *self, PyObject *o_id) {
    if (ready(self)) return NULL;
    Shard *s = shard_arg(self, o_id, NULL);
    if (s == NULL) return NULL;
    PyObject *list = PyList_New((Py_ssize_t)s->n);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < s->n; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)s->ranges[i].start,
                                    (unsigned long long)s->ranges[i].end);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

/* freeze(shard_id, upto): never write below ``upto`` again (a duplicate there
 * is acknowledged but not copied). The caller freezes bytes it knows are all
 * in, so another thread may hash them while the rest of the shard arrives and
 * the verdict covers exactly the bytes the buffer keeps. Only ever rises. */
static PyObject *Receiver_freeze(Receiver *self, PyObject *args) {
    PyObject *o_id, *o_upto;
    long long upto;
    if (!PyArg_ParseTuple(args, "OO:freeze", &o_id, &o_upto)) return NULL;
    if (ready(self)) return NULL;
    Shard *s = shard_arg(self, o_id, NULL);
    if (s == NULL || wx_int_in_range(o_upto, "upto", 0, (long long)s->view.len, &upto)) return NULL;
    if ((uint64_t)upto > s->frozen) s->frozen = (uint64_t)upto;
    Py_RETURN_NONE;
}

static PyObject *Receiver_received_bytes(Receiver *self, PyObject *o_id) {
    if (ready(self)) return NULL;
    Shard *s = shard_arg(self, o_id, NULL);
    return s ? PyLong_FromUnsignedLongLong(s->received) : NULL;
}

static PyObject *Receiver_is_complete(Receiver *self, PyObject *o_id) {
    if (ready(self)) return NULL;
    Shard *s = shard_arg(self, o_id, NULL);
    return s ? PyBool_FromLong(s->received == (uint64_t)s->view.len) : NULL;
}

static PyObject *Receiver_highest_pn(Receiver *self, PyObject *o_path) {
    long long path;
    if (ready(self) || wx_int_in_range(o_path, "path_id", 0, self->n_paths - 1, &path))
        return NULL;
    const WxReplay *r = &self->replay[path];
    if (!r->has_hi) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(r->hi);
}

static PyObject *Receiver_get_counters(Receiver *self, void *closure) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (int i = 0; i < C_COUNT; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(self->counters[i]);
        if (v == NULL || PyDict_SetItemString(d, counter_names[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

/* Ask for the destination lines the next datagram of this run will most likely fill
 * (a run's datagrams carry consecutive ranges) while that datagram is being opened.
 * A shard is too large to stay in cache, so without it each copy into the shard
 * waits for its lines to be read from memory, and the next locked instruction waits
 * for those stores to drain. */
static inline __attribute__((always_inline)) void prefetch_next(const Shard *s, uint64_t from, uint64_t len) {
    uint64_t size = (uint64_t)s->view.len;
    if (from >= size) return;
    wx_prefetch((const uint8_t *)s->view.buf + from, (size_t)(from + len < size ? len : size - from), 1);
}

/* A control datagram found during the GIL-free loop; turned into a Python
 * tuple afterwards. */
typedef struct {
    uint64_t pn;
    int64_t rx_time_ns;
    size_t pt_offset, pt_len;
    uint16_t path_id;
} Control;

/* The per-datagram pipeline, in the order of the reference
 * (wanxport/wire/datapath.py PacketOpener): header checks, replay check
 * (cheap, before any crypto), open, then placement. The replay window
 * records the pn only once the datagram authenticated and was accepted.
 * Returns 1 if a record was written, 2 if a control entry was written,
 * 3 if the datagram looks like QUIC (handed back to Python), 0 if the
 * datagram was dropped (and counted). */
static int process_one(Receiver *self, const uint8_t *d, size_t len, int64_t rx,
                       uint8_t *scratch, WxRecord *rec, Control *ctl) {
    if (len > 0 && (d[0] & WX_QUIC_FIXED_BIT)) {
        self->counters[C_PASS_QUIC]++;
        return 3;
    }
    if (len < WX_HEADER_LEN || len > WX_MAX_UDP_PAYLOAD) {
        self->counters[C_REJ_SHORT]++;
        return 0;
    }
    uint64_t pn = wx_get_u64(d + 8);
    if (d[0] != WX_MARKER || (d[1] & ~WX_FLAG_KEY_PHASE) != 0 || pn > WX_MAX_PN) {
        self->counters[C_REJ_MARKER]++;
        return 0;
    }
    if (wx_get_u32(d + 4) != self->conn_id) {
        self->counters[C_REJ_CONN]++;
        return 0;
    }
    uint16_t path = wx_get_u16(d + 2);
    if (path >= self->n_paths || (self->owned != NULL && !self->owned[path])) {
        self->counters[C_REJ_PATH]++;
        return 0;
    }
    int phase = d[1] & WX_FLAG_KEY_PHASE;
    WxProtector *key = self->keys[phase];
    if (key == NULL) {
        self->counters[C_REJ_KEY]++;
        return 0;
    }
    if (len < WX_HEADER_LEN + key->tag_len) {
        self->counters[C_REJ_SHORT]++;
        return 0;
    }
    WxReplay *rp = &self->replay[path];
    if (!wx_replay_fresh(rp, pn)) {
        self->counters[C_REJ_REPLAY]++;
        return 0;
    }
    size_t pt_len = len - WX_HEADER_LEN - key->tag_len;
    pthread_mutex_lock(&key->lock);
    int rc = wx_open(key, d, d + WX_HEADER_LEN, len - WX_HEADER_LEN, scratch);
    pthread_mutex_unlock(&key->lock);
    if (rc != 0) {
        self->counters[C_REJ_AUTH]++;
        return 0;
    }
    self->counters[phase ? C_OPEN_PHASE1 : C_OPEN_PHASE0]++;
    if (pt_len >= WX_DATA_FRAME_HEADER_LEN && scratch[0] == WX_FRAME_DATA) {
        uint32_t shard_id = wx_get_u32(scratch + 1);
        uint64_t off = wx_get_u64(scratch + 5);
        uint16_t dlen = wx_get_u16(scratch + 13);
        if (WX_DATA_FRAME_HEADER_LEN + (size_t)dlen > pt_len || off > WX_MAX_OFFSET ||
            dlen > WX_MAX_OFFSET - off) {
            self->counters[C_REJ_FRAME]++; /* runs past the payload or past 2^62 */
            return 0;
        }
        Shard *s = WX_DATA_FRAME_HEADER_LEN + (size_t)dlen == pt_len
                       ? find_shard(self, shard_id, NULL)
                       : NULL;
        if (s != NULL) {
            if (off > (uint64_t)s->view.len || dlen > (uint64_t)s->view.len - off ||
                ranges_add(s, off, off + dlen) != 0) {
                self->counters[C_REJ_FRAME]++;
                return 0;
            }
            wx_replay_mark(rp, pn);
            if (off + dlen > s->frozen) { /* below it: a duplicate of bytes already hashed */
                uint64_t skip = off < s->frozen ? s->frozen - off : 0;
                memcpy((uint8_t *)s->view.buf + off + skip,
                       scratch + WX_DATA_FRAME_HEADER_LEN + skip, dlen - skip);
            }
            prefetch_next(s, off + dlen, dlen);
            rec->pn = pn;
            rec->offset = off;
            rec->rx_time_ns = rx;
            rec->shard_id = shard_id;
            rec->path_id = path;
            rec->length = dlen;
            self->counters[C_ACC_DATA]++;
            return 1;
        }
    }
    wx_replay_mark(rp, pn);
    ctl->pn = pn;
    ctl->rx_time_ns = rx;
    ctl->pt_len = pt_len;
    ctl->path_id = path;
    self->counters[C_ACC_CONTROL]++;
    return 2;
}

/* Every datagram of a batch through process_one, without the GIL (the caller holds the
 * receiver busy): placed DATA records into rec, control entries into ctl with their
 * plaintexts in scratch (at most the batch's bytes), QUIC-looking datagrams' indices
 * into quic_idx; the three counts into counts[0..2]. */
static void process_batch(Receiver *self, const uint8_t *base, const WxDesc *dv, Py_ssize_t n,
                          uint8_t *scratch, WxRecord *rec, Control *ctl, Py_ssize_t *quic_idx,
                          Py_ssize_t counts[3]) {
    Py_ssize_t n_rec = 0, n_ctl = 0, n_quic = 0;
    size_t scratch_off = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Control *c = &ctl[n_ctl];
        int r = process_one(self, base + dv[i].offset, (size_t)dv[i].length, dv[i].rx_time_ns,
                            scratch + scratch_off, &rec[n_rec], c);
        if (r == 1) {
            n_rec++;
        } else if (r == 2) {
            c->pt_offset = scratch_off;
            scratch_off += c->pt_len;
            n_ctl++;
        } else if (r == 3) {
            quic_idx[n_quic++] = i;
        }
    }
    counts[0] = n_rec;
    counts[1] = n_ctl;
    counts[2] = n_quic;
}

/* Fold placed records into runs: consecutive records on the same path with
 * consecutive packet numbers, same shard and contiguous offsets. The session is
 * told once per run (Session.receive_data_run), so Python never loops per
 * datagram; doing this fold with numpy cost ~10 array calls per receive batch. */
static int fold_append(PyObject *out, const uint8_t *base, size_t n) {
    size_t i = 0;
    WxRecord first, prev, cur;
    while (i < n) {
        memcpy(&first, base + i * sizeof(WxRecord), sizeof first);
        prev = first;
        uint64_t total = first.length;
        size_t j = i + 1;
        for (; j < n; j++) {
            memcpy(&cur, base + j * sizeof(WxRecord), sizeof cur);
            if (cur.path_id != prev.path_id || cur.shard_id != prev.shard_id || cur.pn != prev.pn + 1 ||
                cur.offset != prev.offset + prev.length)
                break;
            total += cur.length;
            prev = cur;
        }
        PyObject *run = Py_BuildValue("(HKnIKK)", first.path_id, (unsigned long long)first.pn,
                                      (Py_ssize_t)(j - i), first.shard_id,
                                      (unsigned long long)first.offset, (unsigned long long)total);
        if (run == NULL || PyList_Append(out, run) != 0) {
            Py_XDECREF(run);
            return -1;
        }
        Py_DECREF(run);
        i = j;
    }
    return 0;
}

PyObject *wx_fold_runs(PyObject *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_C_CONTIGUOUS) != 0) return NULL;
    PyObject *out = NULL;
    if (buf.len % (Py_ssize_t)sizeof(WxRecord) != 0) {
        PyErr_Format(PyExc_ValueError, "records: %zd bytes is not a whole number of %zu-byte records",
                     buf.len, sizeof(WxRecord));
        goto done;
    }
    out = PyList_New(0);
    if (out != NULL && fold_append(out, buf.buf, (size_t)buf.len / sizeof(WxRecord)) != 0) Py_CLEAR(out);
done:
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *Receiver_process(Receiver *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"buffer", "descriptors", NULL};
    Py_buffer buf = {0}, desc = {0};
    PyObject *records = NULL, *controls = NULL, *quic = NULL, *res = NULL;
    uint8_t *scratch = NULL;
    Control *ctls = NULL;
    Py_ssize_t *quic_idx = NULL;
    WxDesc *dv = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*:process", kwlist, &buf, &desc))
        return NULL;
    if (ready(self)) goto done;
    if (desc.len % (Py_ssize_t)sizeof(WxDesc) != 0) {
        PyErr_Format(PyExc_ValueError, "descriptors: length %zd is not a multiple of %zu",
                     desc.len, sizeof(WxDesc));
        goto done;
    }
    Py_ssize_t n = desc.len / (Py_ssize_t)sizeof(WxDesc);
    dv = PyMem_Malloc((n ? n : 1) * sizeof(WxDesc));
    if (dv == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(dv, desc.buf, n * sizeof(WxDesc)); /* the source may be unaligned */
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (dv[i].offset < 0 || dv[i].length < 0 || dv[i].offset > buf.len ||
            dv[i].length > buf.len - dv[i].offset) {
            PyErr_Format(PyExc_ValueError,
                         "descriptors[%zd]: offset %lld length %lld outside the %zd-byte buffer",
                         i, (long long)dv[i].offset, (long long)dv[i].length, buf.len);
            goto done;
        }
        total += (size_t)dv[i].length;
    }
    records = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(WxRecord));
    scratch = PyMem_Malloc(total ? total : 1);
    ctls = PyMem_Malloc((n ? n : 1) * sizeof(Control));
    quic_idx = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t));
    if (records == NULL || scratch == NULL || ctls == NULL || quic_idx == NULL) {
        if (records != NULL) PyErr_NoMemory();
        goto done;
    }
    WxRecord *rec = (WxRecord *)PyBytes_AS_STRING(records);
    Py_ssize_t counts[3];
    self->busy = 1; /* keys and shards cannot change until the loop ends */
    Py_BEGIN_ALLOW_THREADS
    process_batch(self, buf.buf, dv, n, scratch, rec, ctls, quic_idx, counts);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    Py_ssize_t n_rec = counts[0], n_ctl = counts[1], n_quic = counts[2];
    if (_PyBytes_Resize(&records, n_rec * (Py_ssize_t)sizeof(WxRecord)) < 0) goto done;
    controls = PyList_New(n_ctl);
    if (controls == NULL) goto done;
    for (Py_ssize_t i = 0; i < n_ctl; i++) {
        PyObject *t = Py_BuildValue("(HKy#L)", ctls[i].path_id, (unsigned long long)ctls[i].pn,
                                    (const char *)scratch + ctls[i].pt_offset,
                                    (Py_ssize_t)ctls[i].pt_len, (long long)ctls[i].rx_time_ns);
        if (t == NULL) goto done;
        PyList_SET_ITEM(controls, i, t);
    }
    quic = PyList_New(n_quic);
    if (quic == NULL) goto done;
    for (Py_ssize_t i = 0; i < n_quic; i++) {
        const WxDesc *q = &dv[quic_idx[i]];
        PyObject *t = Py_BuildValue("(ny#)", quic_idx[i], (const char *)buf.buf + q->offset,
                                    (Py_ssize_t)q->length);
        if (t == NULL) goto done;
        PyList_SET_ITEM(quic, i, t);
    }
    res = PyTuple_Pack(3, records, controls, quic);
done:
    PyMem_Free(dv);
    PyMem_Free(quic_idx);
    Py_XDECREF(records);
    Py_XDECREF(controls);
    Py_XDECREF(quic);
    PyMem_Free(scratch);
    PyMem_Free(ctls);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&desc);
    return res;
}

/* Receiver.drain: read a socket's queue in recvmmsg batches and open, check and place
 * every datagram, in one call. What the event loop used to do per batch in Python
 * (wrap the batch, process it, fold its records, build control and QUIC entries,
 * look at the drop count) happens here, and Python is called once per drain. */
typedef struct {
    WxDesc *dv;
    int *msg_of;
    WxRecord *rec;
    Control *ctl;
    Py_ssize_t *quic_idx;
    uint8_t *scratch; /* plaintexts: at most a batch's bytes */
    Py_ssize_t cap;
    size_t scratch_cap;
} DrainSpace;

static void drain_space_free(DrainSpace *d) {
    PyMem_Free(d->dv);
    PyMem_Free(d->msg_of);
    PyMem_Free(d->rec);
    PyMem_Free(d->ctl);
    PyMem_Free(d->quic_idx);
    PyMem_Free(d->scratch);
}

/* Room for a batch of n datagrams of `bytes` in all; 0, or -1 with MemoryError. */
static int drain_space_fit(DrainSpace *d, Py_ssize_t n, size_t bytes) {
    if (bytes > d->scratch_cap) {
        uint8_t *scratch = PyMem_Realloc(d->scratch, bytes);
        if (scratch == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        d->scratch = scratch;
        d->scratch_cap = bytes;
    }
    if (n <= d->cap) return 0;
    Py_ssize_t cap = n > 2 * d->cap ? n : 2 * d->cap;
    WxDesc *dv = PyMem_Realloc(d->dv, cap * sizeof *dv);
    if (dv) d->dv = dv;
    int *msg_of = PyMem_Realloc(d->msg_of, cap * sizeof *msg_of);
    if (msg_of) d->msg_of = msg_of;
    WxRecord *rec = PyMem_Realloc(d->rec, cap * sizeof *rec);
    if (rec) d->rec = rec;
    Control *ctl = PyMem_Realloc(d->ctl, cap * sizeof *ctl);
    if (ctl) d->ctl = ctl;
    Py_ssize_t *quic_idx = PyMem_Realloc(d->quic_idx, cap * sizeof *quic_idx);
    if (quic_idx) d->quic_idx = quic_idx;
    if (!dv || !msg_of || !rec || !ctl || !quic_idx) {
        PyErr_NoMemory();
        return -1;
    }
    d->cap = cap;
    return 0;
}

static PyObject *Receiver_drain(Receiver *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"fd", "buffer", "max_messages", "max_batches", NULL};
    PyObject *o_fd, *o_msgs, *o_batches, *runs = NULL, *controls = NULL, *quic = NULL, *res = NULL;
    Py_buffer buf = {0};
    long long max_msgs, max_batches;
    int claimed = 0;
    WxRecv r = {0};
    DrainSpace sp = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Ow*OO:drain", kwlist, &o_fd, &buf, &o_msgs,
                                     &o_batches))
        return NULL;
    int fd = PyObject_AsFileDescriptor(o_fd);
    if (fd < 0 || ready(self) || wx_int_in_range(o_msgs, "max_messages", 1, WX_MAX_BATCH, &max_msgs) ||
        wx_int_in_range(o_batches, "max_batches", 1, 1 << 20, &max_batches) ||
        wx_recv_init(&r, buf.buf, buf.len, (int)max_msgs))
        goto done;
    /* Keys and shards cannot change, nor another drain or process() start, until it ends:
     * the GIL is released for every recvmmsg and every batch. */
    self->busy = claimed = 1;
    runs = PyList_New(0);
    controls = PyList_New(0);
    quic = PyList_New(0);
    if (runs == NULL || controls == NULL || quic == NULL) goto done;
    r.overflow = -1;
    Py_ssize_t placed = 0, truncated = 0, drained = 0;
    long long rx_ns = 0;
    int pressed = 1; /* unless the socket runs dry within max_batches */
    for (long long b = 0; b < max_batches; b++) {
        int got;
        Py_BEGIN_ALLOW_THREADS
        got = wx_recv_messages(&r, fd);
        Py_END_ALLOW_THREADS
        if (got == -ECONNREFUSED) continue; /* an ICMP error queued (peer not up yet): consumed */
        if (got < 0) {
            if (drained) break; /* hand over what was placed; the next drain meets the error */
            errno = -got;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        truncated += r.truncated;
        Py_ssize_t n = r.count;
        if (n == 0) {
            pressed = 0;
            break;
        }
        drained += n;
        size_t bytes = 0;
        for (int i = 0; i < r.got; i++) bytes += r.msgs[i].msg_len;
        if (drain_space_fit(&sp, n, bytes ? bytes : 1)) goto done;
        wx_recv_describe(&r, sp.dv, sp.msg_of);
        rx_ns = sp.dv[n - 1].rx_time_ns;
        Py_ssize_t counts[3];
        Py_BEGIN_ALLOW_THREADS
        process_batch(self, r.buf, sp.dv, n, sp.scratch, sp.rec, sp.ctl, sp.quic_idx, counts);
        Py_END_ALLOW_THREADS
        Py_ssize_t n_rec = counts[0], n_ctl = counts[1], n_quic = counts[2];
        placed += n_rec;
        if (fold_append(runs, (const uint8_t *)sp.rec, (size_t)n_rec)) goto done;
        for (Py_ssize_t i = 0; i < n_ctl; i++) {
            PyObject *t = Py_BuildValue("(HKy#)", sp.ctl[i].path_id, (unsigned long long)sp.ctl[i].pn,
                                        (const char *)sp.scratch + sp.ctl[i].pt_offset,
                                        (Py_ssize_t)sp.ctl[i].pt_len);
            if (t == NULL || PyList_Append(controls, t) != 0) {
                Py_XDECREF(t);
                goto done;
            }
            Py_DECREF(t);
        }
        for (Py_ssize_t i = 0; i < n_quic; i++) {
            const WxDesc *q = &sp.dv[sp.quic_idx[i]];
            PyObject *sender = wx_recv_sender(&r, sp.msg_of[sp.quic_idx[i]]);
            PyObject *t = sender ? Py_BuildValue("(y#N)", (const char *)r.buf + q->offset,
                                                 (Py_ssize_t)q->length, sender)
                                 : NULL;
            if (t == NULL || PyList_Append(quic, t) != 0) {
                Py_XDECREF(t);
                goto done;
            }
            Py_DECREF(t);
        }
        if (r.got < max_msgs) { /* recvmmsg returns short only when the queue ran dry */
            pressed = 0;
            break;
        }
    }
    res = Py_BuildValue("(OnOOiLnL)", runs, placed, controls, quic, pressed, rx_ns, truncated, r.overflow);
done:
    if (claimed) self->busy = 0;
    Py_XDECREF(runs);
    Py_XDECREF(controls);
    Py_XDECREF(quic);
    drain_space_free(&sp);
    wx_recv_free(&r);
    PyBuffer_Release(&buf);
    return res;
}

static PyObject *Receiver_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    return type->tp_alloc(type, 0);
}

static PyMethodDef Receiver_methods[] = {
    {"set_key", (PyCFunction)Receiver_set_key, METH_VARARGS,
     "set_key(phase, protector | None): the key that opens datagrams of key phase 0 or 1."},
    {"own_paths", (PyCFunction)Receiver_own_paths, METH_O,
     "own_paths(path_ids): accept only datagrams of these paths (rejected_path otherwise)."},
    {"add_shard", (PyCFunction)Receiver_add_shard, METH_VARARGS,
     "add_shard(shard_id, writable_buffer): DATA for this shard is placed into the buffer."},
    {"remove_shard", (PyCFunction)Receiver_remove_shard, METH_O,
     "remove_shard(shard_id): stop placing; releases the buffer."},
    {"ranges", (PyCFunction)Receiver_ranges, METH_O,
     "ranges(shard_id) -> list[(start, end)]: received byte ranges, sorted and merged."},
    {"freeze", (PyCFunction)Receiver_freeze, METH_VARARGS,
     "freeze(shard_id, upto): never write below upto again (duplicates are not copied), so "
     "those bytes can be hashed while the rest arrives."},
    {"received_bytes", (PyCFunction)Receiver_received_bytes, METH_O,
     "received_bytes(shard_id) -> int: distinct bytes received."},
    {"is_complete", (PyCFunction)Receiver_is_complete, METH_O,
     "is_complete(shard_id) -> bool: every byte of the buffer received."},
    {"highest_pn", (PyCFunction)Receiver_highest_pn, METH_O,
     "highest_pn(path_id) -> int | None: highest authenticated packet number."},
    {"drain", (PyCFunction)(void (*)(void))Receiver_drain, METH_VARARGS | METH_KEYWORDS,
     "drain(fd, buffer, max_messages, max_batches) -> (runs: list[(path_id, first_pn, count, "
     "shard_id, offset, length)], placed: int, controls: list[(path_id, pn, plaintext)], quic: "
     "list[(datagram, sender)], pressed: bool, newest_rx_ns: int, truncated: int, overflow: int): "
     "read the socket in batches of max_messages (buffer split into that many slots) until it "
     "runs dry or max_batches were read (pressed), and process each batch."},
    {"process", (PyCFunction)(void (*)(void))Receiver_process, METH_VARARGS | METH_KEYWORDS,
     "process(buffer, descriptors) -> (records: bytes, controls: list[(path_id, pn, "
     "plaintext, rx_time_ns)], quic: list[(descriptor index, datagram)])"},
    {NULL},
};

static PyGetSetDef Receiver_getset[] = {
    {"counters", (getter)Receiver_get_counters, NULL, "dict of drop/accept counters", NULL},
    {NULL},
};

PyTypeObject WxReceiver_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wanxport._native.Receiver",
    .tp_basicsize = sizeof(Receiver),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Receiver(conn_id, n_paths): opens, validates and places batches of datagrams.",
    .tp_new = Receiver_new,
    .tp_init = (initproc)Receiver_init,
    .tp_dealloc = (destructor)Receiver_dealloc,
    .tp_methods = Receiver_methods,
    .tp_getset = Receiver_getset,
};
