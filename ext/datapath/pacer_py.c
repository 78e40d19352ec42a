/*
 * The Pacer's Python type: argument parsing, validation with errors that name
 * the argument, and the GIL released around every call that may wait for the
 * release thread. The pacer itself (rings, pacing clock, release thread) is
 * plain C: pacer_ring.c and pacer_thread.c.
 */
#include "datapath.h"
#include "pacer.h"

#include <arpa/inet.h>
#include <errno.h>

typedef struct {
    PyObject_HEAD
    WxPacer *pc; /* NULL until __init__ succeeded */
} Pacer;

/* A data run as queued by enqueue_data: the pacer's record and what keeps the
 * memory it reads alive (the shard's buffer, the key) until its last datagram left. */
typedef struct {
    WxDataRun run; /* first: the pacer hands back a WxDataRun *, which is this */
    Py_buffer view;
    PyObject *protector;
} QueuedRun;

static void release_run(QueuedRun *q) {
    PyBuffer_Release(&q->view);
    Py_XDECREF(q->protector);
    PyMem_RawFree(q);
}

/* Release runs the pacer handed back (a chain through next). Needs the GIL. */
static void release_runs(WxDataRun *run) {
    while (run != NULL) {
        WxDataRun *next = run->next;
        release_run((QueuedRun *)run);
        run = next;
    }
}

/* Every call from Python releases the runs that finished since the last one, so a
 * shard's buffer is held at most until the pacer is next used after its last
 * datagram left (the release thread cannot take the GIL without stalling). */
static void release_done(Pacer *self) {
    if (self->pc != NULL) release_runs(wx_pacer_take_done(self->pc));
}

/* Stop the release thread, then release every run still queued or done. */
static void stop_and_release(Pacer *self) {
    Py_BEGIN_ALLOW_THREADS
    wx_pacer_stop(self->pc);
    Py_END_ALLOW_THREADS
    release_runs(wx_pacer_take_all(self->pc));
}

/* WxPacerConfig.seal: datagrams first .. first + n - 1 of a run, under its key's lock
 * (taken once per run and round, not per datagram). Runs in the release thread. */
static int seal_run(const WxDataRun *run, size_t first, size_t n, uint8_t *out, size_t stride) {
    WxProtector *p = run->key;
    int rc = 0;
    pthread_mutex_lock(&p->lock);
    for (size_t i = first; i < first + n && rc == 0; i++, out += stride) {
        uint64_t off = (uint64_t)i * run->segment;
        /* The next datagram's plaintext, while this one is sealed: a shard read once, and the
         * seal stalled on its loads (0.40 CPU-s/GB against the AEAD limit's 0.31; with the
         * hint the release thread went 0.61-0.63 -> 0.53-0.56 CPU-s/GB). */
        if (i + 1 < first + n) wx_prefetch(run->data + off + run->segment, wx_run_chunk(run, i + 1), 0);
        rc = wx_seal_data(p, out, run->conn_id, run->path_id, run->first_pn + i, run->key_phase,
                          run->shard_id, run->offset + off, run->data + off, wx_run_chunk(run, i));
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

static PyObject *Pacer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    return type->tp_alloc(type, 0);
}

static int Pacer_init(Pacer *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"n_paths", "capacity", "slot_size", "max_batch", "gso",
                             "gso_segments", "spin_ns", "burst_ns", NULL};
    PyObject *o_paths, *o_cap = NULL, *o_slot = NULL, *o_batch = NULL, *o_seg = NULL,
                       *o_spin = NULL, *o_burst = NULL;
    int gso = 1;
    long long n_paths, capacity = 4096, slot_size = 2048, max_batch = 64, gso_segments = 64,
                       spin_ns = 20000, burst_ns = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOOpOOO:Pacer", kwlist, &o_paths, &o_cap,
                                     &o_slot, &o_batch, &gso, &o_seg, &o_spin, &o_burst))
        return -1;
    if (wx_int_in_range(o_paths, "n_paths", 1, 65536, &n_paths) ||
        (o_cap && wx_int_in_range(o_cap, "capacity", 1, 1 << 20, &capacity)) ||
        (o_slot && wx_int_in_range(o_slot, "slot_size", 1, 65535, &slot_size)) ||
        (o_batch && wx_int_in_range(o_batch, "max_batch", 1, 1024, &max_batch)) ||
        (o_seg && wx_int_in_range(o_seg, "gso_segments", 1, 64, &gso_segments)) ||
        (o_spin && wx_int_in_range(o_spin, "spin_ns", 0, 10000000, &spin_ns)) ||
        (o_burst && wx_int_in_range(o_burst, "burst_ns", 0, 1000000000, &burst_ns)))
        return -1;
    if (self->pc != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Pacer is already initialised");
        return -1;
    }
    if ((unsigned long long)n_paths * capacity * slot_size > (1ULL << 34)) {
        PyErr_SetString(PyExc_ValueError,
                        "capacity: n_paths * capacity * slot_size exceeds 16 GiB of rings");
        return -1;
    }
    WxPacerConfig cfg = {
        .n_paths = (int)n_paths,
        .max_batch = (int)max_batch,
        .gso = gso,
        .gso_segments = (int)gso_segments,
        .capacity = (size_t)capacity,
        .slot_size = (size_t)slot_size,
        .spin_ns = spin_ns,
        .burst_ns = burst_ns,
        .seal = seal_run,
    };
    int err = 0;
    self->pc = wx_pacer_create(&cfg, &err);
    if (self->pc == NULL) {
        if (err == ENOMEM) {
            PyErr_NoMemory();
        } else {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        }
        return -1;
    }
    return 0;
}

