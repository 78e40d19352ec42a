/*
 * Pacer: a pthread that releases queued datagrams at their pacing times.
 *
 * Python timers cannot pace 100k+ datagrams/s, so the release loop runs in
 * its own thread that never touches the GIL. Each path has a bounded FIFO
 * ring (enqueue() returns how many datagrams fit: backpressure, never an
 * unbounded queue), a socket fd owned by Python, and a pacing rate (bytes/s)
 * or a fixed packets-per-second target. Due datagrams leave in batches via
 * sendmmsg; runs of equal-size datagrams become one UDP GSO send where the
 * kernel supports it (UDP_SEGMENT; disabled per path on EINVAL/EIO).
 *
 * This file is the Python type; the thread itself is pacer_thread.c. Sleeping
 * uses pthread_cond_timedwait on CLOCK_MONOTONIC with an absolute deadline
 * (the same hrtimer as clock_nanosleep(TIMER_ABSTIME), but enqueue() can
 * wake it when an earlier datagram arrives).
 */
#include "pacer.h"

#include <errno.h>
#include <arpa/inet.h>
#include <unistd.h>

static int kernel_has_gso(void) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0), val = 0;
    socklen_t len = sizeof val;
    if (fd < 0) return 0;
    int ok = getsockopt(fd, SOL_UDP, UDP_SEGMENT, &val, &len) == 0;
    close(fd);
    return ok;
}

static void init_monotonic_cond(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

static PyObject *Pacer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Pacer *pc = (Pacer *)type->tp_alloc(type, 0);
    if (pc == NULL) return NULL;
    pthread_mutex_init(&pc->mu, NULL);
    pthread_mutex_init(&pc->produce_mu, NULL);
    init_monotonic_cond(&pc->wake);
    init_monotonic_cond(&pc->idle);
    return (PyObject *)pc;
}

static int Pacer_init(Pacer *pc, PyObject *args, PyObject *kwargs) {
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
    if (pc->paths != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Pacer is already initialised");
        return -1;
    }
    if ((unsigned long long)n_paths * capacity * slot_size > (1ULL << 34)) {
        PyErr_SetString(PyExc_ValueError,
                        "capacity: n_paths * capacity * slot_size exceeds 16 GiB of rings");
        return -1;
    }
    pc->n_paths = (int)n_paths;
    pc->capacity = (size_t)capacity;
    pc->slot_size = (size_t)slot_size;
    pc->max_batch = (int)max_batch;
    pc->gso_segments = (int)gso_segments;
    pc->gso_wanted = gso && kernel_has_gso();
    pc->spin_ns = spin_ns;
    pc->burst_ns = burst_ns;
    pc->paths = PyMem_RawCalloc((size_t)n_paths, sizeof(PPath));
    pc->plans = PyMem_RawCalloc((size_t)n_paths, sizeof(Plan));
    pc->msgs = PyMem_RawCalloc((size_t)max_batch, sizeof(struct mmsghdr));
    pc->iovs = PyMem_RawCalloc((size_t)max_batch, sizeof(struct iovec));
    pc->cmsgs = PyMem_RawCalloc((size_t)max_batch, CMSG_SLOT);
    pc->msg_dgs = PyMem_RawCalloc((size_t)max_batch, sizeof(int));
    if (!pc->paths || !pc->plans || !pc->msgs || !pc->iovs || !pc->cmsgs || !pc->msg_dgs) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < pc->n_paths; i++) {
        PPath *p = &pc->paths[i];
        p->fd = -1;
        p->slots = PyMem_RawMalloc(pc->capacity * pc->slot_size);
        p->lens = PyMem_RawCalloc(pc->capacity, sizeof(uint32_t));
        p->not_before = PyMem_RawCalloc(pc->capacity, sizeof(int64_t));
        if (!p->slots || !p->lens || !p->not_before) {
            PyErr_NoMemory();
            return -1;
        }
    }
    pc->wake_at = INT64_MIN;
    int rc = pthread_create(&pc->thread, NULL, wx_pacer_main, pc);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pc->started = 1;
    return 0;
}

static void pacer_stop(Pacer *pc) {
    if (!pc->started) return;
    pthread_mutex_lock(&pc->mu);
    pc->stop = 1;
    pthread_cond_broadcast(&pc->wake);
    pthread_mutex_unlock(&pc->mu);
    pthread_join(pc->thread, NULL);
    pc->started = 0;
}

