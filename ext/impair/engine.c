/*
 * emulation._engine: a link-impairment engine for hosts whose kernel has no
 * sch_netem.
 *
 * The engine forwards frames between pairs of file descriptors (AF_PACKET
 * sockets bound to the two veth ends of an emulated path, or any datagram
 * sockets in tests).  Each direction of a path has its own parameters and
 * state: loss (i.i.d. or Gilbert-Elliott), a down flag (blackhole), a
 * bottleneck of `rate_bps` with a drop-tail queue of `queue_bytes` (the
 * packet being serialised not counted), one-way
 * delay with normal jitter, and optional reordering.  Every admitted packet
 * gets a release time; one thread keeps all packets of all paths in a binary
 * heap ordered by (release time, arrival sequence) and sends each when due.
 *
 * The per-packet decision (`imp_admit`) is a pure function of the direction's
 * state, the arrival time and the packet length, so it is exposed for tests in
 * virtual time (`Engine.admit`) and used unchanged by the forwarding loop.
 *
 * With `vnet` the file descriptors carry frames with virtio-net headers (AF_PACKET
 * sockets with PACKET_VNET_HDR on veths that keep their offloads): a UDP GSO
 * super-frame is cut into the datagrams it stands for, each admitted on its own,
 * and every frame leaves with its checksum still owed where it came so (offload.h).
 *
 * `run()` releases the GIL; `set_params()` and `stop()` may be called from
 * another thread while it runs (a mutex guards pending parameter changes and an
 * eventfd wakes the loop).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "offload.h"

#define BATCH 64
#define MAX_DIRS 2048

enum { ADMIT_OK = 0, DROP_LOSS, DROP_QUEUE, DROP_DOWN, DROP_NOMEM };
static const char *const DROP_NAMES[] = {"ok", "loss", "queue", "down", "nomem"};

typedef struct {
    double rate_bps;    /* bottleneck rate; <= 0 means unlimited */
    double delay_s;     /* one-way base delay */
    double jitter_s;    /* standard deviation of the normal jitter */
    int reorder;        /* 0: a packet never overtakes an earlier one */
    double queue_bytes; /* drop-tail buffer in front of the bottleneck */
    double loss;        /* i.i.d. loss probability (when ge == 0) */
    int ge;             /* 1: Gilbert-Elliott loss instead of `loss` */
    double ge_p, ge_r, ge_loss_bad, ge_loss_good;
    int down; /* blackhole */
} imp_params;

typedef struct {
    uint64_t rx_packets, rx_bytes, tx_packets, tx_bytes;
    uint64_t drop_loss, drop_queue, drop_down, drop_nomem, drop_oversize, drop_txerr;
    uint64_t rx_stamped; /* arrivals timed by the kernel's receive timestamp */
    uint64_t tx_batches; /* sends of what was due together: one sendmmsg batch each */
    double rx_lag_max_s; /* the longest a stamped packet waited for the engine to read it */
} imp_counters;

/* Draws replayed from a caller's tape instead of the generator (the shared-trace
   test feeds the simulator and the engine the same draws). */
typedef struct {
    double *uniforms, *normals;
    size_t n_uniforms, n_normals, next_uniform, next_normal;
    int exhausted; /* a draw was asked for past the tape's end */
} imp_tape;

/* The bottleneck's queue: packets admitted whose serialisation has not begun,
   oldest first (a ring that grows as needed). */
typedef struct {
    double start, len;
} imp_slot;

typedef struct {
    imp_slot *slots;
    size_t head, count, cap;
    double bytes; /* the queue's bytes; the packet in service is not among them */
} imp_queue;

typedef struct {
    imp_params p;
    uint64_t rng;
    imp_tape tape;
    imp_queue q;
    int ge_bad;
    int have_spare;
    double spare_normal;
    double tx_free_at;     /* when the bottleneck finishes the last admitted packet */
    double last_departure; /* release time of the latest admitted packet */
    double last_arrival;   /* arrival time of the latest packet read (kept non-decreasing) */
    imp_counters c;
} imp_dir;

/* ---- randomness: xorshift64* seeded through splitmix64 ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double rng_uniform(imp_dir *d) {
    imp_tape *t = &d->tape;
    if (t->uniforms) {
        if (t->next_uniform < t->n_uniforms)
            return t->uniforms[t->next_uniform++];
        t->exhausted = 1;
        return 1.0; /* no loss, no transition: the caller reports the short tape */
    }
    uint64_t x = d->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    d->rng = x;
    return (double)((x * 0x2545F4914F6CDD1DULL) >> 11) * 0x1.0p-53;
}

/* Box-Muller; the second value of each pair is kept for the next call. */
static double rng_normal(imp_dir *d) {
    imp_tape *t = &d->tape;
    if (t->normals) {
        if (t->next_normal < t->n_normals)
            return t->normals[t->next_normal++];
        t->exhausted = 1;
        return 0.0;
    }
    if (d->have_spare) {
        d->have_spare = 0;
        return d->spare_normal;
    }
    double u1, u2;
    do {
        u1 = rng_uniform(d);
    } while (u1 <= 0.0);
    u2 = rng_uniform(d);
    double mag = sqrt(-2.0 * log(u1));
    d->spare_normal = mag * sin(2.0 * M_PI * u2);
    d->have_spare = 1;
    return mag * cos(2.0 * M_PI * u2);
}

