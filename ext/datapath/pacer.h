/*
 * The Pacer without Python: per-path sockets, rings and pacing clocks, and the
 * release thread that sends what is due (pacer_thread.c). The Python type in
 * pacer_py.c only parses arguments and calls these functions; the ring and the
 * pacing arithmetic are pacer_ring.c.
 *
 * Locking: every field is guarded by mu, except the free ring slots, which
 * wx_pacer_enqueue() fills under produce_mu before publishing them under mu.
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

/* One path: its socket, pacing clock, bounded FIFO ring and counters. */
typedef struct {
    int fd; /* -1: path not configured */
    struct sockaddr_storage dest;
    socklen_t dest_len; /* 0: connected socket */
    int gso;
    WxPaceClock clock;
    WxRing ring;
    int resident; /* the whole ring was made resident (wx_pacer_commit); under produce_mu */
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
/* The two halves of an enqueue, for a producer that writes the slots itself
 * (Pacer.enqueue_data seals straight into them): reserve returns the free
 * room and the first free slot (*tail) and holds produce_mu; the producer
 * fills slots tail, tail + 1, ... (mod capacity, at most room) with their
 * lens/not_before, then commit queues the first `accepted` and releases it. */
size_t wx_pacer_reserve(WxPacer *pc, int path, size_t *tail);
void wx_pacer_commit(WxPacer *pc, int path, size_t accepted);
/* Make every path's whole ring resident now, as wx_pacer_commit() does once a path
 * carries bulk data: for a caller that wants that first-touch cost (the kernel
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