static void Pacer_dealloc(Pacer *pc) {
    Py_BEGIN_ALLOW_THREADS
    pacer_stop(pc);
    Py_END_ALLOW_THREADS
    if (pc->paths) {
        for (int i = 0; i < pc->n_paths; i++) {
            PyMem_RawFree(pc->paths[i].slots);
            PyMem_RawFree(pc->paths[i].lens);
            PyMem_RawFree(pc->paths[i].not_before);
        }
    }
    PyMem_RawFree(pc->paths);
    PyMem_RawFree(pc->plans);
    PyMem_RawFree(pc->msgs);
    PyMem_RawFree(pc->iovs);
    PyMem_RawFree(pc->cmsgs);
    PyMem_RawFree(pc->msg_dgs);
    pthread_cond_destroy(&pc->wake);
    pthread_cond_destroy(&pc->idle);
    pthread_mutex_destroy(&pc->mu);
    pthread_mutex_destroy(&pc->produce_mu);
    Py_TYPE(pc)->tp_free((PyObject *)pc);
}

static int check_running(Pacer *pc) {
    if (!pc->started) {
        PyErr_SetString(PyExc_RuntimeError, "Pacer is closed");
        return -1;
    }
    return 0;
}

static int path_arg(Pacer *pc, PyObject *o, long long *path) {
    if (check_running(pc)) return -1;
    return wx_int_in_range(o, "path_id", 0, pc->n_paths - 1, path);
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

static PyObject *Pacer_set_path(Pacer *pc, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path_id", "fd", "dest", NULL};
    PyObject *o_path, *o_fd, *o_dest = Py_None;
    long long path;
    struct sockaddr_storage ss;
    socklen_t ss_len = 0;
    int fd = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:set_path", kwlist, &o_path, &o_fd,
                                     &o_dest))
        return NULL;
    if (path_arg(pc, o_path, &path)) return NULL;
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
    pthread_mutex_lock(&pc->mu);
    PPath *p = &pc->paths[path];
    p->fd = fd;
    p->dest_len = ss_len;
    if (ss_len) p->dest = ss;
    p->gso = pc->gso_wanted;
    pthread_cond_signal(&pc->wake);
    pthread_mutex_unlock(&pc->mu);
    Py_RETURN_NONE;
}

static PyObject *set_pacing(Pacer *pc, PyObject *args, const char *fmt, int is_pps) {
    PyObject *o_path;
    double v;
    long long path;
    if (!PyArg_ParseTuple(args, fmt, &o_path, &v)) return NULL;
    if (path_arg(pc, o_path, &path)) return NULL;
    if (!(v >= 0) || v > 1e15) {
        PyErr_Format(PyExc_ValueError, "%s: %R must be >= 0 (0 = unpaced)",
                     is_pps ? "pps" : "rate_bytes_per_s", PyTuple_GET_ITEM(args, 1));
        return NULL;
    }
    pthread_mutex_lock(&pc->mu);
    pc->paths[path].rate_bytes_per_s = is_pps ? 0 : v;
    pc->paths[path].pps = is_pps ? v : 0;
    /* No wake-up: the head's release was fixed when its predecessor left; the
     * new rate spaces the datagrams after it. */
    pthread_mutex_unlock(&pc->mu);
    Py_RETURN_NONE;
}

static PyObject *Pacer_set_rate(Pacer *pc, PyObject *args) {
    return set_pacing(pc, args, "Od:set_rate", 0);
}

static PyObject *Pacer_set_pps(Pacer *pc, PyObject *args) {
    return set_pacing(pc, args, "Od:set_pps", 1);
}

