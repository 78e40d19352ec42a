/*
 * wanxport_lab._limits: what this machine can do at best, measured in the same run as wanxport.
 *
 * Why: a goodput or a CPU cost means little without the machine's own
 * ceilings next to it, measured minutes apart on the same (shared, noisy)
 * host. Each function here is the bare work one part of the data path does,
 * in C with the GIL released, timed with the calling thread's own CPU clock:
 *
 *   aead_seal        AES-256-GCM (or ChaCha20-Poly1305) sealing of fixed-size
 *                    datagrams through the same OpenSSL, with a 16-byte
 *                    header as associated data and a fresh nonce each: no I/O;
 *   udp_blast_send   a raw UDP sender: GSO super-buffers (UDP_SEGMENT), no
 *                    crypto, no protocol, as fast as the socket takes them;
 *   udp_blast_sink   its receiver: recvmmsg into GRO-sized slots, counting;
 *   udp_flood_send   a flood: sendmmsg of a caller's pool of datagrams (any
 *                    sizes, any bytes), cycled, as fast as one core sends them;
 *   udp_replay_send  a C source: a caller's pool of equal-stride datagrams
 *                    (say, sealed DATA) sent once, in GSO super-buffers, so a
 *                    receiver can be measured alone against a cheap sender.
 *
 * They are benchmarks' building blocks, not part of the data path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../common/wx_udp.h"

#include <errno.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define HEADER_LEN 16
#define TAG_LEN 16
#define NONCE_LEN 12
#define GSO_MAX_BYTES 65000 /* below the 64 KiB IP datagram limit with headers */
#define SINK_SLOTS 64
#define SINK_SLOT_BYTES 65536

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One timed span: the calling thread's CPU time and the wall time, read together. */
typedef struct {
    double cpu0, wall0, cpu1, wall1;
} Span;

static void span_start(Span *s) {
    s->cpu0 = thread_cpu_s();
    s->wall0 = mono_s();
}

static void span_stop(Span *s) {
    s->cpu1 = thread_cpu_s();
    s->wall1 = mono_s();
}

/* A send that failed with errno e: 0 when the loop goes on (a full socket buffer, counted
 * in *eagain; an interrupt; an ICMP refusal from a sink not yet listening), else e. */
static int send_failure(int e, long long *eagain) {
    if (e == EAGAIN || e == ENOBUFS) {
        (*eagain)++;
        return 0;
    }
    return e == EINTR || e == ECONNREFUSED ? 0 : e;
}

/* aead_seal(cipher, datagram_bytes, count) -> (cpu_s, wall_s, payload_bytes) */
static PyObject *aead_seal(PyObject *self, PyObject *args) {
    const char *name;
    Py_ssize_t size, count;
    if (!PyArg_ParseTuple(args, "snn:aead_seal", &name, &size, &count)) return NULL;
    const EVP_CIPHER *cipher = NULL;
    if (strcmp(name, "aes-256-gcm") == 0) cipher = EVP_aes_256_gcm();
    else if (strcmp(name, "chacha20-poly1305") == 0) cipher = EVP_chacha20_poly1305();
    else {
        PyErr_Format(PyExc_ValueError, "cipher: %s is not 'aes-256-gcm' or 'chacha20-poly1305'", name);
        return NULL;
    }
    if (size <= HEADER_LEN + TAG_LEN || size > 65507 || count < 1) {
        PyErr_SetString(PyExc_ValueError, "datagram_bytes must be 33..65507 and count >= 1");
        return NULL;
    }
    Py_ssize_t body = size - HEADER_LEN - TAG_LEN;
    uint8_t *buf = PyMem_RawMalloc((size_t)size);
    if (buf == NULL) return PyErr_NoMemory();
    memset(buf, 0xA5, (size_t)size);
    uint8_t key[32], iv[NONCE_LEN], nonce[NONCE_LEN];
    memset(key, 7, sizeof key);
    memset(iv, 3, sizeof iv);
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int ok = ctx != NULL && EVP_EncryptInit_ex(ctx, cipher, NULL, NULL, NULL) == 1 &&
             EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, NONCE_LEN, NULL) == 1 &&
             EVP_EncryptInit_ex(ctx, NULL, NULL, key, NULL) == 1;
    Span span = {0};
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        span_start(&span);
        for (Py_ssize_t i = 0; i < count && ok; i++) {
            int outl = 0;
            memcpy(nonce, iv, NONCE_LEN);
            nonce[NONCE_LEN - 1] ^= (uint8_t)i;
            nonce[NONCE_LEN - 2] ^= (uint8_t)(i >> 8);
            nonce[NONCE_LEN - 3] ^= (uint8_t)(i >> 16);
            nonce[NONCE_LEN - 4] ^= (uint8_t)(i >> 24);
            uint8_t *pt = buf + HEADER_LEN;
            ok = EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce) == 1 &&
                 EVP_EncryptUpdate(ctx, NULL, &outl, buf, HEADER_LEN) == 1 &&
                 EVP_EncryptUpdate(ctx, pt, &outl, pt, (int)body) == 1 &&
                 EVP_EncryptFinal_ex(ctx, pt + outl, &outl) == 1 &&
                 EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, TAG_LEN, pt + body) == 1;
        }
        span_stop(&span);
        Py_END_ALLOW_THREADS
    }
    EVP_CIPHER_CTX_free(ctx);
    PyMem_RawFree(buf);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to seal");
        return NULL;
    }
    return Py_BuildValue("(ddn)", span.cpu1 - span.cpu0, span.wall1 - span.wall0, body * count);
}

