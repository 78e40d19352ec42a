/*
 * Batched UDP receive: recvmmsg with kernel receive timestamps and UDP GRO.
 * With SO_RXQ_OVFL on, it also returns the socket's cumulative count of
 * datagrams the kernel dropped for a full receive buffer (the value on the
 * newest message), so a flood that overflows the socket is counted, not silent.
 *
 * One call drains up to max_datagrams messages into one caller-owned buffer
 * and describes each datagram with a WxDesc (offset, length, rx_time_ns), the
 * format Receiver.process() takes, so received batches reach the receiver
 * without a Python object per datagram.
 */
#include "datapath.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <time.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#ifndef SO_RXQ_OVFL
#define SO_RXQ_OVFL 40
#endif

#define WX_MAX_BATCH 1024
#define WX_CMSG_SPACE 128

static PyObject *sockaddr_to_tuple(const struct sockaddr_storage *ss) {
    char host[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        return Py_BuildValue("(si)", host, ntohs(a->sin_port));
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        return Py_BuildValue("(si)", host, ntohs(a->sin6_port));
    }
    Py_RETURN_NONE;
}

PyObject *wx_recv_batch(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"fd", "buffer", "max_datagrams", "want_addrs", "quic_addrs", NULL};
    PyObject *o_fd, *o_max, *res = NULL, *desc = NULL, *addrs = NULL;
    Py_buffer buf = {0};
    int want_addrs = 0, quic_addrs = 0;
    long long max_dg;
    struct mmsghdr *msgs = NULL;
    struct iovec *iovs = NULL;
    struct sockaddr_storage *names = NULL;
    uint8_t *ctrl = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Ow*O|pp:recv_batch", kwlist, &o_fd, &buf,
                                     &o_max, &want_addrs, &quic_addrs))
        return NULL;
    int fd = PyObject_AsFileDescriptor(o_fd);
    if (fd < 0) goto done;
    if (wx_int_in_range(o_max, "max_datagrams", 1, WX_MAX_BATCH, &max_dg)) goto done;
    Py_ssize_t slot = buf.len / max_dg;
    if (slot < WX_HEADER_LEN) {
        PyErr_Format(PyExc_ValueError,
                     "buffer: %zd bytes leave less than %d bytes per datagram for %lld datagrams",
                     buf.len, WX_HEADER_LEN, max_dg);
        goto done;
    }
    msgs = PyMem_Calloc(max_dg, sizeof *msgs);
    iovs = PyMem_Calloc(max_dg, sizeof *iovs);
    names = PyMem_Calloc(max_dg, sizeof *names);
    ctrl = PyMem_Calloc(max_dg, WX_CMSG_SPACE);
    if (!msgs || !iovs || !names || !ctrl) {
        PyErr_NoMemory();
        goto done;
    }
    for (long long i = 0; i < max_dg; i++) {
        iovs[i].iov_base = (uint8_t *)buf.buf + i * slot;
        iovs[i].iov_len = (size_t)slot;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &names[i];
        msgs[i].msg_hdr.msg_namelen = sizeof names[i];
        msgs[i].msg_hdr.msg_control = ctrl + i * WX_CMSG_SPACE;
        msgs[i].msg_hdr.msg_controllen = WX_CMSG_SPACE;
    }
    int got, err = 0;
    struct timespec now;
    Py_BEGIN_ALLOW_THREADS
    got = recvmmsg(fd, msgs, (unsigned int)max_dg, MSG_DONTWAIT, NULL);
    if (got < 0) err = errno;
    clock_gettime(CLOCK_REALTIME, &now);
    Py_END_ALLOW_THREADS
    if (got < 0) {
        if (err != EAGAIN && err != EWOULDBLOCK) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        got = 0;
    }
    /* First pass: how many datagrams after splitting GRO-coalesced messages. */
    Py_ssize_t count = 0, truncated = 0;
    long long overflow = -1; /* -1: no message carried SO_RXQ_OVFL */
    int *gso = PyMem_Calloc(got ? got : 1, sizeof(int));
    int64_t *ts = PyMem_Calloc(got ? got : 1, sizeof(int64_t));
    if (!gso || !ts) {
        PyMem_Free(gso);
        PyMem_Free(ts);
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < got; i++) {
        struct msghdr *h = &msgs[i].msg_hdr;
        ts[i] = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec t;
                memcpy(&t, CMSG_DATA(c), sizeof t);
                ts[i] = (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
            } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                memcpy(&gso[i], CMSG_DATA(c), sizeof(int));
            } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
                uint32_t dropped;
                memcpy(&dropped, CMSG_DATA(c), sizeof dropped);
                overflow = (long long)dropped; /* messages come in order: keep the newest */
            }
        }
        if (h->msg_flags & MSG_TRUNC) { /* after the cmsgs: it still carries the drop count */
            truncated++;
            continue;
        }
        unsigned int len = msgs[i].msg_len;
        count += (gso[i] > 0 && len > (unsigned int)gso[i]) ? (len + gso[i] - 1) / gso[i] : 1;
    }
    /* quic_addrs: the address list, but a tuple only for QUIC-looking datagrams
     * (first byte has the fixed bit 0x40), None elsewhere: on a port shared with
     * the control channel aioquic needs the sender of those, and building a
     * tuple per data datagram would cost the hot path. */
    int list_addrs = want_addrs || quic_addrs;
    desc = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(WxDesc));
    if (desc && list_addrs) addrs = PyList_New(count);
    if (desc == NULL || (list_addrs && addrs == NULL)) {
        PyMem_Free(gso);
        PyMem_Free(ts);
        goto done;
    }
    WxDesc *dv = (WxDesc *)PyBytes_AS_STRING(desc);
    Py_ssize_t k = 0;
    for (int i = 0; i < got; i++) {
        if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) continue;
        size_t len = msgs[i].msg_len;
        size_t seg = gso[i] > 0 ? (size_t)gso[i] : len;
        size_t pos = 0;
        PyObject *addr = want_addrs ? sockaddr_to_tuple(&names[i]) : NULL;
        if (want_addrs && addr == NULL) break;
        do {
            size_t l = len - pos < seg ? len - pos : seg;
            const uint8_t *first = (const uint8_t *)buf.buf + i * slot + (Py_ssize_t)pos;
            dv[k].offset = (int64_t)(i * slot + (Py_ssize_t)pos);
            dv[k].length = (int64_t)l;
            dv[k].rx_time_ns = ts[i];
            if (addr == NULL && quic_addrs && l > 0 && (first[0] & WX_QUIC_FIXED_BIT)) {
                addr = sockaddr_to_tuple(&names[i]);
                if (addr == NULL) break;
            }
            if (list_addrs) PyList_SET_ITEM(addrs, k, Py_NewRef(addr ? addr : Py_None));
            k++;
            pos += l;
        } while (pos < len);
        Py_XDECREF(addr);
    }
    PyMem_Free(gso);
    PyMem_Free(ts);
    if (PyErr_Occurred()) goto done;
    res = Py_BuildValue("(nOOnL)", count, desc, addrs ? addrs : Py_None, truncated, overflow);