static PyObject *Pacer_enqueue(Pacer *pc, PyObject *args, PyObject *kwargs) {
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
    if (path_arg(pc, o_path, &path) ||
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
        if (lens[i] > pc->slot_size) {
            PyErr_Format(PyExc_ValueError, "datagram %zd: %zu bytes exceeds slot_size %zu", i,
                         lens[i], pc->slot_size);
            goto done;
        }
    }
    Py_ssize_t accepted = 0;
    Py_BEGIN_ALLOW_THREADS
    /* Copy into the free slots without holding mu, so a large enqueue never
     * stalls the release thread: it only reads [head, head + count) and only
     * advances head, so the tail and the free slots beyond it stay ours until
     * count is raised under mu. produce_mu keeps two producers apart. */
    pthread_mutex_lock(&pc->produce_mu);
    PPath *p = &pc->paths[path];
    pthread_mutex_lock(&pc->mu);
    size_t tail = (p->head + p->count) % pc->capacity, room = pc->capacity - p->count;
    pthread_mutex_unlock(&pc->mu);
    const uint8_t *src = buf.buf;
    while (accepted < n && (size_t)accepted < room) {
        size_t idx = (tail + (size_t)accepted) % pc->capacity;
        memcpy(p->slots + idx * pc->slot_size, src, lens[accepted]);
        p->lens[idx] = (uint32_t)lens[accepted];
        p->not_before[idx] = not_before;
        src += lens[accepted];
        accepted++;
    }
    pthread_mutex_lock(&pc->mu);
    int was_empty = p->count == 0;
    if (was_empty) {
        double now = (double)wx_mono_ns();
        if (p->t_next < now) p->t_next = now; /* an idle path earns no burst credit */
    }
    p->count += (size_t)accepted;
    /* A queue that was not empty keeps its head, so the thread's plan stands. */
    if (accepted > 0 && was_empty && p->fd >= 0 && wx_head_release(p) < pc->wake_at)
        pthread_cond_signal(&pc->wake);
    pthread_mutex_unlock(&pc->mu);
    pthread_mutex_unlock(&pc->produce_mu);
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(accepted);
done:
    PyMem_Free(lens);
    PyBuffer_Release(&buf);
    return res;
}

static PyObject *Pacer_wait_idle(Pacer *pc, PyObject *args) {
    double timeout_s;
    int idle;
    if (!PyArg_ParseTuple(args, "d:wait_idle", &timeout_s)) return NULL;
    if (check_running(pc)) return NULL;
    if (!(timeout_s >= 0) || timeout_s > 1e6) {
        PyErr_SetString(PyExc_ValueError, "timeout_s: must be between 0 and 1e6 seconds");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    struct timespec deadline = wx_ns_to_ts(wx_mono_ns() + (int64_t)(timeout_s * 1e9));
    pthread_mutex_lock(&pc->mu);
    while (!wx_pacer_all_empty(pc) && !pc->stop) {
        if (pthread_cond_timedwait(&pc->idle, &pc->mu, &deadline) == ETIMEDOUT) break;
    }
    idle = wx_pacer_all_empty(pc);
    pthread_mutex_unlock(&pc->mu);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(idle);
}

static PyObject *Pacer_stats(Pacer *pc, PyObject *unused) {
    if (pc->paths == NULL) return PyList_New(0);
    PyObject *list = PyList_New(pc->n_paths);
    if (list == NULL) return NULL;
    pthread_mutex_lock(&pc->mu); /* held briefly: the pacer never blocks while holding it */
    for (int i = 0; i < pc->n_paths; i++) {
        const PPath *p = &pc->paths[i];
        PyObject *d = Py_BuildValue(
            "{sKsKsKsnsKsKsO}", "sent_datagrams", (unsigned long long)p->sent_datagrams,
            "sent_bytes", (unsigned long long)p->sent_bytes, "send_errors",
            (unsigned long long)p->send_errors, "queue_depth", (Py_ssize_t)p->count, "gso_sends",
            (unsigned long long)p->gso_sends, "eagain", (unsigned long long)p->eagain, "gso",
            p->gso ? Py_True : Py_False);
        if (d == NULL) {
            pthread_mutex_unlock(&pc->mu);
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, d);
    }
    pthread_mutex_unlock(&pc->mu);
    return list;
}

static PyObject *Pacer_close(Pacer *pc, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    pacer_stop(pc);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Pacer_get_name(Pacer *pc, void *closure) {
    return PyUnicode_FromString(pc->gso_wanted ? "c-pthread-sendmmsg+gso" : "c-pthread-sendmmsg");
}

static PyObject *Pacer_get_closed(Pacer *pc, void *closure) {
    return PyBool_FromLong(!pc->started);
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
    {"wait_idle", (PyCFunction)Pacer_wait_idle, METH_VARARGS,
     "wait_idle(timeout_s) -> bool: block until every queue is empty."},
    {"stats", (PyCFunction)Pacer_stats, METH_NOARGS, "stats() -> list of per-path counters."},
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