/* udp_blast_send(fd, seconds, datagram_bytes, gso=True)
 *   -> (datagrams, payload_bytes, cpu_s, wall_s, eagain)
 * fd must be connected. Blocking sends: the socket buffer is the only pacing. */
static PyObject *udp_blast_send(PyObject *self, PyObject *args) {
    int fd, gso = 1;
    double seconds;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "idn|p:udp_blast_send", &fd, &seconds, &size, &gso)) return NULL;
    if (size < 1 || size > 65507 || seconds <= 0) {
        PyErr_SetString(PyExc_ValueError, "datagram_bytes must be 1..65507 and seconds > 0");
        return NULL;
    }
    int per_send = gso ? (int)(GSO_MAX_BYTES / size) : 1;
    if (per_send < 1) per_send = 1;
    if (per_send > 64) per_send = 64; /* the kernel's UDP_MAX_SEGMENTS */
    size_t len = (size_t)per_send * (size_t)size;
    uint8_t *buf = PyMem_RawMalloc(len);
    if (buf == NULL) return PyErr_NoMemory();
    memset(buf, 0x5A, len);
    long long datagrams = 0, eagain = 0;
    int err = 0;
    Span span;
    Py_BEGIN_ALLOW_THREADS
    span_start(&span);
    double end = span.wall0 + seconds;
    char control[CMSG_SPACE(sizeof(uint16_t))];
    struct iovec iov = {buf, len};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (gso && per_send > 1) {
        wx_udp_segment_cmsg(&msg, control, sizeof control, (uint16_t)size);
    }
    for (int n = 0;; n++) {
        if ((n & 63) == 0 && mono_s() >= end) break;
        if (sendmsg(fd, &msg, 0) >= 0) datagrams += per_send;
        else if ((err = send_failure(errno, &eagain)) != 0) break;
    }
    span_stop(&span);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(buf);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(LLddL)", datagrams, datagrams * (long long)size, span.cpu1 - span.cpu0,
                         span.wall1 - span.wall0, eagain);
}

/* udp_blast_sink(fd, idle_s, timeout_s) -> (datagrams, payload_bytes, cpu_s, span_s)
 * Receives until no datagram came for idle_s after the first, or timeout_s in all.
 * span_s runs from the first to the last receive, so start-up does not dilute the rate;
 * cpu_s covers the same span (plus one last idle poll). GRO is turned on if the kernel has it. */
