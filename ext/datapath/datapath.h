/*
 * Shared declarations of the native data path (wanxport._native).
 *
 * The module is split by responsibility: aead.c (Protector: per-datagram
 * AEAD), packet.c (segmentation + single control datagrams), receiver.c
 * (open, validate, replay-check and place a batch; the replay window is
 * replay.h), the pacer (pacer_ring.c: rings and pacing clock, plain C;
 * pacer_thread.c: the release thread; pacer_py.c: the Python type, the only
 * part that sees Python), udpio.c (batched receive). module.c ties them
 * together and exports the wire constants below.
 */
#ifndef WANXPORT_DATAPATH_H
#define WANXPORT_DATAPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <openssl/evp.h>
#include <sys/socket.h>

/* Wire format v1 constants (docs/wire-format.md); each must equal its
 * definition in wanxport/wire (module.c exports them, a test compares). */
#define WX_HEADER_LEN 16
#define WX_MARKER 0x21
#define WX_QUIC_FIXED_BIT 0x40 /* set in every QUIC packet; never greased by our control side */
#define WX_QUIC_FIXED_BIT 0x40 /* set in every QUIC packet (RFC 9000 §17; never greased here) */
#define WX_FLAG_KEY_PHASE 0x01
#define WX_TAG_LEN 16
#define WX_NONCE_LEN 12
#define WX_KEY_LEN 32
#define WX_FRAME_DATA 0x01
#define WX_DATA_FRAME_HEADER_LEN 15 /* type u8, shard u32, offset u64, len u16 */
#define WX_MAX_OFFSET (((uint64_t)1) << 62)
#define WX_MAX_PN ((((uint64_t)1) << 62) - 1)
#define WX_MAX_UDP_PAYLOAD 65507
#define ACK_RANGES_KEPT 256 /* a path's received-pn record keeps at most these ranges */
#define ACK_FRAME_RANGES 32 /* ranges an ACK frame reports, the newest first */

/* One descriptor of a datagram inside a batch buffer: three native int64s.
 * recv_batch() produces these and Receiver.process() consumes them, so a
 * received batch reaches the receiver without per-datagram Python objects. */
typedef struct {
    int64_t offset;
    int64_t length;
    int64_t rx_time_ns;
} WxDesc;

/* One placed DATA datagram, as returned by Receiver.process(): 32 bytes,
 * native byte order; wanxport/wire/native.py gives the matching numpy dtype. */
typedef struct {
    uint64_t pn;
    uint64_t offset;
    int64_t rx_time_ns;
    uint32_t shard_id;
    uint16_t path_id;
    uint16_t length;
} WxRecord;

static inline void wx_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}
static inline void wx_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static inline void wx_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static inline uint16_t wx_get_u16(const uint8_t *p) {
    return (uint16_t)((p[0] << 8) | p[1]);
}
static inline uint32_t wx_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t wx_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

/* Ask for the cache lines of len bytes at p, to be read (for_write 0) or written (1)
 * soon; nothing is accessed. A hint for a buffer too large to stay in cache (a shard),
 * issued one datagram ahead of its use. Always inlined: GCC finds an out-of-line
 * function of prefetches "pure" and drops its call, and for_write must be a constant. */
static inline __attribute__((always_inline)) void wx_prefetch(const uint8_t *p, size_t len, int for_write) {
    for (const uint8_t *at = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)63); at < p + len; at += 64) {
        if (for_write) __builtin_prefetch(at, 1, 3);
        else __builtin_prefetch(at, 0, 3);
    }
}

/* ---- aead.c ---------------------------------------------------------- */

enum wx_cipher_kind { WX_CIPHER_NULL = 0, WX_CIPHER_AES_GCM = 1, WX_CIPHER_CHACHA = 2 };

typedef struct {
    PyObject_HEAD
    int kind;
    size_t tag_len;
    uint8_t iv[WX_NONCE_LEN];
    EVP_CIPHER_CTX *enc;
    EVP_CIPHER_CTX *dec;
    /* The contexts are stateful; the GIL is released while they are used,
     * so each seal/open holds this mutex. */
    pthread_mutex_t lock;
} WxProtector;

extern PyTypeObject WxProtector_Type;

/* The Protector behind obj, or NULL with TypeError/ValueError naming `name`. */
WxProtector *wx_as_protector(PyObject *obj, const char *name);

