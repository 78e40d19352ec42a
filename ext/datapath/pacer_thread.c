/*
 * The Pacer's threading: its lifecycle, the calls that hand it work under its
 * lock, and the release thread. Nothing here touches Python (pacer_py.c is
 * the glue) or does pacing arithmetic (pacer_ring.c).
 *
 * Each round the release thread finds the earliest due head over all paths,
 * sleeps until it (pthread_cond_timedwait on CLOCK_MONOTONIC, absolute, timer
 * slack 1 ns: the same hrtimer as clock_nanosleep(TIMER_ABSTIME), but an
 * enqueue of an earlier datagram can wake it), spins the last spin_ns, then
 * plans every datagram due within its burst window (burst_window_ns; advancing its pacing
 * clock), sends without the lock via sendmmsg, and commits the result under
 * the lock. Runs of equal-size datagrams become one UDP GSO send where the
 * kernel supports it (UDP_SEGMENT; disabled per path on EINVAL/EIO). DATA
 * entries are sealed into the thread's scratch just before their send
 * (stage_plan); what a send could not take stays sealed in the path's carry.
 */
#include "pacer.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#define GSO_MAX_BYTES 65000 /* one GSO send stays below the 64 KiB IP limit */
/* A slow path's burst window grows until its burst fills one GSO send, up to this:
 * at 100 Mb/s a 0.5 ms window sends ~9 datagrams a syscall, and the kernel's cost is
 * per send. A fast path fills a send within burst_ns and keeps that window, so no
 * burst grows by more than one GSO send's bytes. */
#define BURST_MAX_NS 2000000

int64_t wx_mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static struct timespec ns_to_ts(int64_t ns) {
    struct timespec t = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    return t;
}

/* 1 when no path has a queued datagram; caller holds mu. */
static int all_empty(const WxPacer *pc) {
    for (int i = 0; i < pc->n_paths; i++)
        if (pc->paths[i].ring.count) return 0;
    return 1;
}

/* ---- lifecycle --------------------------------------------------------- */

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

static void *pacer_main(void *arg);

static void pacer_free(WxPacer *pc) {
    if (pc->paths)
        for (int i = 0; i < pc->n_paths; i++) {
            wx_ring_free(&pc->paths[i].ring);
            free(pc->paths[i].carry);
        }
    free(pc->paths);
    free(pc->plans);
    free(pc->msgs);
    free(pc->iovs);
    free(pc->cmsgs);
    free(pc->msg_dgs);
    free(pc->scratch);
    free(pc->dgram);
    pthread_cond_destroy(&pc->wake);
    pthread_cond_destroy(&pc->idle);
    pthread_mutex_destroy(&pc->mu);
    pthread_mutex_destroy(&pc->produce_mu);
    free(pc);
}