done:
    Py_XDECREF(desc);
    Py_XDECREF(addrs);
    PyMem_Free(msgs);
    PyMem_Free(iovs);
    PyMem_Free(names);
    PyMem_Free(ctrl);
    PyBuffer_Release(&buf);
    return res;
}

static int set_int_opt(PyObject *args, int level, int opt, int *err) {
    PyObject *o_fd;
    if (!PyArg_ParseTuple(args, "O", &o_fd)) return -2;
    int fd = PyObject_AsFileDescriptor(o_fd);
    if (fd < 0) return -2;
    int one = 1;
    if (setsockopt(fd, level, opt, &one, sizeof one) != 0) {
        *err = errno;
        return -1;
    }
    return 0;
}

PyObject *wx_enable_timestamps(PyObject *self, PyObject *args) {
    int err = 0, rc = set_int_opt(args, SOL_SOCKET, SO_TIMESTAMPNS, &err);
    if (rc == -2) return NULL;
    if (rc == -1) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

PyObject *wx_enable_gro(PyObject *self, PyObject *args) {
    int err = 0, rc = set_int_opt(args, SOL_UDP, UDP_GRO, &err);
    if (rc == -2) return NULL;
    if (rc == -1) {
        if (err == ENOPROTOOPT || err == EINVAL) Py_RETURN_FALSE; /* kernel without GRO */
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_TRUE;
}