static void dir_seed(imp_dir *d, uint64_t seed, int index) {
    uint64_t s = seed ^ ((uint64_t)(index + 1) * 0xD1B54A32D192ED03ULL);
    d->rng = splitmix64(&s);
    if (d->rng == 0)
        d->rng = 0x9E3779B97F4A7C15ULL;
}

/* ---- the per-packet decision ---- */

static int lose_packet(imp_dir *d) {
    const imp_params *p = &d->p;
    if (!p->ge)
        return p->loss > 0.0 && rng_uniform(d) < p->loss;
    /* Like netem's gemodel: the loss draw uses the state the packet found,
       then the chain steps once. */
    double lp = d->ge_bad ? p->ge_loss_bad : p->ge_loss_good;
    int lost = lp > 0.0 && rng_uniform(d) < lp;
    if (d->ge_bad) {
        if (rng_uniform(d) < p->ge_r)
            d->ge_bad = 0;
    } else if (rng_uniform(d) < p->ge_p) {
        d->ge_bad = 1;
    }
    return lost;
}

/* Packets whose serialisation has begun by `now` leave the queue. */
static void queue_advance(imp_queue *q, double now) {
    while (q->count && q->slots[q->head].start <= now) {
        q->bytes -= q->slots[q->head].len;
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    if (!q->count)
        q->bytes = 0.0; /* no rounding residue once empty */
}

static int queue_push(imp_queue *q, double start, double len) {
    if (q->count == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 256;
        imp_slot *slots = malloc(cap * sizeof(imp_slot));
        if (!slots)
            return -1;
        for (size_t i = 0; i < q->count; i++)
            slots[i] = q->slots[(q->head + i) % q->cap];
        free(q->slots);
        q->slots = slots;
        q->head = 0;
        q->cap = cap;
    }
    q->slots[(q->head + q->count) % q->cap] = (imp_slot){start, len};
    q->count++;
    q->bytes += len;
    return 0;
}

/* Decide the fate of a packet of `len` bytes arriving at `now` (seconds);
   on ADMIT_OK, *departure is its release time.  The order of the decisions and
   of the draws is the shared impairment specification (docs/notes/emulation.md,
   "One impairment model"), which the simulator's link follows too: down, loss
   (netem draws it at enqueue, so a lost packet takes no queue space), the
   drop-tail queue (the packet in service not counted), serialisation, delay
   with jitter, the no-overtaking clamp. */
static int imp_admit(imp_dir *d, double now, double len, double *departure) {
    const imp_params *p = &d->p;
    if (p->down)
        return DROP_DOWN;
    if (lose_packet(d))
        return DROP_LOSS;
    double done = now;
    if (p->rate_bps > 0.0) {
        imp_queue *q = &d->q;
        queue_advance(q, now);
        int busy = q->count || now < d->tx_free_at;
        if (busy && q->bytes + len > p->queue_bytes + 0.5) /* 0.5: float rounding */
            return DROP_QUEUE;
        double start = busy ? d->tx_free_at : now;
        if (start > now && queue_push(q, start, len) < 0)
            return DROP_NOMEM;
        done = start + len * 8.0 / p->rate_bps;
        d->tx_free_at = done;
    }
    double delay = p->delay_s;
    if (p->jitter_s > 0.0) {
        delay += p->jitter_s * rng_normal(d);
        if (delay < 0.0)
            delay = 0.0;
    }
    double dep = done + delay;
    if (!p->reorder && dep < d->last_departure)
        dep = d->last_departure;
    if (dep > d->last_departure)
        d->last_departure = dep;
    *departure = dep;
    return ADMIT_OK;
}

/* ---- packets and the release heap ---- */

typedef struct pkt {
    struct pkt *next_free;
    double dep;
    uint64_t seq;
    uint32_t len;
    uint16_t dir;
    unsigned char vh[WX_VNET_HDR_LEN]; /* its virtio-net header, on an engine with `vnet` */
    unsigned char data[];
} pkt;

static int pkt_before(const pkt *a, const pkt *b) {
    return a->dep < b->dep || (a->dep == b->dep && a->seq < b->seq);
}

typedef struct {
    PyObject_HEAD
    int ndirs;
    imp_dir dirs[MAX_DIRS];
    int rx_fd[MAX_DIRS];
    int tx_fd[MAX_DIRS];
    imp_params pending[MAX_DIRS];
    int pending_set[MAX_DIRS];
    atomic_int any_pending;
    pthread_mutex_t mu;
    atomic_int stop_flag;
    atomic_int running;
    int efd;
    uint64_t seed;
    size_t header_bytes;
    size_t frame_bytes;
    int vnet;                  /* frames carry a virtio-net header (offload.h) */
    unsigned char *rx_scratch; /* vnet: BATCH frames of up to WX_VNET_MAX_FRAME, while running */
    size_t max_packets;
    size_t allocated;
    pkt *free_list;
    pkt **heap;
    size_t heap_len, heap_cap;
    uint64_t seq;
} Engine;

static pkt *pkt_get(Engine *e) {
    pkt *k = e->free_list;
    if (k) {
        e->free_list = k->next_free;
        return k;
    }
    if (e->allocated >= e->max_packets)
        return NULL;
    k = malloc(sizeof(pkt) + e->frame_bytes);
    if (k)
        e->allocated++;
    return k;
}

static void pkt_put(Engine *e, pkt *k) {
    k->next_free = e->free_list;
    e->free_list = k;
}

static int heap_push(Engine *e, pkt *k) {
    if (e->heap_len == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 1024;
        pkt **h = realloc(e->heap, cap * sizeof(pkt *));
        if (!h)
            return -1;
        e->heap = h;
        e->heap_cap = cap;
    }
    size_t i = e->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pkt_before(k, e->heap[parent]))
            break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = k;
    return 0;
}