WxPacer *wx_pacer_create(const WxPacerConfig *cfg, int *err) {
    WxPacer *pc = calloc(1, sizeof *pc);
    if (pc == NULL) {
        *err = ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&pc->mu, NULL);
    pthread_mutex_init(&pc->produce_mu, NULL);
    init_monotonic_cond(&pc->wake);
    init_monotonic_cond(&pc->idle);
    pc->n_paths = cfg->n_paths;
    pc->capacity = cfg->capacity;
    pc->slot_size = cfg->slot_size;
    pc->max_batch = cfg->max_batch;
    pc->gso_segments = cfg->gso_segments;
    pc->gso_wanted = cfg->gso && kernel_has_gso();
    pc->spin_ns = cfg->spin_ns;
    pc->burst_ns = cfg->burst_ns;
    pc->paths = calloc((size_t)cfg->n_paths, sizeof(PPath));
    pc->plans = calloc((size_t)cfg->n_paths, sizeof(Plan));
    pc->msgs = calloc((size_t)cfg->max_batch, sizeof(struct mmsghdr));
    pc->iovs = calloc((size_t)cfg->max_batch, sizeof(struct iovec));
    pc->cmsgs = calloc((size_t)cfg->max_batch, CMSG_SLOT);
    pc->msg_dgs = calloc((size_t)cfg->max_batch, sizeof(int));
    pc->seal = cfg->seal;
    /* Untouched until a round seals data, and then only as far as its rounds reach. */
    pc->scratch = cfg->seal ? malloc((size_t)cfg->max_batch * cfg->slot_size) : NULL;
    pc->dgram = calloc((size_t)cfg->max_batch, sizeof(uint8_t *));
    int ok = pc->paths && pc->plans && pc->msgs && pc->iovs && pc->cmsgs && pc->msg_dgs &&
             pc->dgram && (pc->scratch || !cfg->seal);
    for (int i = 0; ok && i < pc->n_paths; i++) {
        pc->paths[i].fd = -1;
        ok = wx_ring_init(&pc->paths[i].ring, pc->capacity, pc->slot_size) == 0;
    }
    if (!ok) {
        pacer_free(pc);
        *err = ENOMEM;
        return NULL;
    }
    pc->wake_at = INT64_MIN;
    int rc = pthread_create(&pc->thread, NULL, pacer_main, pc);
    if (rc != 0) {
        pacer_free(pc);
        *err = rc;
        return NULL;
    }
    /* Named before anyone can look: CPU accounting (wanxport.aio.threadcpu) and top -H
     * tell the release thread by it. */
    pthread_setname_np(pc->thread, "wx-release");
    pc->started = 1;
    return pc;
}

void wx_pacer_stop(WxPacer *pc) {
    if (!pc->started) return;
    pthread_mutex_lock(&pc->mu);
    pc->stop = 1;
    pthread_cond_broadcast(&pc->wake);
    pthread_mutex_unlock(&pc->mu);
    pthread_join(pc->thread, NULL);
    pc->started = 0;
}

void wx_pacer_destroy(WxPacer *pc) {
    wx_pacer_stop(pc);
    pacer_free(pc);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* A streak of this many raw datagrams queued without their slots emptying makes the
 * whole ring resident (wx_pacer_commit). */
#define WX_RING_RESIDENT_AFTER 64

/* Fault in every page of [p, p + len) for writing, keeping its contents (so the
 * release thread may be reading queued slots meanwhile). Best effort: an older
 * kernel (EINVAL) leaves the pages to be faulted in as slots are written. */
static void make_resident(void *p, size_t len) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)p & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + len + page - 1) & ~(page - 1);
    (void)madvise((void *)start, end - start, MADV_POPULATE_WRITE);
}

/* Every page of a ring's raw slots and entries; the caller holds produce_mu and has
 * set the path's resident flag. */
static void ring_make_resident(WxRing *r) {
    make_resident(r->slots, r->capacity * r->slot_size);
    make_resident(r->lens, r->capacity * sizeof *r->lens);
    make_resident(r->not_before, r->capacity * sizeof *r->not_before);
    make_resident(r->run, r->capacity * sizeof *r->run);
    make_resident(r->sub, r->capacity * sizeof *r->sub);
}

/* ---- calls from the owner (under mu) ------------------------------------ */

void wx_pacer_set_path(WxPacer *pc, int path, int fd, const struct sockaddr_storage *dest,
                       socklen_t dest_len) {
    pthread_mutex_lock(&pc->mu);
    PPath *p = &pc->paths[path];
    p->fd = fd;
    p->dest_len = dest_len;
    if (dest_len) p->dest = *dest;
    p->gso = pc->gso_wanted;
    pthread_cond_signal(&pc->wake);
    pthread_mutex_unlock(&pc->mu);
}

void wx_pacer_set_pacing(WxPacer *pc, int path, double value, int is_pps) {
    pthread_mutex_lock(&pc->mu);
    wx_pace_set(&pc->paths[path].clock, value, is_pps);
    /* No wake-up: the head's release was fixed when its predecessor left; the
     * new rate spaces the datagrams after it. */
    pthread_mutex_unlock(&pc->mu);
}

