/*
 * The Pacer without Python: per-path sockets, rings and pacing clocks, and the
 * release thread that sends what is due (pacer_thread.c). The Python type in
 * pacer_py.c only parses arguments and calls these functions; the ring and the
 * pacing arithmetic are pacer_ring.c.
 *
 * DATA is queued unsealed: an entry names a data run (a slice of a shard, its
 * key and packet numbers) and the release thread seals each datagram into its
 * own small scratch just before the sendmmsg that carries it. So the bytes are
 * written once, into memory that stays in cache, and read once by the kernel,
 * instead of being sealed by the producer into a ring of many megabytes that the
 * release thread (on another core) reads back later: measured, that was half of
 * the sender's sealing cost.
 *
 * Locking: every field is guarded by mu, except the free ring entries and raw
 * slots, which a producer fills under produce_mu before publishing them under mu.
 */
#ifndef WANXPORT_PACER_H
#define WANXPORT_PACER_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* sendmmsg, struct mmsghdr; as Python.h defines it */
#endif

#include "pacer_ring.h"

#include "../common/wx_udp.h"

#include <netinet/in.h>
#include <netinet/udp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

/* A slice of a shard queued as DATA datagrams, sealed when they leave. Entries of
 * one run are contiguous in their ring, with sub = 0, 1, ... */
typedef struct WxDataRun {
    const uint8_t *data; /* the slice's first byte */
    uint64_t offset;     /* of that byte in its shard */
    uint64_t length;     /* bytes in the slice */
    uint64_t first_pn;
    uint32_t conn_id, shard_id;
    uint32_t segment; /* payload bytes per datagram; the last may carry fewer */
    uint16_t path_id;
    uint8_t key_phase;
    size_t left;  /* its datagrams still queued (under mu) */
    void *key;    /* the sealing key, opaque here: WxPacerConfig.seal uses it */
    struct WxDataRun *prev, *next; /* on the pacer's live list, then on its done list */
} WxDataRun;

/* Payload bytes of datagram i of a run: a full segment, the last one what is left. */
static inline size_t wx_run_chunk(const WxDataRun *run, size_t i) {
    uint64_t off = (uint64_t)i * run->segment;
    return (size_t)(run->length - off < run->segment ? run->length - off : run->segment);
}

/* Seal datagrams first .. first + n - 1 of a run into out, stride bytes apart;
 * 0, or -1 if the AEAD failed. Called by the release thread without any lock. */
typedef int (*WxSealRun)(const WxDataRun *run, size_t first, size_t n, uint8_t *out,
                         size_t stride);

/* One path: its socket, pacing clock, bounded FIFO ring and counters. */
typedef struct {
    int fd; /* -1: path not configured */
    struct sockaddr_storage dest;
    socklen_t dest_len; /* 0: connected socket */
    int gso;
    WxPaceClock clock;
    WxRing ring;
    int resident; /* the raw slots were made resident (wx_pacer_commit); under produce_mu */
    /* Sealed datagrams a send could not take (a full socket buffer, a GSO refusal): the
     * first carry_n queued entries leave from here, never sealed twice (release thread). */
    uint8_t *carry;
    size_t carry_n;
    uint64_t sent_datagrams, sent_bytes, send_errors, gso_sends, eagain;
} PPath;

/* What the thread decided to send from one path in one round. */
typedef struct {
    int path, fd, gso;
    struct sockaddr_storage dest;
    socklen_t dest_len;
    size_t first, k;
} Plan;

typedef struct {
    int n_paths, max_batch, gso, gso_segments;
    size_t capacity, slot_size;
    int64_t spin_ns, burst_ns;
    WxSealRun seal; /* how data runs are sealed; NULL: the pacer takes raw datagrams only */
} WxPacerConfig;