static void Pacer_dealloc(Pacer *self) {
    if (self->pc != NULL) {
        stop_and_release(self);
        Py_BEGIN_ALLOW_THREADS
        wx_pacer_destroy(self->pc);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_running(Pacer *self) {
    if (self->pc == NULL || !self->pc->started) {
        PyErr_SetString(PyExc_RuntimeError, "Pacer is closed");
        return -1;
    }
    return 0;
}

static int path_arg(Pacer *self, PyObject *o, long long *path) {
    if (check_running(self)) return -1;
    return wx_int_in_range(o, "path_id", 0, self->pc->n_paths - 1, path);
}

static int parse_dest(PyObject *o, struct sockaddr_storage *ss, socklen_t *len) {
    const char *host;
    int port;
    if (!PyTuple_Check(o)) {
        PyErr_Format(PyExc_TypeError, "dest: expected a (host, port) tuple, got %.100s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (!PyArg_ParseTuple(o, "si;dest: expected a (host, port) tuple", &host, &port)) return -1;
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "dest: port %d is out of range [0, 65535]", port);
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *len = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *len = sizeof *a6;
    } else {
        PyErr_Format(PyExc_ValueError, "dest: %s is not a numeric IPv4 or IPv6 address", host);
        return -1;
    }
    return 0;
}

static PyObject *Pacer_set_path(Pacer *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path_id", "fd", "dest", NULL};
    PyObject *o_path, *o_fd, *o_dest = Py_None;
    long long path;
    struct sockaddr_storage ss;
    socklen_t ss_len = 0;
    int fd = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:set_path", kwlist, &o_path, &o_fd,
                                     &o_dest))
        return NULL;
    if (path_arg(self, o_path, &path)) return NULL;
    if (o_fd != Py_None) {
        fd = PyObject_AsFileDescriptor(o_fd);
        if (fd < 0) return NULL;
        int type = 0;
        socklen_t tl = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        if (type != SOCK_DGRAM) {
            PyErr_SetString(PyExc_ValueError, "fd: not a UDP (SOCK_DGRAM) socket");
            return NULL;
        }
    }
    if (o_dest != Py_None && parse_dest(o_dest, &ss, &ss_len)) return NULL;
    wx_pacer_set_path(self->pc, (int)path, fd, &ss, ss_len);
    Py_RETURN_NONE;
}

static PyObject *set_pacing(Pacer *self, PyObject *args, const char *fmt, int is_pps) {
    PyObject *o_path;
    double v;
    long long path;
    if (!PyArg_ParseTuple(args, fmt, &o_path, &v)) return NULL;
    if (path_arg(self, o_path, &path)) return NULL;
    if (!(v >= 0) || v > 1e15) {
        PyErr_Format(PyExc_ValueError, "%s: %R must be >= 0 (0 = unpaced)",
                     is_pps ? "pps" : "rate_bytes_per_s", PyTuple_GET_ITEM(args, 1));
        return NULL;
    }
    wx_pacer_set_pacing(self->pc, (int)path, v, is_pps);
    Py_RETURN_NONE;
}

static PyObject *Pacer_set_rate(Pacer *self, PyObject *args) {
    return set_pacing(self, args, "Od:set_rate", 0);
}

static PyObject *Pacer_set_pps(Pacer *self, PyObject *args) {
    return set_pacing(self, args, "Od:set_pps", 1);
}