WxReserve wx_pacer_reserve(WxPacer *pc, int path) {
    /* Fill the free entries without holding mu, so a large enqueue never stalls
     * the release thread: it only reads the queued entries and only advances
     * head, so the tail and the free entries beyond it stay ours until count is
     * raised under mu. produce_mu keeps two producers apart. */
    pthread_mutex_lock(&pc->produce_mu);
    PPath *p = &pc->paths[path];
    pthread_mutex_lock(&pc->mu);
    /* An empty ring starts again at entry 0, and empty raw slots at slot 0 (no plan
     * refers to them: a planned datagram stays counted until it is consumed).
     * Otherwise a path that carries a datagram now and then walks the whole ring,
     * touching a new slot's page each time: a warm session's resident memory grew by
     * up to capacity * slot_size (32 MiB) per path over hours, like a leak. */
    if (p->ring.count == 0) p->ring.head = 0;
    if (p->ring.raw_count == 0) p->ring.raw_head = 0;
    WxReserve r = {wx_ring_index(&p->ring, p->ring.count), wx_ring_room(&p->ring),
                   wx_ring_raw_tail(&p->ring), wx_ring_raw_room(&p->ring)};
    pthread_mutex_unlock(&pc->mu);
    return r;
}

void wx_pacer_commit(WxPacer *pc, int path, size_t accepted, size_t accepted_raw, WxDataRun *run) {
    PPath *p = &pc->paths[path];
    pthread_mutex_lock(&pc->mu);
    int was_empty = p->ring.count == 0;
    if (was_empty) wx_pace_restart(&p->clock, wx_mono_ns());
    wx_ring_publish(&p->ring, accepted, accepted_raw);
    if (run != NULL && accepted > 0) {
        run->left = accepted;
        run->prev = NULL;
        run->next = pc->live;
        if (pc->live) pc->live->prev = run;
        pc->live = run;
    }
    /* A queue that was not empty keeps its head, so the thread's plan stands. */
    if (accepted > 0 && was_empty && p->fd >= 0 &&
        wx_pace_head_release(&p->clock, &p->ring) < pc->wake_at)
        pthread_cond_signal(&pc->wake);
    /* Empty raw slots restart at slot 0 (wx_pacer_reserve), yet a path queueing bulk
     * raw datagrams walks further with each streak in which they never empty, and each
     * longer streak makes more of the ring resident: on the soak's sender that crept
     * towards the bound for hours, which an operator cannot tell from a leak. So once
     * a streak reaches WX_RING_RESIDENT_AFTER slots the whole ring becomes resident at
     * once (outside mu: the release thread goes on): its memory steps to its bound
     * early and then stays constant. DATA never touches the raw slots, and a path that
     * only queues a few raw datagrams at a time (acknowledgements) keeps them small. */
    int populate = !p->resident && p->ring.raw_head + p->ring.raw_count >= WX_RING_RESIDENT_AFTER;
    if (populate) p->resident = 1;
    pthread_mutex_unlock(&pc->mu);
    if (populate) ring_make_resident(&p->ring);
    pthread_mutex_unlock(&pc->produce_mu);
}

static WxDataRun *take_list(WxDataRun **list) {
    WxDataRun *head = *list;
    *list = NULL;
    return head;
}

WxDataRun *wx_pacer_take_done(WxPacer *pc) {
    pthread_mutex_lock(&pc->mu);
    WxDataRun *done = take_list(&pc->done);
    pthread_mutex_unlock(&pc->mu);
    return done;
}

WxDataRun *wx_pacer_take_all(WxPacer *pc) {
    pthread_mutex_lock(&pc->mu);
    WxDataRun *all = take_list(&pc->done), *live = take_list(&pc->live);
    pthread_mutex_unlock(&pc->mu);
    while (live != NULL) { /* onto the done list's singly linked chain */
        WxDataRun *next = live->next;
        live->next = all;
        all = live;
        live = next;
    }
    return all;
}