typedef struct {
    pthread_mutex_t mu;
    pthread_mutex_t produce_mu; /* one enqueue at a time; it copies without holding mu */
    pthread_cond_t wake; /* the release thread waits here */
    pthread_cond_t idle; /* wx_pacer_wait_idle() waits here */
    pthread_t thread;
    int started, stop, n_paths, max_batch, gso_segments, gso_wanted, rr;
    size_t capacity, slot_size;
    int64_t spin_ns, burst_ns;
    /* When the release thread will look at the queues again: its timed wait's
     * deadline, INT64_MAX in an untimed wait, INT64_MIN while awake (it re-reads
     * every queue before sleeping). An enqueue wakes it only for a head due before
     * this: a signal per enqueue cost a context switch per core packet. */
    int64_t wake_at;
    /* The release thread's own accounting (under mu): timed or untimed waits it
     * entered, rounds that sent, and its CPU time once it exited. */
    uint64_t sleeps, send_rounds;
    int64_t exit_cpu_ns;
    int exited;
    PPath *paths;
    Plan *plans;
    struct mmsghdr *msgs;
    struct iovec *iovs;
    uint8_t *cmsgs;
    int *msg_dgs; /* datagrams per message */
    uint8_t *scratch; /* max_batch * slot_size: a round's data, sealed just before it is sent */
    uint8_t **dgram;  /* per datagram of the plan being sent: where its bytes are */
    WxSealRun seal;
    WxDataRun *live, *done; /* runs with datagrams queued; runs the glue may release (under mu) */
} WxPacer;

typedef struct {
    uint64_t sent_datagrams, sent_bytes, send_errors, gso_sends, eagain;
    size_t queue_depth;
    int gso;
} WxPathStats;

#define CMSG_SLOT CMSG_SPACE(sizeof(uint16_t))

int64_t wx_mono_ns(void);

/* Allocate, and start the release thread. NULL with *err set (ENOMEM, or
 * pthread_create's error) on failure. The config must already be valid. */
WxPacer *wx_pacer_create(const WxPacerConfig *cfg, int *err);
/* Stop and join the thread (idempotent); queued datagrams are not sent. */
void wx_pacer_stop(WxPacer *pc);
/* Stop, then free everything. */
void wx_pacer_destroy(WxPacer *pc);
/* The socket of a path (fd -1 disables it); dest_len 0 for a connected socket. */
void wx_pacer_set_path(WxPacer *pc, int path, int fd, const struct sockaddr_storage *dest,
                       socklen_t dest_len);
void wx_pacer_set_pacing(WxPacer *pc, int path, double value, int is_pps);
/* Queue up to n datagrams (lengths lens[i] <= slot_size, back to back in src);
 * returns how many fit (a prefix): backpressure, never an unbounded queue. */
size_t wx_pacer_enqueue(WxPacer *pc, int path, const uint8_t *src, const size_t *lens, size_t n,
                        int64_t not_before);

/* Where a producer may write: the free entries from tail (room of them) and the free raw
 * slots from raw_tail (raw_room). */
typedef struct {
    size_t tail, room, raw_tail, raw_room;
} WxReserve;

/* The two halves of an enqueue, for a producer that writes the entries itself
 * (Pacer.enqueue_data queues a data run): reserve holds produce_mu and says
 * where to write; the producer fills entries tail, tail + 1, ... (mod capacity)
 * with lens/not_before/run/sub, then commit queues the first `accepted` (of which
 * `accepted_raw` hold raw slots) and releases produce_mu. A data run whose
 * datagrams were queued (accepted > 0) is the pacer's until wx_pacer_take_done()
 * hands it back; with accepted 0 it stays the producer's. */
WxReserve wx_pacer_reserve(WxPacer *pc, int path);
void wx_pacer_commit(WxPacer *pc, int path, size_t accepted, size_t accepted_raw, WxDataRun *run);
/* Runs whose every datagram has left (or was dropped): the caller releases their
 * buffers and keys. After wx_pacer_stop(), wx_pacer_take_all() hands back every run. */
WxDataRun *wx_pacer_take_done(WxPacer *pc);
WxDataRun *wx_pacer_take_all(WxPacer *pc);
/* Make every path's whole ring resident now, as wx_pacer_commit() does once a path
 * queues bulk raw datagrams: for a caller that wants that first-touch cost (the kernel
 * zeroing each fresh page) paid before it starts measuring. Contents are kept. */
void wx_pacer_make_resident(WxPacer *pc);
/* Block until every queue is empty or timeout_ns passed; 1 if empty. */
int wx_pacer_wait_idle(WxPacer *pc, int64_t timeout_ns);
/* Each path's counters into out[0 .. n_paths - 1]. */
void wx_pacer_stats(WxPacer *pc, WxPathStats *out);

typedef struct {
    double cpu_s; /* the release thread's CPU time (user + system), so far or at exit */
    uint64_t sleeps, send_rounds;
} WxPacerThreadStats;

/* What the release thread itself cost: a bench reports it per GB moved. */
WxPacerThreadStats wx_pacer_thread_stats(WxPacer *pc);

#endif
