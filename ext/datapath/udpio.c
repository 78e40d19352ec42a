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

int wx_recv_init(WxRecv *r, uint8_t *buf, Py_ssize_t len, int max_msgs) {
    memset(r, 0, sizeof *r);
    r->slot = len / max_msgs;
    if (r->slot < WX_HEADER_LEN) {
        PyErr_Format(PyExc_ValueError,
                     "buffer: %zd bytes leave less than %d bytes per datagram for %d datagrams",
                     len, WX_HEADER_LEN, max_msgs);
        return -1;
    }
    r->buf = buf;
    r->max_msgs = max_msgs;
    r->msgs = PyMem_Calloc(max_msgs, sizeof *r->msgs);
    r->iovs = PyMem_Calloc(max_msgs, sizeof *r->iovs);
    r->names = PyMem_Calloc(max_msgs, sizeof *r->names);
    r->ctrl = PyMem_Calloc(max_msgs, WX_CMSG_SPACE);
    r->gso = PyMem_Calloc(max_msgs, sizeof *r->gso);
    r->ts = PyMem_Calloc(max_msgs, sizeof *r->ts);
    if (!r->msgs || !r->iovs || !r->names || !r->ctrl || !r->gso || !r->ts) {
        wx_recv_free(r);
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < max_msgs; i++) {
        r->iovs[i].iov_base = buf + i * r->slot;
        r->iovs[i].iov_len = (size_t)r->slot;
        r->msgs[i].msg_hdr.msg_iov = &r->iovs[i];
        r->msgs[i].msg_hdr.msg_iovlen = 1;
    }
    return 0;
}

void wx_recv_free(WxRecv *r) {
    PyMem_Free(r->msgs);
    PyMem_Free(r->iovs);
    PyMem_Free(r->names);
    PyMem_Free(r->ctrl);
    PyMem_Free(r->gso);
    PyMem_Free(r->ts);
    memset(r, 0, sizeof *r);
}

int wx_recv_messages(WxRecv *r, int fd) {
    for (int i = 0; i < r->max_msgs; i++) { /* the kernel rewrote these on the last call */
        struct msghdr *h = &r->msgs[i].msg_hdr;
        h->msg_name = &r->names[i];
        h->msg_namelen = sizeof r->names[i];
        h->msg_control = r->ctrl + i * WX_CMSG_SPACE;
        h->msg_controllen = WX_CMSG_SPACE;
        h->msg_flags = 0;
    }
    int got = recvmmsg(fd, r->msgs, (unsigned int)r->max_msgs, MSG_DONTWAIT, NULL);
    int err = got < 0 ? errno : 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    r->got = 0;
    r->count = 0;
    r->truncated = 0;
    if (got < 0) return (err == EAGAIN || err == EWOULDBLOCK) ? 0 : -err;
    r->got = got;
    /* How many datagrams after splitting GRO-coalesced messages. */
    for (int i = 0; i < got; i++) {
        struct msghdr *h = &r->msgs[i].msg_hdr;
        r->ts[i] = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
        r->gso[i] = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec t;
                memcpy(&t, CMSG_DATA(c), sizeof t);
                r->ts[i] = (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
            } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                memcpy(&r->gso[i], CMSG_DATA(c), sizeof(int));
            } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
                uint32_t dropped;
                memcpy(&dropped, CMSG_DATA(c), sizeof dropped);
                r->overflow = (long long)dropped; /* messages come in order: keep the newest */
            }
        }
        if (h->msg_flags & MSG_TRUNC) { /* after the cmsgs: it still carries the drop count */
            r->truncated++;
            continue;
        }
        unsigned int len = r->msgs[i].msg_len;
        int seg = r->gso[i];
        r->count += (seg > 0 && len > (unsigned int)seg) ? (len + seg - 1) / seg : 1;
    }
    return got;
}

