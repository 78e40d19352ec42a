/*
 * Shared state of the Pacer: the Python type (pacer.c) and the release
 * thread (pacer_thread.c). Everything here is guarded by Pacer.mu, except the
 * free ring slots, which enqueue() fills under produce_mu before publishing.
 */
#ifndef WANXPORT_PACER_H
#define WANXPORT_PACER_H

#include "datapath.h"

#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <time.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

/* One path: its socket, pacing clock and bounded FIFO ring of fixed slots. */
typedef struct {
    int fd; /* -1: path not configured */
    struct sockaddr_storage dest;
    socklen_t dest_len; /* 0: connected socket */
    int gso;
    double rate_bytes_per_s; /* 0 and pps 0: unpaced */
    double pps;
    double t_next; /* CLOCK_MONOTONIC ns: earliest release of the head */
    uint8_t *slots;
    uint32_t *lens;
    int64_t *not_before;
    size_t head, count;
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
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_mutex_t produce_mu; /* one enqueue() at a time; it copies without holding mu */
    pthread_cond_t wake; /* pacer thread waits here */
    pthread_cond_t idle; /* wait_idle() waits here */
    pthread_t thread;
    int started, stop, n_paths, max_batch, gso_segments, gso_wanted, rr;
    size_t capacity, slot_size;
    int64_t spin_ns, burst_ns;
    /* When the release thread will look at the queues again: its timed wait's
     * deadline, INT64_MAX in an untimed wait, INT64_MIN while awake (it re-reads
     * every queue before sleeping). enqueue() wakes it only for a head due before
     * this: a signal per enqueue cost a context switch per core packet. */
    int64_t wake_at;
    PPath *paths;
    Plan *plans;
    struct mmsghdr *msgs;
    struct iovec *iovs;
    uint8_t *cmsgs;
    int *msg_dgs; /* datagrams per message */
} Pacer;

#define CMSG_SLOT CMSG_SPACE(sizeof(uint16_t))

/* When a path's head may leave: its pacing clock, or later if the datagram says so. */
static inline int64_t wx_head_release(const PPath *p) {
    int64_t nb = p->not_before[p->head];
    return (int64_t)p->t_next > nb ? (int64_t)p->t_next : nb;
}

int64_t wx_mono_ns(void);
struct timespec wx_ns_to_ts(int64_t ns);
/* 1 when no path has a queued datagram; caller holds mu. */
int wx_pacer_all_empty(const Pacer *pc);
/* The release thread's body (pthread_create start routine). */
void *wx_pacer_main(void *arg);

#endif