static pkt *heap_pop(Engine *e) {
    pkt *top = e->heap[0];
    pkt *last = e->heap[--e->heap_len];
    size_t i = 0, n = e->heap_len;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const pkt *mk = last;
        if (l < n && pkt_before(e->heap[l], mk)) {
            m = l;
            mk = e->heap[l];
        }
        if (r < n && pkt_before(e->heap[r], mk))
            m = r;
        if (m == i)
            break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

static double clock_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double mono_now(void) { return clock_s(CLOCK_MONOTONIC); }

/* A frame's arrival time on the monotonic clock: its kernel receive timestamp
 * (SCM_TIMESTAMPNS, on the realtime clock, present when the rx socket has
 * SO_TIMESTAMPNS on) moved by `real_minus_mono`, or NAN without one. On a veth the
 * kernel stamps a frame as the sender's transmit enqueues it, so a frame the engine
 * reads late (its thread waited for a CPU) still enters the emulated queue when it
 * was sent, as it would enter netem's: read times would bunch a stall's frames
 * into one burst and drop them at a queue the sender never overran. */
static double stamped_arrival(struct msghdr *h, double real_minus_mono) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - real_minus_mono;
        }
    }
    return NAN;
}

/* ---- parameters from Python ---- */

static int get_double(PyObject *kw, const char *key, double dflt, double *out) {
    PyObject *v = kw ? PyDict_GetItemString(kw, key) : NULL;
    if (!v) {
        *out = dflt;
        return 0;
    }
    *out = PyFloat_AsDouble(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static int get_bool(PyObject *kw, const char *key, int *out) {
    PyObject *v = kw ? PyDict_GetItemString(kw, key) : NULL;
    if (!v) {
        *out = 0;
        return 0;
    }
    int b = PyObject_IsTrue(v);
    if (b < 0)
        return -1;
    *out = b;
    return 0;
}

static const char *const PARAM_KEYS[] = {
    "rate_bps", "delay_s", "jitter_s", "reorder", "queue_bytes", "loss", "ge",
    "ge_p", "ge_r", "ge_loss_bad", "ge_loss_good", "down", NULL};

static int parse_params(PyObject *kw, imp_params *p) {
    if (kw) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kw, &pos, &key, &value)) {
            const char *k = PyUnicode_AsUTF8(key);
            if (!k)
                return -1;
            int known = 0;
            for (int i = 0; PARAM_KEYS[i]; i++)
                known |= strcmp(k, PARAM_KEYS[i]) == 0;
            if (!known) {
                PyErr_Format(PyExc_TypeError, "unknown impairment parameter %R", key);
                return -1;
            }
        }
    }
    if (get_double(kw, "rate_bps", 0.0, &p->rate_bps) || get_double(kw, "delay_s", 0.0, &p->delay_s) ||
        get_double(kw, "jitter_s", 0.0, &p->jitter_s) || get_bool(kw, "reorder", &p->reorder) ||
        get_double(kw, "queue_bytes", 0.0, &p->queue_bytes) || get_double(kw, "loss", 0.0, &p->loss) ||
        get_bool(kw, "ge", &p->ge) || get_double(kw, "ge_p", 0.0, &p->ge_p) ||
        get_double(kw, "ge_r", 1.0, &p->ge_r) || get_double(kw, "ge_loss_bad", 1.0, &p->ge_loss_bad) ||
        get_double(kw, "ge_loss_good", 0.0, &p->ge_loss_good) || get_bool(kw, "down", &p->down))
        return -1;
    if (p->delay_s < 0 || p->jitter_s < 0 || p->queue_bytes < 0 || p->loss < 0 || p->loss > 1) {
        PyErr_SetString(PyExc_ValueError, "delay, jitter and queue must be >= 0 and loss in [0, 1]");
        return -1;
    }
    return 0;
}

static int check_index(Engine *e, int idx) {
    if (idx < 0 || idx >= e->ndirs) {
        PyErr_Format(PyExc_IndexError, "no direction %d (have %d)", idx, e->ndirs);
        return -1;
    }
    return 0;
}

/* ---- the Engine type ---- */

static int Engine_init(Engine *e, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"seed", "header_bytes", "frame_bytes", "max_memory_bytes", "vnet", NULL};
    unsigned long long seed = 0;
    Py_ssize_t header = 14, frame = 2048, max_mem = 512 << 20;
    int vnet = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|Knnnp", kwlist, &seed, &header, &frame, &max_mem, &vnet))
        return -1;
    if (header < 0 || frame < 64 || frame > 65536 || max_mem < frame) {
        PyErr_SetString(PyExc_ValueError, "need header_bytes >= 0, 64 <= frame_bytes <= 65536");
        return -1;
    }
    e->seed = seed;
    e->header_bytes = (size_t)header;
    e->frame_bytes = (size_t)frame;
    e->vnet = vnet;
    e->max_packets = (size_t)max_mem / ((size_t)frame + sizeof(pkt));
    e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&e->mu, NULL);
    return 0;
}