static PyObject *udp_blast_sink(PyObject *self, PyObject *args) {
    int fd;
    double idle_s, timeout_s;
    if (!PyArg_ParseTuple(args, "idd:udp_blast_sink", &fd, &idle_s, &timeout_s)) return NULL;
    int on = 1;
    (void)setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof on);
    uint8_t *buf = PyMem_RawMalloc((size_t)SINK_SLOTS * SINK_SLOT_BYTES);
    if (buf == NULL) return PyErr_NoMemory();
    struct mmsghdr msgs[SINK_SLOTS];
    struct iovec iovs[SINK_SLOTS];
    long long datagrams = 0, bytes = 0;
    double first = 0, last = 0, cpu_first = 0, cpu_last = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    double deadline = mono_s() + timeout_s;
    for (;;) {
        double now = mono_s();
        double wait = first > 0 ? last + idle_s - now : deadline - now;
        if (now >= deadline || wait <= 0) break;
        struct pollfd p = {fd, POLLIN, 0};
        int pr = poll(&p, 1, (int)(wait * 1000) + 1);
        if (pr < 0 && errno != EINTR) {
            err = errno;
            break;
        }
        if (pr <= 0) continue;
        for (;;) {
            for (int i = 0; i < SINK_SLOTS; i++) {
                iovs[i].iov_base = buf + (size_t)i * SINK_SLOT_BYTES;
                iovs[i].iov_len = SINK_SLOT_BYTES;
                memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
                msgs[i].msg_hdr.msg_iov = &iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            int n = recvmmsg(fd, msgs, SINK_SLOTS, MSG_DONTWAIT, NULL);
            if (n <= 0) break;
            if (first == 0) {
                first = mono_s();
                cpu_first = thread_cpu_s();
            }
            for (int i = 0; i < n; i++) bytes += msgs[i].msg_len;
            /* GRO merges equal-size datagrams; count by the sender's size is not known
             * here, so datagrams counts messages (merged or not). */
            datagrams += n;
            last = mono_s();
            cpu_last = thread_cpu_s();
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(buf);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(LLdd)", datagrams, bytes, cpu_last - cpu_first, last - first);
}

/* udp_flood_send(fd, seconds, pool, lengths) -> (datagrams, payload_bytes, cpu_s, wall_s, eagain)
 * fd must be connected. The datagrams are pool's bytes cut at lengths (each 1..65507), sent in
 * sendmmsg batches of up to 64, cycled until seconds have passed: the rate one core reaches
 * with datagrams a caller chose (random, truncated, oversize, protocol look-alikes). */
static PyObject *udp_flood_send(PyObject *self, PyObject *args) {
    int fd;
    double seconds;
    Py_buffer pool = {0};
    PyObject *o_lengths;
    if (!PyArg_ParseTuple(args, "idy*O:udp_flood_send", &fd, &seconds, &pool, &o_lengths)) return NULL;
    PyObject *seq = PySequence_Fast(o_lengths, "lengths must be a sequence of ints");
    if (seq == NULL) {
        PyBuffer_Release(&pool);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    struct mmsghdr *msgs = n > 0 ? PyMem_Calloc((size_t)n, sizeof *msgs) : NULL;
    struct iovec *iovs = n > 0 ? PyMem_Calloc((size_t)n, sizeof *iovs) : NULL;
    PyObject *res = NULL;
    if (seconds <= 0 || n < 1) {
        PyErr_SetString(PyExc_ValueError, "seconds must be > 0 and lengths not empty");
        goto done;
    }
    if (msgs == NULL || iovs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (len == -1 && PyErr_Occurred()) goto done;
        if (len < 1 || len > 65507 || pos + len > pool.len) {
            PyErr_Format(PyExc_ValueError, "lengths[%zd]: %zd is not 1..65507 or runs past the pool",
                         i, len);
            goto done;
        }
        iovs[i].iov_base = (uint8_t *)pool.buf + pos;
        iovs[i].iov_len = (size_t)len;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        pos += len;
    }
    long long datagrams = 0, bytes = 0, eagain = 0;
    int err = 0;
    Span span;
    Py_BEGIN_ALLOW_THREADS
    span_start(&span);
    double end = span.wall0 + seconds;
    Py_ssize_t next = 0;
    for (int k = 0;; k++) {
        if ((k & 15) == 0 && mono_s() >= end) break;
        unsigned int batch = (unsigned int)(n - next < 64 ? n - next : 64);
        int rc = sendmmsg(fd, msgs + next, batch, 0);
        if (rc > 0) {
            for (int j = 0; j < rc; j++) bytes += (long long)iovs[next + j].iov_len;
            datagrams += rc;
            next = (next + rc) % n;
        } else if (errno == EMSGSIZE) {
            next = (next + 1) % n; /* the stack refused this one: skipped, not counted as sent */
        } else if ((err = send_failure(errno, &eagain)) != 0) {
            break;
        }
    }
    span_stop(&span);
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    res = Py_BuildValue("(LLddL)", datagrams, bytes, span.cpu1 - span.cpu0, span.wall1 - span.wall0, eagain);
done:
    PyMem_Free(msgs);
    PyMem_Free(iovs);
    Py_DECREF(seq);
    PyBuffer_Release(&pool);
    return res;
}

/* udp_replay_send(fd, pool, stride) -> (datagrams, payload_bytes, cpu_s, wall_s, eagain)
 * fd must be connected. pool holds datagrams of stride bytes back to back (the last may be
 * shorter), the layout build_data_datagrams produces; each is sent exactly once, as many
 * per UDP_SEGMENT send as fit in GSO_MAX_BYTES (at most 64). Blocking sends. */
static PyObject *udp_replay_send(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer pool = {0};
    Py_ssize_t stride;
    if (!PyArg_ParseTuple(args, "iy*n:udp_replay_send", &fd, &pool, &stride)) return NULL;
    if (stride < 1 || stride > 65507 || pool.len < 1) {
        PyBuffer_Release(&pool);
        PyErr_SetString(PyExc_ValueError, "stride must be 1..65507 and the pool not empty");
        return NULL;
    }
    int per_send = (int)(GSO_MAX_BYTES / stride);
    if (per_send < 1) per_send = 1;
    if (per_send > 64) per_send = 64;
    long long datagrams = 0, eagain = 0;
    int err = 0;
    double cpu0, wall0, cpu1, wall1;
    Py_BEGIN_ALLOW_THREADS
    cpu0 = thread_cpu_s();
    wall0 = mono_s();
    char control[CMSG_SPACE(sizeof(uint16_t))];
    memset(control, 0, sizeof control);
    struct iovec iov;
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    wx_udp_segment_cmsg(&msg, control, sizeof control, (uint16_t)stride);
    Py_ssize_t pos = 0;
    while (pos < pool.len) {
        Py_ssize_t len = (Py_ssize_t)per_send * stride;
        if (len > pool.len - pos) len = pool.len - pos;
        iov.iov_base = (uint8_t *)pool.buf + pos;
        iov.iov_len = (size_t)len;
        ssize_t rc = sendmsg(fd, &msg, 0);
        if (rc >= 0) {
            datagrams += (len + stride - 1) / stride;
            pos += len;
        } else if (errno == EAGAIN || errno == ENOBUFS) {
            eagain++;
        } else if (errno == ECONNREFUSED) {
            pos += len; /* the receiver's socket was not there: lost, as on the wire */
        } else if (errno != EINTR) {
            err = errno;
            break;
        }
    }
    cpu1 = thread_cpu_s();
    wall1 = mono_s();
    Py_END_ALLOW_THREADS
    Py_ssize_t sent = pool.len;
    PyBuffer_Release(&pool);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(LnddL)", datagrams, sent, cpu1 - cpu0, wall1 - wall0, eagain);
}

static PyMethodDef methods[] = {
    {"aead_seal", aead_seal, METH_VARARGS,
     "aead_seal(cipher, datagram_bytes, count) -> (cpu_s, wall_s, payload_bytes)."},
    {"udp_blast_send", udp_blast_send, METH_VARARGS,
     "udp_blast_send(fd, seconds, datagram_bytes, gso=True) -> "
     "(datagrams, payload_bytes, cpu_s, wall_s, eagain)."},
    {"udp_blast_sink", udp_blast_sink, METH_VARARGS,
     "udp_blast_sink(fd, idle_s, timeout_s) -> (messages, payload_bytes, cpu_s, span_s)."},
    {"udp_flood_send", udp_flood_send, METH_VARARGS,
     "udp_flood_send(fd, seconds, pool, lengths) -> "
     "(datagrams, payload_bytes, cpu_s, wall_s, eagain)."},
    {"udp_replay_send", udp_replay_send, METH_VARARGS,
     "udp_replay_send(fd, pool, stride) -> (datagrams, pool_bytes, cpu_s, wall_s, eagain)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef limits_module = {
    PyModuleDef_HEAD_INIT, .m_name = "wanxport_lab._limits",
    .m_doc = "The machine's ceilings for the data path's parts (AEAD, raw UDP with GSO/GRO).",
    .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__limits(void) { return PyModule_Create(&limits_module); }