void wx_recv_describe(const WxRecv *r, WxDesc *dv, int *msg_of) {
    Py_ssize_t k = 0;
    for (int i = 0; i < r->got; i++) {
        if (r->msgs[i].msg_hdr.msg_flags & MSG_TRUNC) continue;
        size_t len = r->msgs[i].msg_len;
        size_t seg = r->gso[i] > 0 ? (size_t)r->gso[i] : len;
        size_t pos = 0;
        do {
            size_t l = len - pos < seg ? len - pos : seg;
            dv[k].offset = (int64_t)(i * r->slot + (Py_ssize_t)pos);
            dv[k].length = (int64_t)l;
            dv[k].rx_time_ns = r->ts[i];
            msg_of[k] = i;
            k++;
            pos += l;
        } while (pos < len);
    }
}

PyObject *wx_recv_sender(const WxRecv *r, int msg) {
    return sockaddr_to_tuple(&r->names[msg]);
}

PyObject *wx_recv_batch(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"fd", "buffer", "max_datagrams", "want_addrs", "quic_addrs", NULL};
    PyObject *o_fd, *o_max, *res = NULL, *desc = NULL, *addrs = NULL;
    Py_buffer buf = {0};
    int want_addrs = 0, quic_addrs = 0, *msg_of = NULL;
    long long max_dg;
    WxRecv r = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Ow*O|pp:recv_batch", kwlist, &o_fd, &buf,
                                     &o_max, &want_addrs, &quic_addrs))
        return NULL;
    int fd = PyObject_AsFileDescriptor(o_fd);
    if (fd < 0) goto done;
    if (wx_int_in_range(o_max, "max_datagrams", 1, WX_MAX_BATCH, &max_dg)) goto done;
    if (wx_recv_init(&r, buf.buf, buf.len, (int)max_dg)) goto done;
    r.overflow = -1; /* -1: no message carried SO_RXQ_OVFL */
    int got;
    Py_BEGIN_ALLOW_THREADS
    got = wx_recv_messages(&r, fd);
    Py_END_ALLOW_THREADS
    if (got < 0) {
        errno = -got;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    Py_ssize_t count = r.count;
    /* quic_addrs: the address list, but a tuple only for QUIC-looking datagrams
     * (first byte has the fixed bit 0x40), None elsewhere: on a port shared with
     * the control channel aioquic needs the sender of those, and building a
     * tuple per data datagram would cost the hot path. */
    int list_addrs = want_addrs || quic_addrs;
    desc = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(WxDesc));
    msg_of = PyMem_Malloc((count ? count : 1) * sizeof(int));
    if (desc && list_addrs) addrs = PyList_New(count);
    if (desc == NULL || msg_of == NULL || (list_addrs && addrs == NULL)) {
        if (msg_of == NULL) PyErr_NoMemory();
        goto done;
    }
    WxDesc *dv = (WxDesc *)PyBytes_AS_STRING(desc);
    wx_recv_describe(&r, dv, msg_of);
    PyObject *addr = NULL;
    int addr_of = -1;
    for (Py_ssize_t k = 0; list_addrs && k < count; k++) {
        const uint8_t *first = (const uint8_t *)buf.buf + dv[k].offset;
        int quic = dv[k].length > 0 && (first[0] & WX_QUIC_FIXED_BIT);
        if (msg_of[k] != addr_of && (want_addrs || quic)) { /* one tuple per message */
            Py_XDECREF(addr);
            addr = sockaddr_to_tuple(&r.names[msg_of[k]]);
            addr_of = msg_of[k];
            if (addr == NULL) goto done;
        }
        PyObject *item = (want_addrs || quic) ? addr : Py_None;
        PyList_SET_ITEM(addrs, k, Py_NewRef(item));
    }
    Py_XDECREF(addr);
    res = Py_BuildValue("(nOOnL)", count, desc, addrs ? addrs : Py_None, r.truncated, r.overflow);
done:
    Py_XDECREF(desc);
    Py_XDECREF(addrs);
    PyMem_Free(msg_of);
    wx_recv_free(&r);
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
