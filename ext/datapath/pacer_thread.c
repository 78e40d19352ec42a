/*
 * The Pacer's release thread: never touches the GIL or any Python object.
 *
 * Each round it finds the earliest due head over all paths, sleeps until it
 * (pthread_cond_timedwait on CLOCK_MONOTONIC, absolute, timer slack 1 ns; an
 * enqueue() of an earlier datagram wakes it), spins the last spin_ns, then
 * plans every datagram due within burst_ns (advancing each path's pacing
 * clock), sends without the lock, and commits the result under the lock.
 * Only a datagram due before its planned wake-up wakes it early (wake_at).
 */
#include "pacer.h"

#include <errno.h>
#include <poll.h>
#include <sys/prctl.h>

#define GSO_MAX_BYTES 65000 /* one GSO send stays below the 64 KiB IP limit */
#define MAX_LAG_NS 1000000  /* a late thread catches up at most 1 ms of sends */

int64_t wx_mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

struct timespec wx_ns_to_ts(int64_t ns) {
    struct timespec t = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    return t;
}

int wx_pacer_all_empty(const Pacer *pc) {
    for (int i = 0; i < pc->n_paths; i++)
        if (pc->paths[i].count) return 0;
    return 1;
}

static double interval_ns(const PPath *p, uint32_t len) {
    if (p->pps > 0) return 1e9 / p->pps;
    if (p->rate_bytes_per_s > 0) return (double)len * 1e9 / p->rate_bytes_per_s;
    return 0;
}

/* Under the lock: pick every due datagram (release <= now + burst_ns), up to
 * max_batch over all paths, advancing each path's pacing clock. */
static int plan_round(Pacer *pc, int64_t now) {
    int n_plans = 0, budget = pc->max_batch;
    for (int step = 0; step < pc->n_paths && budget > 0; step++) {
        int i = (pc->rr + step) % pc->n_paths;
        PPath *p = &pc->paths[i];
        if (p->fd < 0 || p->count == 0) continue;
        double t = p->t_next > (double)(now - MAX_LAG_NS) ? p->t_next : (double)(now - MAX_LAG_NS);
        size_t k = 0;
        while (k < p->count && (int)k < budget) {
            size_t idx = (p->head + k) % pc->capacity;
            double rel = (double)p->not_before[idx] > t ? (double)p->not_before[idx] : t;
            if (rel > (double)(now + pc->burst_ns)) break;
            t = rel + interval_ns(p, p->lens[idx]);
            k++;
        }
        if (k == 0) continue;
        p->t_next = t;
        Plan *pl = &pc->plans[n_plans++];
        pl->path = i;
        pl->fd = p->fd;
        pl->gso = p->gso;
        pl->dest = p->dest;
        pl->dest_len = p->dest_len;
        pl->first = p->head;
        pl->k = k;
        budget -= (int)k;
    }
    pc->rr = (pc->rr + 1) % pc->n_paths;
    return n_plans;
}

typedef struct {
    size_t done; /* prefix of the plan sent or dropped */
    uint64_t bytes, datagrams, errors, gso_sends, eagain;
    int gso_failed;
} SendResult;

/* Without the lock: the planned slots are not touched by enqueue() (they are
 * still counted as queued). */
