/*
 * The pacer's pure parts: a bounded FIFO ring of queued datagrams (each either
 * bytes in a fixed-size slot, or a reference to a data run that the release
 * thread seals just before it sends) and the pacing clock that decides when
 * each queued datagram may leave.
 *
 * Why apart: this is the part of the pacer whose arithmetic decides precision
 * and fairness, and it needs neither Python, threads nor sockets. Times are
 * inputs (CLOCK_MONOTONIC nanoseconds), so the release schedule is tested on
 * its own (tests/c/test_pacer_ring.c). Locking is the caller's business: the
 * pacer (pacer_thread.c) holds its mutex around every call except wx_ring_fill().
 */
#ifndef WANXPORT_PACER_RING_H
#define WANXPORT_PACER_RING_H

#include <stddef.h>
#include <stdint.h>

/* A late release thread catches up at most this much of the schedule at once,
 * so a stall becomes a short burst, not an unbounded one. */
#define WX_PACE_MAX_LAG_NS 1000000
/* ... and then spaces what is still late this many times closer than the rate,
 * until it is back within WX_PACE_MAX_LAG_NS of the schedule. The schedule is what
 * the core planned and counts as in flight: time a stalled thread dropped for good
 * stayed queued in the ring, and on a busy host (every late wake-up dropping a
 * little) the ring grew to seconds of data, which the controllers read as round
 * trip time on every path of the session. */
#define WX_PACE_CATCH_UP 4.0

typedef struct {
    /* Per queued entry (capacity of each): its length, its earliest release (ns; 0 =
     * none), the data run it is sealed from at release time (opaque here; NULL for a
     * datagram queued as bytes) and, in that run, its index, or for bytes, their slot. */
    uint32_t *lens;
    int64_t *not_before;
    void **run;
    uint32_t *sub;
    size_t capacity, slot_size;
    size_t head, count; /* queued entries: head .. head + count - 1 (mod capacity) */
    /* The byte slots of datagrams queued as bytes (capacity * slot_size), a FIFO of
     * their own, so DATA, which is sealed at release and never touches them, does not
     * walk their pages: raw_head .. raw_head + raw_count - 1 (mod capacity). */
    uint8_t *slots;
    size_t raw_head, raw_count;
} WxRing;

typedef struct {
    double rate_bytes_per_s; /* 0 and pps 0: unpaced */
    double pps;
    double t_next; /* earliest release of the head (ns) */
    double t_sched; /* when the head would leave had no release been late (ns) */
} WxPaceClock;

/* Allocate the slots; 0, or -1 when out of memory (wx_ring_free still safe). */
int wx_ring_init(WxRing *r, size_t capacity, size_t slot_size);
void wx_ring_free(WxRing *r);

/* Entry index of the k-th queued datagram. */
static inline size_t wx_ring_index(const WxRing *r, size_t k) {
    return (r->head + k) % r->capacity;
}
/* The bytes of raw slot `slot` (an entry's sub when its run is NULL). */
static inline uint8_t *wx_ring_slot(const WxRing *r, size_t slot) {
    return r->slots + slot * r->slot_size;
}
static inline size_t wx_ring_room(const WxRing *r) {
    return r->capacity - r->count;
}
/* The next free raw slot, and how many are free. */
static inline size_t wx_ring_raw_tail(const WxRing *r) {
    return (r->raw_head + r->raw_count) % r->capacity;
}
static inline size_t wx_ring_raw_room(const WxRing *r) {
    return r->capacity - r->raw_count;
}

/* Copy up to min(room, raw_room) of the n datagrams (lengths lens[i] <= slot_size,
 * back to back in src) into raw slots from raw_tail, each queued as an entry from
 * `tail` with release time `not_before` (tail, room, raw_tail and raw_room as read
 * together under the caller's lock). Returns how many were copied; they are not
 * queued until wx_ring_publish(r, k, k). Safe while a consumer reads the queued
 * entries, which it never shares. */
size_t wx_ring_fill(WxRing *r, size_t tail, size_t room, size_t raw_tail, size_t raw_room,
                    const uint8_t *src, const size_t *lens, size_t n, int64_t not_before);
/* Queue the n entries filled from the tail, n_raw of them holding raw slots. */
static inline void wx_ring_publish(WxRing *r, size_t n, size_t n_raw) {
    r->count += n;
    r->raw_count += n_raw;
}
/* The n oldest entries left (or were dropped); their raw slots are free again. */
void wx_ring_consume(WxRing *r, size_t n);

/* Pace by bytes per second, or (is_pps) by datagrams per second; 0 = unpaced. */
void wx_pace_set(WxPaceClock *c, double value, int is_pps);
/* Gap that a datagram of `len` bytes occupies at the clock's rate (ns). */
double wx_pace_interval_ns(const WxPaceClock *c, uint32_t len);
/* A datagram queued on an empty ring: an idle path earns no burst credit, so
 * the clock restarts at `now` if it lags. */
void wx_pace_restart(WxPaceClock *c, int64_t now);
/* When the head (ring not empty) may leave: the clock, or later if it says so. */
static inline int64_t wx_pace_head_release(const WxPaceClock *c, const WxRing *r) {
    int64_t nb = r->not_before[r->head];
    return (int64_t)c->t_next > nb ? (int64_t)c->t_next : nb;
}
/* How many datagrams from the head are due by now + burst_ns (at most
 * `budget`), spacing them by the clock (WX_PACE_CATCH_UP times closer while they
 * leave more than WX_PACE_MAX_LAG_NS behind the schedule); advances the clock
 * past them when there is at least one. The datagrams stay queued. */
size_t wx_pace_take_due(WxPaceClock *c, const WxRing *r, int64_t now, int64_t burst_ns,
                        size_t budget);

#endif