static void tape_clear(imp_tape *t) {
    free(t->uniforms);
    free(t->normals);
    memset(t, 0, sizeof(*t));
}

static void Engine_dealloc(Engine *e) {
    for (int i = 0; i < e->ndirs; i++) {
        tape_clear(&e->dirs[i].tape);
        free(e->dirs[i].q.slots);
    }
    while (e->heap_len)
        pkt_put(e, heap_pop(e));
    free(e->heap);
    free(e->rx_scratch);
    while (e->free_list) {
        pkt *k = e->free_list;
        e->free_list = k->next_free;
        free(k);
    }
    if (e->efd > 0)
        close(e->efd);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *Engine_add_direction(Engine *e, PyObject *args, PyObject *kw) {
    int rx, tx;
    if (!PyArg_ParseTuple(args, "ii", &rx, &tx))
        return NULL;
    if (atomic_load(&e->running)) {
        PyErr_SetString(PyExc_RuntimeError, "cannot add a direction while running");
        return NULL;
    }
    if (e->ndirs >= MAX_DIRS) {
        PyErr_Format(PyExc_ValueError, "at most %d directions", MAX_DIRS);
        return NULL;
    }
    for (int i = 0; i < e->ndirs; i++)
        if (e->rx_fd[i] == rx) {
            PyErr_Format(PyExc_ValueError, "fd %d already receives for direction %d", rx, i);
            return NULL;
        }
    imp_dir *d = &e->dirs[e->ndirs];
    memset(d, 0, sizeof(*d));
    if (parse_params(kw, &d->p) < 0)
        return NULL;
    dir_seed(d, e->seed, e->ndirs);
    e->rx_fd[e->ndirs] = rx;
    e->tx_fd[e->ndirs] = tx;
    return PyLong_FromLong(e->ndirs++);
}

static PyObject *Engine_set_params(Engine *e, PyObject *args, PyObject *kw) {
    int idx;
    imp_params p;
    memset(&p, 0, sizeof(p));
    if (!PyArg_ParseTuple(args, "i", &idx) || check_index(e, idx) < 0 || parse_params(kw, &p) < 0)
        return NULL;
    pthread_mutex_lock(&e->mu);
    e->pending[idx] = p;
    e->pending_set[idx] = 1;
    atomic_store(&e->any_pending, 1);
    pthread_mutex_unlock(&e->mu);
    if (!atomic_load(&e->running)) {
        e->dirs[idx].p = p;
        e->pending_set[idx] = 0;
    } else {
        uint64_t one = 1;
        (void)!write(e->efd, &one, sizeof(one));
    }
    Py_RETURN_NONE;
}

static void apply_pending(Engine *e) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->ndirs; i++)
        if (e->pending_set[i]) {
            e->dirs[i].p = e->pending[i];
            e->pending_set[i] = 0;
        }
    atomic_store(&e->any_pending, 0);
    pthread_mutex_unlock(&e->mu);
}

static PyObject *Engine_admit(Engine *e, PyObject *args) {
    int idx;
    double now, len, dep = 0.0;
    if (!PyArg_ParseTuple(args, "idd", &idx, &now, &len) || check_index(e, idx) < 0)
        return NULL;
    if (atomic_load(&e->running)) {
        PyErr_SetString(PyExc_RuntimeError, "admit() is for virtual time; the engine is running");
        return NULL;
    }
    imp_dir *d = &e->dirs[idx];
    int r = imp_admit(d, now, len, &dep);
    if (d->tape.exhausted) {
        PyErr_SetString(PyExc_ValueError, "the draw tape ran out");
        return NULL;
    }
    if (r != ADMIT_OK)
        return Py_BuildValue("(Os)", Py_None, DROP_NAMES[r]);
    return Py_BuildValue("(ds)", dep, DROP_NAMES[r]);
}

/* Copy a sequence of floats into a fresh array; NULL with an exception on error. */
static double *floats_from(PyObject *seq, size_t *n) {
    PyObject *fast = PySequence_Fast(seq, "draws must be a sequence of floats");
    if (!fast)
        return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    double *out = malloc(sizeof(double) * (size_t)(len ? len : 1));
    if (!out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] == -1.0 && PyErr_Occurred()) {
            free(out);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    *n = (size_t)len;
    return out;
}

static PyObject *Engine_replay_draws(Engine *e, PyObject *args) {
    int idx;
    PyObject *uniforms, *normals;
    if (!PyArg_ParseTuple(args, "iOO", &idx, &uniforms, &normals) || check_index(e, idx) < 0)
        return NULL;
    if (atomic_load(&e->running)) {
        PyErr_SetString(PyExc_RuntimeError, "replay_draws() is for virtual time; the engine is running");
        return NULL;
    }
    imp_tape t;
    memset(&t, 0, sizeof(t));
    t.uniforms = floats_from(uniforms, &t.n_uniforms);
    if (!t.uniforms)
        return NULL;
    t.normals = floats_from(normals, &t.n_normals);
    if (!t.normals) {
        free(t.uniforms);
        return NULL;
    }
    tape_clear(&e->dirs[idx].tape);
    e->dirs[idx].tape = t;
    Py_RETURN_NONE;
}