static SendResult send_plan(Pacer *pc, const Plan *pl) {
    SendResult r = {0};
    const PPath *p = &pc->paths[pl->path];
    int nmsg = 0;
    size_t j = 0;
    while (j < pl->k) {
        size_t idx = (pl->first + j) % pc->capacity;
        uint32_t seg = p->lens[idx];
        struct msghdr *h = &pc->msgs[nmsg].msg_hdr;
        memset(h, 0, sizeof *h);
        h->msg_iov = &pc->iovs[j];
        if (pl->dest_len) {
            h->msg_name = (void *)&pl->dest;
            h->msg_namelen = pl->dest_len;
        }
        size_t n = 0, total = 0;
        while (j < pl->k) {
            size_t id2 = (pl->first + j) % pc->capacity;
            uint32_t len = p->lens[id2];
            if (n > 0 && (!pl->gso || len > seg || (int)n >= pc->gso_segments ||
                          total + len > GSO_MAX_BYTES))
                break;
            pc->iovs[j].iov_base = p->slots + id2 * pc->slot_size;
            pc->iovs[j].iov_len = len;
            n++;
            total += len;
            j++;
            if (len < seg) break; /* a shorter datagram ends a GSO run */
        }
        h->msg_iovlen = n;
        if (n > 1) {
            uint8_t *cbuf = pc->cmsgs + (size_t)nmsg * CMSG_SLOT;
            memset(cbuf, 0, CMSG_SLOT);
            h->msg_control = cbuf;
            h->msg_controllen = CMSG_SLOT;
            struct cmsghdr *c = CMSG_FIRSTHDR(h);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t gso_size = (uint16_t)seg;
            memcpy(CMSG_DATA(c), &gso_size, sizeof gso_size);
        }
        pc->msg_dgs[nmsg] = (int)n;
        nmsg++;
    }
    int m = 0;
    while (m < nmsg) {
        int sent = sendmmsg(pl->fd, pc->msgs + m, (unsigned int)(nmsg - m), MSG_DONTWAIT);
        if (sent > 0) {
            for (int q = m; q < m + sent; q++) {
                r.done += (size_t)pc->msg_dgs[q];
                r.datagrams += (uint64_t)pc->msg_dgs[q];
                for (size_t v = 0; v < pc->msgs[q].msg_hdr.msg_iovlen; v++)
                    r.bytes += pc->msgs[q].msg_hdr.msg_iov[v].iov_len;
                if (pc->msg_dgs[q] > 1) r.gso_sends++;
            }
            m += sent;
            continue;
        }
        int e = errno;
        if (e == EINTR) continue;
        if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS) {
            r.eagain++;
            break;
        }
        if ((e == EINVAL || e == EIO) && pc->msg_dgs[m] > 1) {
            r.gso_failed = 1; /* the rest stays queued and goes without GSO */
            break;
        }
        r.errors += (uint64_t)pc->msg_dgs[m]; /* UDP semantics: count and drop */
        r.done += (size_t)pc->msg_dgs[m];
        m++;
    }
    return r;
}

void *wx_pacer_main(void *arg) {
    Pacer *pc = arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    pthread_mutex_lock(&pc->mu);
    while (!pc->stop) {
        int64_t now = wx_mono_ns(), best = INT64_MAX;
        for (int i = 0; i < pc->n_paths; i++) {
            PPath *p = &pc->paths[i];
            if (p->fd >= 0 && p->count) {
                int64_t rel = wx_head_release(p);
                if (rel < best) best = rel;
            }
        }
        if (best == INT64_MAX) {
            if (wx_pacer_all_empty(pc)) pthread_cond_broadcast(&pc->idle);
            pc->wake_at = INT64_MAX;
            pthread_cond_wait(&pc->wake, &pc->mu);
            pc->wake_at = INT64_MIN;
            continue;
        }
        /* Wake when the earliest head is due; plan_round() then also takes
         * what falls due within burst_ns, so a burst window batches sends
         * instead of merely shifting the schedule earlier. */
        if (best > now + pc->spin_ns) {
            pc->wake_at = best - pc->spin_ns;
            struct timespec ts = wx_ns_to_ts(pc->wake_at);
            pthread_cond_timedwait(&pc->wake, &pc->mu, &ts);
            pc->wake_at = INT64_MIN;
            continue;
        }
        if (best > now) {
            pthread_mutex_unlock(&pc->mu);
            while (wx_mono_ns() < best) {
            }
            pthread_mutex_lock(&pc->mu);
            continue;
        }
        int n_plans = plan_round(pc, now);
        pthread_mutex_unlock(&pc->mu);
        SendResult res[n_plans > 0 ? n_plans : 1];
        int backoff_fd = -1;
        for (int i = 0; i < n_plans; i++) {
            res[i] = send_plan(pc, &pc->plans[i]);
            if (res[i].eagain) backoff_fd = pc->plans[i].fd;
        }
        if (backoff_fd >= 0) { /* socket buffer full: wait for room, briefly */
            struct pollfd pfd = {.fd = backoff_fd, .events = POLLOUT};
            poll(&pfd, 1, 1);
        }
        pthread_mutex_lock(&pc->mu);
        for (int i = 0; i < n_plans; i++) {
            PPath *p = &pc->paths[pc->plans[i].path];
            p->head = (p->head + res[i].done) % pc->capacity;
            p->count -= res[i].done;
            p->sent_datagrams += res[i].datagrams;
            p->sent_bytes += res[i].bytes;
            p->send_errors += res[i].errors;
            p->gso_sends += res[i].gso_sends;
            p->eagain += res[i].eagain;
            if (res[i].gso_failed) p->gso = 0;
        }
    }
    pthread_cond_broadcast(&pc->idle);
    pthread_mutex_unlock(&pc->mu);
    return NULL;
}