void wx_pacer_make_resident(WxPacer *pc) {
    pthread_mutex_lock(&pc->produce_mu);
    for (int i = 0; i < pc->n_paths; i++) {
        PPath *p = &pc->paths[i];
        if (p->resident) continue;
        p->resident = 1;
        ring_make_resident(&p->ring);
    }
    pthread_mutex_unlock(&pc->produce_mu);
}

size_t wx_pacer_enqueue(WxPacer *pc, int path, const uint8_t *src, const size_t *lens, size_t n,
                        int64_t not_before) {
    WxReserve r = wx_pacer_reserve(pc, path);
    size_t accepted = wx_ring_fill(&pc->paths[path].ring, r.tail, r.room, r.raw_tail, r.raw_room, src,
                                   lens, n, not_before);
    wx_pacer_commit(pc, path, accepted, accepted, NULL);
    return accepted;
}

int wx_pacer_wait_idle(WxPacer *pc, int64_t timeout_ns) {
    struct timespec deadline = ns_to_ts(wx_mono_ns() + timeout_ns);
    pthread_mutex_lock(&pc->mu);
    while (!all_empty(pc) && !pc->stop) {
        if (pthread_cond_timedwait(&pc->idle, &pc->mu, &deadline) == ETIMEDOUT) break;
    }
    int idle = all_empty(pc);
    pthread_mutex_unlock(&pc->mu);
    return idle;
}

void wx_pacer_stats(WxPacer *pc, WxPathStats *out) {
    pthread_mutex_lock(&pc->mu); /* held briefly: the thread never blocks while holding it */
    for (int i = 0; i < pc->n_paths; i++) {
        const PPath *p = &pc->paths[i];
        out[i] = (WxPathStats){p->sent_datagrams, p->sent_bytes, p->send_errors, p->gso_sends,
                               p->eagain,         p->ring.count, p->gso};
    }
    pthread_mutex_unlock(&pc->mu);
}