static PyObject *Engine_stats(Engine *e, PyObject *args) {
    int idx;
    if (!PyArg_ParseTuple(args, "i", &idx) || check_index(e, idx) < 0)
        return NULL;
    const imp_counters *c = &e->dirs[idx].c;
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsd}", "rx_packets", c->rx_packets, "rx_bytes", c->rx_bytes,
        "tx_packets", c->tx_packets, "tx_bytes", c->tx_bytes, "drop_loss", c->drop_loss,
        "drop_queue", c->drop_queue, "drop_down", c->drop_down, "drop_nomem", c->drop_nomem,
        "drop_oversize", c->drop_oversize, "drop_txerr", c->drop_txerr, "rx_stamped",
        c->rx_stamped, "tx_batches", c->tx_batches, "rx_lag_max_s", c->rx_lag_max_s);
}

static PyObject *Engine_stop(Engine *e, PyObject *unused) {
    atomic_store(&e->stop_flag, 1);
    uint64_t one = 1;
    (void)!write(e->efd, &one, sizeof(one));
    Py_RETURN_NONE;
}

static PyObject *Engine_now(PyObject *unused_self, PyObject *unused) {
    return PyFloat_FromDouble(mono_now());
}

/* ---- the forwarding loop ---- */

typedef struct {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH][2]; /* [virtio-net header,] frame */
    pkt *pkts[BATCH];
    int n;
} txbatch;

static void tx_flush(Engine *e, int dir, txbatch *b) {
    int off = 0;
    e->dirs[dir].c.tx_batches++;
    while (off < b->n) {
        int sent = sendmmsg(e->tx_fd[dir], b->msgs + off, (unsigned)(b->n - off), MSG_DONTWAIT);
        if (sent <= 0) {
            if (sent < 0 && errno == EINTR)
                continue;
            /* A full or failing transmit queue drops what is left, counted. */
            e->dirs[dir].c.drop_txerr += (uint64_t)(b->n - off);
            break;
        }
        for (int i = off; i < off + sent; i++) {
            e->dirs[dir].c.tx_packets++;
            e->dirs[dir].c.tx_bytes += b->pkts[i]->len;
        }
        off += sent;
    }
    for (int i = 0; i < b->n; i++)
        pkt_put(e, b->pkts[i]);
    b->n = 0;
}

static void release_due(Engine *e, txbatch *tx, double now) {
    int touched[MAX_DIRS];
    int ntouched = 0;
    while (e->heap_len && e->heap[0]->dep <= now) {
        pkt *k = heap_pop(e);
        txbatch *b = &tx[k->dir];
        if (b->n == 0)
            touched[ntouched++] = k->dir;
        struct iovec *iov = b->iov[b->n];
        int parts = 0;
        if (e->vnet)
            iov[parts++] = (struct iovec){.iov_base = k->vh, .iov_len = WX_VNET_HDR_LEN};
        iov[parts++] = (struct iovec){.iov_base = k->data, .iov_len = k->len};
        memset(&b->msgs[b->n].msg_hdr, 0, sizeof(struct msghdr));
        b->msgs[b->n].msg_hdr.msg_iov = iov;
        b->msgs[b->n].msg_hdr.msg_iovlen = (size_t)parts;
        b->pkts[b->n++] = k;
        if (b->n == BATCH)
            tx_flush(e, k->dir, b);
    }
    for (int i = 0; i < ntouched; i++)
        if (tx[touched[i]].n)
            tx_flush(e, touched[i], &tx[touched[i]]);
}

/* When a frame entered the link: its kernel receive stamp, never later than now, never
   before the previous arrival (a step of the realtime clock between the stamp and now
   must not reorder the queue). */
static double arrival_of(imp_dir *d, struct msghdr *h, double now, double real_minus_mono) {
    double arrival = stamped_arrival(h, real_minus_mono);
    if (arrival == arrival) { /* not NAN */
        d->c.rx_stamped++;
        if (arrival > now)
            arrival = now;
        if (now - arrival > d->c.rx_lag_max_s)
            d->c.rx_lag_max_s = now - arrival;
    } else {
        arrival = now;
    }
    if (arrival < d->last_arrival)
        arrival = d->last_arrival;
    d->last_arrival = arrival;
    return arrival;
}

/* One datagram of `len` bytes in `k` offered to direction `dir`'s link at `arrival`:
   queued for its release, or counted as dropped and its buffer returned. */
static void admit_frame(Engine *e, int dir, pkt *k, uint32_t len, double arrival) {
    imp_dir *d = &e->dirs[dir];
    d->c.rx_packets++;
    d->c.rx_bytes += len;
    double l3 = len > e->header_bytes ? (double)(len - e->header_bytes) : 0.0;
    double dep;
    int r = imp_admit(d, arrival, l3, &dep);
    if (r != ADMIT_OK) {
        if (r == DROP_LOSS)
            d->c.drop_loss++;
        else if (r == DROP_QUEUE)
            d->c.drop_queue++;
        else if (r == DROP_NOMEM)
            d->c.drop_nomem++;
        else
            d->c.drop_down++;
        pkt_put(e, k);
        return;
    }
    k->dep = dep;
    k->seq = e->seq++;
    k->len = len;
    k->dir = (uint16_t)dir;
    if (heap_push(e, k) < 0) {
        d->c.drop_nomem++;
        pkt_put(e, k);
    }
}