static PyObject *Pacer_enqueue(Pacer *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path_id", "buffer", "stride", "lengths", "not_before_ns", NULL};
    PyObject *o_path, *o_stride = NULL, *o_lens = Py_None, *o_nb = NULL;
    Py_buffer buf = {0};
    long long path, stride = 0, not_before = 0;
    size_t *lens = NULL;
    PyObject *res = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oy*|OOO:enqueue", kwlist, &o_path, &buf,
                                     &o_stride, &o_lens, &o_nb))
        return NULL;
    if (o_stride == Py_None) o_stride = NULL;
    release_done(self);
    if (path_arg(self, o_path, &path) ||
        (o_stride && wx_int_in_range(o_stride, "stride", 1, 65535, &stride)) ||
        (o_nb && wx_int_in_range(o_nb, "not_before_ns", 0, INT64_MAX, &not_before)))
        goto done;
    if ((stride > 0) == (o_lens != Py_None)) {
        PyErr_SetString(PyExc_TypeError, "enqueue: give exactly one of stride or lengths");
        goto done;
    }
    Py_ssize_t n;
    if (stride > 0) {
        n = (buf.len + stride - 1) / stride;
        lens = PyMem_Malloc((n ? n : 1) * sizeof(size_t));
        if (lens == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            lens[i] = (size_t)(buf.len - i * stride < stride ? buf.len - i * stride : stride);
    } else {
        PyObject *seq = PySequence_Fast(o_lens, "lengths: expected a sequence of ints");
        if (seq == NULL) goto done;
        n = PySequence_Fast_GET_SIZE(seq);
        lens = PyMem_Malloc((n ? n : 1) * sizeof(size_t));
        Py_ssize_t sum = 0;
        for (Py_ssize_t i = 0; lens && i < n; i++) {
            long long v;
            if (wx_int_in_range(PySequence_Fast_GET_ITEM(seq, i), "lengths[i]", 1, 65535, &v)) {
                Py_DECREF(seq);
                goto done;
            }
            lens[i] = (size_t)v;
            sum += (Py_ssize_t)v;
        }
        Py_DECREF(seq);
        if (lens == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (sum > buf.len) {
            PyErr_Format(PyExc_ValueError, "lengths: sum %zd exceeds the %zd-byte buffer", sum,
                         buf.len);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (lens[i] > self->pc->slot_size) {
            PyErr_Format(PyExc_ValueError, "datagram %zd: %zu bytes exceeds slot_size %zu", i,
                         lens[i], self->pc->slot_size);
            goto done;
        }
    }
    size_t accepted;
    Py_BEGIN_ALLOW_THREADS
    accepted = wx_pacer_enqueue(self->pc, (int)path, buf.buf, lens, (size_t)n, not_before);
    Py_END_ALLOW_THREADS
    res = PyLong_FromSize_t(accepted);
done:
    PyMem_Free(lens);
    PyBuffer_Release(&buf);
    return res;
}

/* enqueue_data(...): queue a data plan as one data run, unsealed: the release thread
 * seals each datagram into its own scratch just before sending it (pacer.h). Returns
 * how many datagrams fit (a prefix): the caller re-offers the rest, from first_pn +
 * accepted. Until the run's last datagram left, the pacer holds the shard's buffer
 * and the key; the buffer must not change meanwhile (it is what gets sent). */
static PyObject *Pacer_enqueue_data(Pacer *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path_id", "protector", "conn_id", "first_pn", "key_phase",
                             "shard_id", "shard_buffer", "offset", "length", "max_payload",
                             "not_before_ns", NULL};
    PyObject *o_path, *pobj, *o_conn, *o_pn, *o_phase, *o_shard, *o_buf, *o_off, *o_len, *o_max,
        *o_nb;
    long long path, conn_id, first_pn, key_phase, shard_id, offset, length, max_payload, nb;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOO:enqueue_data", kwlist, &o_path,
                                     &pobj, &o_conn, &o_pn, &o_phase, &o_shard, &o_buf, &o_off,
                                     &o_len, &o_max, &o_nb))
        return NULL;
    if (path_arg(self, o_path, &path)) return NULL;
    release_done(self);
    WxProtector *p = wx_as_protector(pobj, "protector");
    if (p == NULL) return NULL;
    QueuedRun *q = PyMem_RawCalloc(1, sizeof *q);
    if (q == NULL) return PyErr_NoMemory();
    if (PyObject_GetBuffer(o_buf, &q->view, PyBUF_SIMPLE) != 0) {
        PyMem_RawFree(q);
        return NULL;
    }
    const size_t overhead = WX_HEADER_LEN + WX_DATA_FRAME_HEADER_LEN + p->tag_len;
    long long max_limit = (long long)self->pc->slot_size - (long long)overhead;
    if (max_limit > 0xFFFF) max_limit = 0xFFFF;
    long long count;
    if (max_limit < 1) {
        PyErr_Format(PyExc_ValueError, "slot_size %zu cannot hold a DATA datagram",
                     self->pc->slot_size);
        goto fail;
    }
    Py_ssize_t size = q->view.len;
    if (wx_int_in_range(o_conn, "conn_id", 0, 0xFFFFFFFFLL, &conn_id) ||
        wx_int_in_range(o_pn, "first_pn", 0, (long long)WX_MAX_PN, &first_pn) ||
        wx_int_in_range(o_phase, "key_phase", 0, 1, &key_phase) ||
        wx_int_in_range(o_shard, "shard_id", 0, 0xFFFFFFFFLL, &shard_id) ||
        wx_int_in_range(o_off, "offset", 0, (long long)size, &offset) ||
        wx_int_in_range(o_len, "length", 0, (long long)size - offset, &length) ||
        wx_int_in_range(o_max, "max_payload", 1, max_limit, &max_payload) ||
        wx_int_in_range(o_nb, "not_before_ns", 0, INT64_MAX, &nb) ||
        wx_data_run_count(first_pn, length, max_payload, &count))
        goto fail;
    q->run = (WxDataRun){.data = (const uint8_t *)q->view.buf + offset,
                         .offset = (uint64_t)offset,
                         .first_pn = (uint64_t)first_pn,
                         .conn_id = (uint32_t)conn_id,
                         .shard_id = (uint32_t)shard_id,
                         .segment = (uint32_t)max_payload,
                         .path_id = (uint16_t)path,
                         .key_phase = (uint8_t)key_phase,
                         .key = p};
    q->protector = Py_NewRef(pobj);
    WxPacer *pc = self->pc;
    size_t accepted;
    Py_BEGIN_ALLOW_THREADS
    WxReserve r = wx_pacer_reserve(pc, (int)path);
    WxRing *ring = &pc->paths[path].ring;
    size_t n = (size_t)count < r.room ? (size_t)count : r.room;
    uint64_t total = (uint64_t)n * (uint64_t)max_payload;
    q->run.length = total < (uint64_t)length ? total : (uint64_t)length;
    for (size_t i = 0; i < n; i++) {
        size_t idx = (r.tail + i) % ring->capacity;
        ring->lens[idx] = (uint32_t)(overhead + wx_run_chunk(&q->run, i));
        ring->not_before[idx] = nb;
        ring->run[idx] = &q->run;
        ring->sub[idx] = (uint32_t)i;
    }
    wx_pacer_commit(pc, (int)path, n, 0, &q->run);
    accepted = n;
    Py_END_ALLOW_THREADS
    if (accepted == 0) release_run(q); /* nothing queued: the run stayed ours */
    return PyLong_FromSize_t(accepted);