/* Seal header (AAD) + the concatenation of pt1 and pt2 into out, which
 * receives n1 + n2 ciphertext bytes followed by the tag. Caller holds
 * p->lock. Returns 0 on success, -1 on an OpenSSL failure. */
int wx_seal(WxProtector *p, const uint8_t *header, const uint8_t *pt1, size_t n1,
            const uint8_t *pt2, size_t n2, uint8_t *out);
/* Open ct (n bytes including the tag) into out (n - tag_len bytes). Caller
 * holds p->lock and guarantees n >= tag_len. Returns 0 if authentic. */
int wx_open(WxProtector *p, const uint8_t *header, const uint8_t *ct, size_t n, uint8_t *out);

/* One DATA datagram at d: header (marker, key phase, path, conn, pn), then the
 * sealed DATA frame (shard, offset, n bytes of data) and the tag; d must hold
 * WX_HEADER_LEN + WX_DATA_FRAME_HEADER_LEN + n + tag_len bytes. Caller holds
 * p->lock. 0 on success (packet.c; build_data_datagrams and the pacer's
 * release thread, which seals queued data runs just before it sends them). */
int wx_seal_data(WxProtector *p, uint8_t *d, uint32_t conn_id, uint16_t path_id, uint64_t pn,
                 int key_phase, uint32_t shard_id, uint64_t offset, const uint8_t *data, size_t n);

/* ---- packet.c / receiver.c / pacer_py.c / udpio.c ---------------------- */

extern PyTypeObject WxReceiver_Type;
extern PyTypeObject WxPacer_Type;
extern PyTypeObject WxAckRecord_Type; /* ack_record.c */

PyObject *wx_seal_packet(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *wx_open_packet(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *wx_seal_batch(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *wx_open_batch(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *wx_build_data_datagrams(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *wx_recv_batch(PyObject *self, PyObject *args, PyObject *kwargs);

/* ---- udpio.c: batched receive, shared by recv_batch() and Receiver.drain() ---- */

#define WX_MAX_BATCH 1024 /* messages one recvmmsg call may take */
#define WX_CMSG_SPACE 128 /* ancillary bytes per message: timestamp, GRO size, drop count */

/* One recvmmsg call's state over a caller's buffer of max_msgs equal slots, reused
 * call after call. After wx_recv_messages: got messages, count datagrams once
 * GRO-coalesced messages are split, truncated messages larger than a slot (dropped),
 * and overflow, the socket's SO_RXQ_OVFL drop count on the newest message that
 * carried one (left as it was when none did). */
typedef struct {
    uint8_t *buf;
    Py_ssize_t slot;
    int max_msgs, got;
    Py_ssize_t count, truncated;
    long long overflow;
    struct mmsghdr *msgs;
    struct iovec *iovs;
    struct sockaddr_storage *names;
    uint8_t *ctrl;
    int *gso;
    int64_t *ts;
} WxRecv;

/* 0, or -1 with a Python error (the slots too small, or no memory). */
int wx_recv_init(WxRecv *r, uint8_t *buf, Py_ssize_t len, int max_msgs);
void wx_recv_free(WxRecv *r);
/* One non-blocking recvmmsg (no GIL needed): messages received, 0 when none
 * waited, or -errno. */
int wx_recv_messages(WxRecv *r, int fd);
/* The count datagrams of the last call, in order, each with the message it came in. */
void wx_recv_describe(const WxRecv *r, WxDesc *dv, int *msg_of);
/* The sender of message msg of the last call: (host, port), or None. */
PyObject *wx_recv_sender(const WxRecv *r, int msg);
PyObject *wx_enable_timestamps(PyObject *self, PyObject *args);
PyObject *wx_enable_gro(PyObject *self, PyObject *args);
PyObject *wx_fold_runs(PyObject *self, PyObject *arg);

/* Parse an int argument into [lo, hi] or raise ValueError naming it. */
int wx_int_in_range(PyObject *obj, const char *name, long long lo, long long hi, long long *out);

/* Datagrams of at most max_payload bytes that carry length bytes from packet number first_pn
 * into *count, or raise ValueError when the last one's number would pass 2^62-1. */
int wx_data_run_count(long long first_pn, long long length, long long max_payload, long long *count);

#endif