/* A frame the link cannot carry: counted as received and dropped as oversize. */
static void drop_oversize(imp_dir *d, size_t len) {
    d->c.rx_packets++;
    d->c.rx_bytes += len;
    d->c.drop_oversize++;
}

/* A datagram no packet buffer was left for: counted as received and dropped. */
static void drop_nomem(imp_dir *d) {
    d->c.rx_packets++;
    d->c.drop_nomem++;
}

/* Out of packet memory: read one frame into a scratch buffer and count it. */
static int drop_one_nomem(Engine *e, int dir) {
    unsigned char scratch[64];
    ssize_t r = recv(e->rx_fd[dir], scratch, sizeof(scratch), MSG_DONTWAIT | MSG_TRUNC);
    if (r < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    drop_nomem(&e->dirs[dir]);
    return 1;
}

/* Message `m` reads into `iov` with room for a receive timestamp in `ctrl`. */
static void prepare_msg(struct mmsghdr *m, struct iovec *iov, void *ctrl, size_t ctrl_len) {
    memset(&m->msg_hdr, 0, sizeof(struct msghdr));
    m->msg_hdr.msg_iov = iov;
    m->msg_hdr.msg_iovlen = 1;
    m->msg_hdr.msg_control = ctrl;
    m->msg_hdr.msg_controllen = ctrl_len;
}

/* Receive one batch on direction `dir`; returns the number of frames read,
   0 when the socket is drained, -1 on a fatal error (errno set). */
static int rx_batch(Engine *e, int dir) {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    pkt *bufs[BATCH];
    union { /* aligned for struct cmsghdr */
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } ctrl[BATCH];
    int n = 0;
    while (n < BATCH && (bufs[n] = pkt_get(e)) != NULL) {
        iov[n].iov_base = bufs[n]->data;
        iov[n].iov_len = e->frame_bytes;
        prepare_msg(&msgs[n], &iov[n], ctrl[n].buf, sizeof(ctrl[n].buf));
        n++;
    }
    imp_dir *d = &e->dirs[dir];
    if (n == 0)
        return drop_one_nomem(e, dir);
    int got = recvmmsg(e->rx_fd[dir], msgs, (unsigned)n, MSG_DONTWAIT, NULL);
    int err = errno;
    double now = mono_now();
    double real_minus_mono = clock_s(CLOCK_REALTIME) - now;
    for (int i = 0; i < (got > 0 ? got : 0); i++) {
        pkt *k = bufs[i];
        bufs[i] = NULL;
        double arrival = arrival_of(d, &msgs[i].msg_hdr, now, real_minus_mono);
        if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
            drop_oversize(d, msgs[i].msg_len);
            pkt_put(e, k);
            continue;
        }
        admit_frame(e, dir, k, msgs[i].msg_len, arrival);
    }
    for (int i = 0; i < n; i++)
        if (bufs[i])
            pkt_put(e, bufs[i]);
    if (got < 0)
        return (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) ? 0 : (errno = err, -1);
    return got;
}

/* One frame read with its virtio-net header: a datagram as it is, or a UDP GSO
   super-frame cut into the datagrams it stands for, each offered to the link. */
static void admit_vnet_frame(Engine *e, int dir, const unsigned char *raw, size_t len, double arrival) {
    imp_dir *d = &e->dirs[dir];
    if (len < WX_VNET_HDR_LEN) {
        drop_oversize(d, len);
        return;
    }
    wx_vnet_hdr h;
    wx_vnet_read(&h, raw);
    const unsigned char *frame = raw + WX_VNET_HDR_LEN;
    len -= WX_VNET_HDR_LEN;
    if (h.gso_type == WX_VNET_GSO_NONE) {
        pkt *k = len > e->frame_bytes ? NULL : pkt_get(e);
        if (k == NULL) {
            if (len > e->frame_bytes)
                drop_oversize(d, len);
            else
                drop_nomem(d);
            return;
        }
        memcpy(k->data, frame, len);
        wx_vnet_hdr plain = wx_vnet_plain(&h);
        wx_vnet_write(&plain, k->vh);
        admit_frame(e, dir, k, (uint32_t)len, arrival);
        return;
    }
    wx_gso g;
    if (wx_gso_open(&g, frame, len, &h, e->header_bytes) < 0) {
        drop_oversize(d, len); /* an offload this engine does not cut */
        return;
    }
    for (size_t i = 0; i < g.count; i++) {
        pkt *k = pkt_get(e);
        if (k == NULL) {
            drop_nomem(d);
            continue;
        }
        wx_vnet_hdr oh;
        size_t n = wx_gso_datagram(&g, i, k->data, e->frame_bytes, &oh);
        if (n == 0) {
            drop_oversize(d, g.l4 + 8 + g.seg);
            pkt_put(e, k);
            continue;
        }
        wx_vnet_write(&oh, k->vh);
        admit_frame(e, dir, k, (uint32_t)n, arrival);
    }
}

/* rx_batch for an engine with `vnet`: frames land in the scratch area (a super-frame
   is larger than a packet buffer) and are copied or cut into packets from there. */