fail:
    release_run(q);
    return NULL;
}

static PyObject *Pacer_wait_idle(Pacer *self, PyObject *args) {
    double timeout_s;
    int idle;
    if (!PyArg_ParseTuple(args, "d:wait_idle", &timeout_s)) return NULL;
    if (check_running(self)) return NULL;
    if (!(timeout_s >= 0) || timeout_s > 1e6) {
        PyErr_SetString(PyExc_ValueError, "timeout_s: must be between 0 and 1e6 seconds");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    idle = wx_pacer_wait_idle(self->pc, (int64_t)(timeout_s * 1e9));
    Py_END_ALLOW_THREADS
    release_done(self);
    return PyBool_FromLong(idle);
}

static PyObject *Pacer_stats(Pacer *self, PyObject *unused) {
    if (self->pc == NULL) return PyList_New(0);
    release_done(self);
    int n = self->pc->n_paths;
    WxPathStats *st = PyMem_Malloc((size_t)n * sizeof(WxPathStats));
    PyObject *list = st ? PyList_New(n) : PyErr_NoMemory();
    if (list == NULL) {
        PyMem_Free(st);
        return NULL;
    }
    wx_pacer_stats(self->pc, st);
    for (int i = 0; i < n; i++) {
        const WxPathStats *p = &st[i];
        PyObject *d = Py_BuildValue(
            "{sKsKsKsnsKsKsO}", "sent_datagrams", (unsigned long long)p->sent_datagrams,
            "sent_bytes", (unsigned long long)p->sent_bytes, "send_errors",
            (unsigned long long)p->send_errors, "queue_depth", (Py_ssize_t)p->queue_depth,
            "gso_sends", (unsigned long long)p->gso_sends, "eagain",
            (unsigned long long)p->eagain, "gso", p->gso ? Py_True : Py_False);
        if (d == NULL) {
            PyMem_Free(st);
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, d);
    }
    PyMem_Free(st);
    return list;
}

static PyObject *Pacer_make_resident(Pacer *self, PyObject *unused) {
    if (self->pc != NULL) {
        Py_BEGIN_ALLOW_THREADS
        wx_pacer_make_resident(self->pc);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Pacer_thread_stats(Pacer *self, PyObject *unused) {
    WxPacerThreadStats st = {0};
    if (self->pc != NULL) st = wx_pacer_thread_stats(self->pc);
    return Py_BuildValue("{sdsKsK}", "cpu_s", st.cpu_s, "sleeps", (unsigned long long)st.sleeps,
                         "send_rounds", (unsigned long long)st.send_rounds);
}

static PyObject *Pacer_close(Pacer *self, PyObject *unused) {
    if (self->pc != NULL) stop_and_release(self);
    Py_RETURN_NONE;
}

static PyObject *Pacer_get_name(Pacer *self, void *closure) {
    int gso = self->pc != NULL && self->pc->gso_wanted;
    return PyUnicode_FromString(gso ? "c-pthread-sendmmsg+gso" : "c-pthread-sendmmsg");
}

static PyObject *Pacer_get_closed(Pacer *self, void *closure) {
    return PyBool_FromLong(self->pc == NULL || !self->pc->started);
}

static PyMethodDef Pacer_methods[] = {
    {"set_path", (PyCFunction)(void (*)(void))Pacer_set_path, METH_VARARGS | METH_KEYWORDS,
     "set_path(path_id, fd, dest=None): the UDP socket (and destination if unconnected)."},
    {"set_rate", (PyCFunction)Pacer_set_rate, METH_VARARGS,
     "set_rate(path_id, rate_bytes_per_s): pace by bytes; 0 = unpaced."},
    {"set_pps", (PyCFunction)Pacer_set_pps, METH_VARARGS,
     "set_pps(path_id, pps): pace at a fixed packets-per-second target; 0 = unpaced."},
    {"enqueue", (PyCFunction)(void (*)(void))Pacer_enqueue, METH_VARARGS | METH_KEYWORDS,
     "enqueue(path_id, buffer, stride=None, lengths=None, not_before_ns=0) -> accepted."},
    {"enqueue_data", (PyCFunction)(void (*)(void))Pacer_enqueue_data, METH_VARARGS | METH_KEYWORDS,
     "enqueue_data(path_id, protector, conn_id, first_pn, key_phase, shard_id, shard_buffer, "
     "offset, length, max_payload, not_before_ns) -> datagrams queued, sealed as they leave "
     "(a prefix)."},
    {"wait_idle", (PyCFunction)Pacer_wait_idle, METH_VARARGS,
     "wait_idle(timeout_s) -> bool: block until every queue is empty."},
    {"stats", (PyCFunction)Pacer_stats, METH_NOARGS, "stats() -> list of per-path counters."},
    {"make_resident", (PyCFunction)Pacer_make_resident, METH_NOARGS,
     "make_resident(): fault in every path's whole ring now (contents kept)."},
    {"thread_stats", (PyCFunction)Pacer_thread_stats, METH_NOARGS,
     "thread_stats() -> {cpu_s, sleeps, send_rounds} of the release thread (CPU at exit once closed)."},
    {"close", (PyCFunction)Pacer_close, METH_NOARGS, "close(): stop and join the thread."},
    {NULL},
};

static PyGetSetDef Pacer_getset[] = {
    {"name", (getter)Pacer_get_name, NULL, "implementation name", NULL},
    {"closed", (getter)Pacer_get_closed, NULL, "True once close() ran", NULL},
    {NULL},
};

PyTypeObject WxPacer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wanxport._native.Pacer",
    .tp_basicsize = sizeof(Pacer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pacer(n_paths, ...): timed sender thread with per-path FIFO rings.",
    .tp_new = Pacer_new,
    .tp_init = (initproc)Pacer_init,
    .tp_dealloc = (destructor)Pacer_dealloc,
    .tp_methods = Pacer_methods,
    .tp_getset = Pacer_getset,
};