WxPacerThreadStats wx_pacer_thread_stats(WxPacer *pc) {
    WxPacerThreadStats st = {0};
    pthread_mutex_lock(&pc->mu);
    st.sleeps = pc->sleeps;
    st.send_rounds = pc->send_rounds;
    int64_t cpu_ns = pc->exit_cpu_ns;
    clockid_t cid;
    struct timespec t;
    /* Until the thread records its exit (under mu, which we hold) it has not
     * returned, so it is not joined and its CPU clock is valid. */
    if (!pc->exited && pthread_getcpuclockid(pc->thread, &cid) == 0 && clock_gettime(cid, &t) == 0)
        cpu_ns = (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
    pthread_mutex_unlock(&pc->mu);
    st.cpu_s = (double)cpu_ns / 1e9;
    return st;
}

/* ---- the release thread -------------------------------------------------- */

/* How far ahead of now a path's due datagrams are sent together: burst_ns, or on a
 * paced path as long as one GSO send's bytes take at its rate, at most BURST_MAX_NS
 * (burst_ns 0 asks for every datagram at its own time, and gets it). */
static int64_t burst_window_ns(const WxPacer *pc, const PPath *p) {
    double rate = p->clock.rate_bytes_per_s;
    if (rate <= 0.0 || pc->burst_ns == 0 || pc->burst_ns >= BURST_MAX_NS) return pc->burst_ns;
    double fill_ns = GSO_MAX_BYTES / rate * 1e9;
    if (fill_ns <= (double)pc->burst_ns) return pc->burst_ns;
    return fill_ns < (double)BURST_MAX_NS ? (int64_t)fill_ns : BURST_MAX_NS;
}

/* Under the lock: pick every due datagram (release <= now + its burst window), up to
 * max_batch over all paths, advancing each path's pacing clock. */
static int plan_round(WxPacer *pc, int64_t now) {
    int n_plans = 0, budget = pc->max_batch;
    for (int step = 0; step < pc->n_paths && budget > 0; step++) {
        int i = (pc->rr + step) % pc->n_paths;
        PPath *p = &pc->paths[i];
        if (p->fd < 0 || p->ring.count == 0) continue;
        size_t k = wx_pace_take_due(&p->clock, &p->ring, now, burst_window_ns(pc, p), (size_t)budget);
        if (k == 0) continue;
        Plan *pl = &pc->plans[n_plans++];
        pl->path = i;
        pl->fd = p->fd;
        pl->gso = p->gso;
        pl->dest = p->dest;
        pl->dest_len = p->dest_len;
        pl->first = p->ring.head;
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

/* Where each of the plan's datagrams is (pc->dgram): carried sealed from an earlier
 * send, in a raw slot, or sealed now into the scratch, each run's datagrams in one
 * seal call. Returns how many are ready: all k, or those before a run whose sealing
 * failed (*failed of its datagrams, which are then dropped). */
static size_t stage_plan(WxPacer *pc, const Plan *pl, size_t *failed) {
    const PPath *p = &pc->paths[pl->path];
    const WxRing *ring = &p->ring;
    size_t j = 0;
    *failed = 0;
    while (j < pl->k) {
        size_t idx = (pl->first + j) % pc->capacity;
        const WxDataRun *run = ring->run[idx];
        if (j < p->carry_n) {
            pc->dgram[j] = p->carry + j * pc->slot_size;
            j++;
        } else if (run == NULL) {
            pc->dgram[j] = wx_ring_slot(ring, ring->sub[idx]);
            j++;
        } else {
            size_t n = 1;
            while (j + n < pl->k && ring->run[(pl->first + j + n) % pc->capacity] == run) n++;
            uint8_t *out = pc->scratch + j * pc->slot_size;
            if (pc->seal == NULL || pc->seal(run, ring->sub[idx], n, out, pc->slot_size) != 0) {
                *failed = n;
                return j;
            }
            for (size_t q = 0; q < n; q++) pc->dgram[j + q] = out + q * pc->slot_size;
            j += n;
        }
    }
    return j;
}

/* After a send that left entries done .. of the plan queued: what of them is sealed
 * (the staged ones, and an older carry beyond the plan) moves to the path's carry, so
 * it leaves as it is next time and is never sealed again under the same nonce. When
 * there is no memory for that, those datagrams are dropped (counted): UDP semantics,
 * the core repairs. Returns the (possibly advanced) done. */
static size_t carry_unsent(WxPacer *pc, const Plan *pl, size_t done, size_t staged,
                           uint64_t *errors) {
    PPath *p = &pc->paths[pl->path];
    size_t end = p->carry_n > staged ? p->carry_n : staged;
    uint8_t *carry = NULL;
    size_t n = end > done ? end - done : 0;
    if (n > 0 && (carry = malloc(n * pc->slot_size)) == NULL) {
        *errors += n;
        done = end;
        n = 0;
    }
    for (size_t q = 0; q < n; q++) {
        size_t j = done + q;
        const uint8_t *src = j < p->carry_n ? p->carry + j * pc->slot_size : pc->dgram[j];
        memcpy(carry + q * pc->slot_size, src, p->ring.lens[(pl->first + j) % pc->capacity]);
    }
    free(p->carry);
    p->carry = carry;
    p->carry_n = n;
    return done;
}

/* Without the lock: the planned entries are not touched by an enqueue (they are
 * still counted as queued), and a path's carry is the release thread's alone. */
static SendResult send_plan(WxPacer *pc, const Plan *pl) {
    SendResult r = {0};
    const WxRing *ring = &pc->paths[pl->path].ring;
    size_t failed, staged = stage_plan(pc, pl, &failed);
    int nmsg = 0;
    size_t j = 0;
    while (j < staged) {
        size_t idx = (pl->first + j) % pc->capacity;
        uint32_t seg = ring->lens[idx];
        struct msghdr *h = &pc->msgs[nmsg].msg_hdr;
        memset(h, 0, sizeof *h);
        h->msg_iov = &pc->iovs[j];
        if (pl->dest_len) {
            h->msg_name = (void *)&pl->dest;
            h->msg_namelen = pl->dest_len;
        }
        size_t n = 0, total = 0;
        while (j < staged) {
            size_t id2 = (pl->first + j) % pc->capacity;
            uint32_t len = ring->lens[id2];
            if (n > 0 && (!pl->gso || len > seg || (int)n >= pc->gso_segments ||
                          total + len > GSO_MAX_BYTES))
                break;
            pc->iovs[j].iov_base = pc->dgram[j];
            pc->iovs[j].iov_len = len;
            n++;
            total += len;
            j++;
            if (len < seg) break; /* a shorter datagram ends a GSO run */
        }
        h->msg_iovlen = n;
        if (n > 1) {
            wx_udp_segment_cmsg(h, (char *)pc->cmsgs + (size_t)nmsg * CMSG_SLOT, CMSG_SLOT,
                                (uint16_t)seg);
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
    if (r.done == staged && failed > 0) { /* a run that could not be sealed: dropped */
        r.errors += failed;
        r.done += failed;
    }
    r.done = carry_unsent(pc, pl, r.done, staged, &r.errors);
    return r;
}

/* The first n queued entries of a path leave the ring: each data run they end is moved
 * from the live list to the done list (the glue releases what it holds for it). Under mu. */
static void finish_entries(WxPacer *pc, WxRing *ring, size_t n) {
    for (size_t k = 0; k < n; k++) {
        WxDataRun *run = ring->run[wx_ring_index(ring, k)];
        if (run == NULL || --run->left > 0) continue;
        if (run->prev) run->prev->next = run->next;
        else pc->live = run->next;
        if (run->next) run->next->prev = run->prev;
        run->prev = NULL;
        run->next = pc->done;
        pc->done = run;
    }
    wx_ring_consume(ring, n);
}

static void *pacer_main(void *arg) {
    WxPacer *pc = arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    pthread_mutex_lock(&pc->mu);
    while (!pc->stop) {
        int64_t now = wx_mono_ns(), best = INT64_MAX;
        for (int i = 0; i < pc->n_paths; i++) {
            PPath *p = &pc->paths[i];
            if (p->fd >= 0 && p->ring.count) {
                int64_t rel = wx_pace_head_release(&p->clock, &p->ring);
                if (rel < best) best = rel;
            }
        }
        if (best == INT64_MAX) {
            if (all_empty(pc)) pthread_cond_broadcast(&pc->idle);
            pc->wake_at = INT64_MAX;
            pc->sleeps++;
            pthread_cond_wait(&pc->wake, &pc->mu);
            pc->wake_at = INT64_MIN;
            continue;
        }
        /* Wake when the earliest head is due; plan_round() then also takes
         * what falls due within burst_ns, so a burst window batches sends
         * instead of merely shifting the schedule earlier. */
        if (best > now + pc->spin_ns) {
            pc->wake_at = best - pc->spin_ns;
            struct timespec ts = ns_to_ts(pc->wake_at);
            pc->sleeps++;
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
        if (n_plans > 0) pc->send_rounds++;
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
            finish_entries(pc, &p->ring, res[i].done);
            p->sent_datagrams += res[i].datagrams;
            p->sent_bytes += res[i].bytes;
            p->send_errors += res[i].errors;
            p->gso_sends += res[i].gso_sends;
            p->eagain += res[i].eagain;
            if (res[i].gso_failed) p->gso = 0;
        }
    }
    struct timespec cpu;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
        pc->exit_cpu_ns = (int64_t)cpu.tv_sec * 1000000000LL + cpu.tv_nsec;
    pc->exited = 1;
    pthread_cond_broadcast(&pc->idle);
    pthread_mutex_unlock(&pc->mu);
    return NULL;
}