static int rx_batch_vnet(Engine *e, int dir) {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } ctrl[BATCH];
    if (e->free_list == NULL && e->allocated >= e->max_packets)
        return drop_one_nomem(e, dir);
    for (int n = 0; n < BATCH; n++) {
        iov[n].iov_base = e->rx_scratch + (size_t)n * (WX_VNET_HDR_LEN + WX_VNET_MAX_FRAME);
        iov[n].iov_len = WX_VNET_HDR_LEN + WX_VNET_MAX_FRAME;
        prepare_msg(&msgs[n], &iov[n], ctrl[n].buf, sizeof(ctrl[n].buf));
    }
    int got = recvmmsg(e->rx_fd[dir], msgs, BATCH, MSG_DONTWAIT, NULL);
    int err = errno;
    double now = mono_now();
    double real_minus_mono = clock_s(CLOCK_REALTIME) - now;
    imp_dir *d = &e->dirs[dir];
    for (int i = 0; i < (got > 0 ? got : 0); i++) {
        double arrival = arrival_of(d, &msgs[i].msg_hdr, now, real_minus_mono);
        if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC)
            drop_oversize(d, msgs[i].msg_len);
        else
            admit_vnet_frame(e, dir, iov[i].iov_base, msgs[i].msg_len, arrival);
    }
    if (got < 0)
        return (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) ? 0 : (errno = err, -1);
    return got;
}

/* epoll tags beside the direction indices. */
#define TAG_WAKE UINT32_MAX
#define TAG_TIMER (UINT32_MAX - 1)

static int watch(int epfd, int fd, uint32_t tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = tag};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

/* Arm the one-shot release timer for `at` (CLOCK_MONOTONIC seconds; < 0 disarms). */
static int arm_release(int tfd, double at) {
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    if (at >= 0) {
        its.it_value.tv_sec = (time_t)at;
        its.it_value.tv_nsec = (long)((at - (double)its.it_value.tv_sec) * 1e9);
        if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
            its.it_value.tv_nsec = 1; /* zero would disarm */
    }
    return timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

#if defined(SYS_epoll_pwait2) && defined(__LP64__)
/* epoll_wait with a nanosecond timeout (Linux 5.11); -1/ENOSYS on older kernels. */
static int epoll_wait_ns(int epfd, struct epoll_event *evs, int n, const struct timespec *timeout) {
    return (int)syscall(SYS_epoll_pwait2, epfd, evs, n, timeout, NULL, 0);
}
#else
static int epoll_wait_ns(int epfd, struct epoll_event *evs, int n, const struct timespec *timeout) {
    (void)epfd, (void)evs, (void)n, (void)timeout;
    errno = ENOSYS;
    return -1;
}
#endif

/* Every wake-up releases the packets due within this window at once, so a dense
 * heap (a rate-limited path spaces its packets by one serialisation time, ~100 us
 * at 100 Mb/s) costs one sleep and one sendmmsg per window instead of one per
 * packet: in perf, the sleep/wake path was a third of the engine's CPU.  The
 * price is bounded: a packet leaves at most this much before its release time,
 * never later, and in the same order (the heap order is unchanged). */
#define DEFAULT_RELEASE_WINDOW_S 100e-6
#define MAX_RELEASE_WINDOW_S 10e-3

/* The forwarding loop. Readiness comes from epoll: the interest set is built
 * once, where ppoll() re-examined every socket on every wake-up (a third of
 * the engine's CPU with 16 directions, in perf). The next release is the
 * wait's nanosecond timeout (epoll_pwait2); kernels before 5.11 get a timerfd
 * instead, re-armed whenever the earliest release changes (epoll_wait's own
 * timeout is in milliseconds). */
static PyObject *Engine_run(Engine *e, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"timerfd", "release_window_s", NULL};
    int force_timerfd = 0;
    double window = DEFAULT_RELEASE_WINDOW_S;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$pd:run", kwlist, &force_timerfd, &window))
        return NULL;
    if (!(window >= 0.0 && window <= MAX_RELEASE_WINDOW_S)) {
        PyErr_Format(PyExc_ValueError, "release_window_s must be in [0, %g]", MAX_RELEASE_WINDOW_S);
        return NULL;
    }
    if (atomic_exchange(&e->running, 1)) {
        PyErr_SetString(PyExc_RuntimeError, "engine already running");
        return NULL;
    }
    atomic_store(&e->stop_flag, 0);
    int n_events = e->ndirs + 2;
    txbatch *tx = calloc((size_t)(e->ndirs ? e->ndirs : 1), sizeof(txbatch));
    struct epoll_event *evs = calloc((size_t)n_events, sizeof(struct epoll_event));
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    int fatal_errno = 0;
    if (e->vnet && e->rx_scratch == NULL)
        e->rx_scratch = malloc((size_t)BATCH * (WX_VNET_HDR_LEN + WX_VNET_MAX_FRAME));
    if (!tx || !evs || (e->vnet && e->rx_scratch == NULL)) {
        fatal_errno = ENOMEM;
    } else if (epfd < 0 || tfd < 0 || watch(epfd, e->efd, TAG_WAKE) < 0 || watch(epfd, tfd, TAG_TIMER) < 0) {
        fatal_errno = errno;
    } else {
        for (int i = 0; i < e->ndirs; i++)
            if (watch(epfd, e->rx_fd[i], (uint32_t)i) < 0) {
                fatal_errno = errno;
                break;
            }
    }

    Py_BEGIN_ALLOW_THREADS
    /* The default 50 us timer slack would add up to 50 us to every release. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    double armed = -1.0; /* the release the timerfd is set for; < 0: none */
    int precise_wait = !force_timerfd; /* epoll_pwait2, until the kernel says ENOSYS */
    while (!fatal_errno && !atomic_load(&e->stop_flag)) {
        if (atomic_load(&e->any_pending))
            apply_pending(e);
        release_due(e, tx, mono_now() + window);
        double next = e->heap_len ? e->heap[0]->dep : -1.0;
        int ready;
        if (precise_wait) {
            struct timespec ts, *tsp = NULL;
            if (next >= 0) {
                double wait = next - mono_now();
                if (wait < 0)
                    wait = 0;
                ts.tv_sec = (time_t)wait;
                ts.tv_nsec = (long)((wait - (double)ts.tv_sec) * 1e9);
                tsp = &ts;
            }
            ready = epoll_wait_ns(epfd, evs, n_events, tsp);
            if (ready < 0 && errno == ENOSYS) {
                precise_wait = 0;
                continue;
            }
        } else {
            if (next != armed) {
                if (arm_release(tfd, next) < 0) {
                    fatal_errno = errno;
                    break;
                }
                armed = next;
            }
            ready = epoll_wait(epfd, evs, n_events, -1);
        }
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            fatal_errno = errno;
            break;
        }
        for (int r = 0; r < ready && !fatal_errno; r++) {
            uint32_t tag = evs[r].data.u32;
            uint64_t v;
            if (tag == TAG_WAKE) {
                (void)!read(e->efd, &v, sizeof(v));
                continue;
            }
            if (tag == TAG_TIMER) {
                (void)!read(tfd, &v, sizeof(v));
                armed = -1.0; /* one-shot: it is disarmed now */
                continue;
            }
            if (evs[r].events & EPOLLERR) {
                fatal_errno = EIO;
                break;
            }
            if (!(evs[r].events & EPOLLIN))
                continue;
            /* A bounded number of batches per wake-up keeps releases on time. */
            for (int b = 0; b < 4; b++) {
                int got = e->vnet ? rx_batch_vnet(e, (int)tag) : rx_batch(e, (int)tag);
                if (got < 0) {
                    fatal_errno = errno;
                    break;
                }
                if (got < BATCH)
                    break;
            }
        }
    }
    Py_END_ALLOW_THREADS

    if (tfd >= 0)
        close(tfd);
    if (epfd >= 0)
        close(epfd);
    free(tx);
    free(evs);
    atomic_store(&e->running, 0);
    if (fatal_errno) {
        errno = fatal_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *Engine_queued(Engine *e, PyObject *unused) {
    return PyLong_FromSize_t(e->heap_len);
}

static PyMethodDef Engine_methods[] = {
    {"add_direction", (PyCFunction)(void (*)(void))Engine_add_direction, METH_VARARGS | METH_KEYWORDS,
     "add_direction(rx_fd, tx_fd, **params) -> index: forward frames read on rx_fd to tx_fd."},
    {"set_params", (PyCFunction)(void (*)(void))Engine_set_params, METH_VARARGS | METH_KEYWORDS,
     "set_params(index, **params): replace a direction's parameters (thread-safe)."},
    {"admit", (PyCFunction)Engine_admit, METH_VARARGS,
     "admit(index, now_s, length) -> (release_s | None, reason): one decision in virtual time."},
    {"replay_draws", (PyCFunction)Engine_replay_draws, METH_VARARGS,
     "replay_draws(index, uniforms, normals): the direction's later decisions take their uniform "
     "and normal draws from these sequences, in order, instead of the generator (virtual time; "
     "admit() raises ValueError once a needed draw is past the end)."},
    {"stats", (PyCFunction)Engine_stats, METH_VARARGS, "stats(index) -> dict of counters."},
    {"run", (PyCFunction)(void (*)(void))Engine_run, METH_VARARGS | METH_KEYWORDS,
     "run(*, timerfd=False, release_window_s=100e-6): forward until stop(); releases the GIL. "
     "timerfd=True waits the way kernels before 5.11 must (tests). Each wake-up sends every "
     "packet due within release_window_s: none leaves later than due, none earlier than that."},
    {"stop", (PyCFunction)Engine_stop, METH_NOARGS, "Ask run() to return (thread-safe)."},
    {"queued", (PyCFunction)Engine_queued, METH_NOARGS, "Packets waiting for release."},
    {"now", (PyCFunction)Engine_now, METH_NOARGS | METH_STATIC, "The engine's clock (CLOCK_MONOTONIC, s)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "emulation._engine.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Link-impairment engine: Engine(seed=0, header_bytes=14, frame_bytes=2048, max_memory_bytes=512MiB, "
              "vnet=False); with vnet, frames carry virtio-net headers and UDP GSO super-frames are cut "
              "into datagrams (offload.h)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

static struct PyModuleDef engine_module = {
    PyModuleDef_HEAD_INIT, "_engine", "Native link-impairment engine (see ext/impair/engine.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__engine(void) {
    if (PyType_Ready(&EngineType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&engine_module);
    if (!m)
        return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
