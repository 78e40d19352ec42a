/*
 * The pacer's pure parts: a bounded FIFO ring of fixed-size datagram slots and
 * the pacing clock that decides when each queued datagram may leave.
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

typedef struct {
    uint8_t *slots;      /* capacity * slot_size bytes */
    uint32_t *lens;      /* datagram length per slot */
    int64_t *not_before; /* per slot: earliest release (ns); 0 = none */
    size_t capacity, slot_size;
    size_t head, count; /* queued datagrams: slots head .. head + count - 1 (mod capacity) */
} WxRing;

typedef struct {
    double rate_bytes_per_s; /* 0 and pps 0: unpaced */
    double pps;
    double t_next; /* earliest release of the head (ns) */
} WxPaceClock;

/* Allocate the slots; 0, or -1 when out of memory (wx_ring_free still safe). */
int wx_ring_init(WxRing *r, size_t capacity, size_t slot_size);
void wx_ring_free(WxRing *r);

/* Slot index of the k-th queued datagram. */
static inline size_t wx_ring_index(const WxRing *r, size_t k) {
    return (r->head + k) % r->capacity;
}
static inline uint8_t *wx_ring_slot(const WxRing *r, size_t idx) {
    return r->slots + idx * r->slot_size;
}
static inline size_t wx_ring_room(const WxRing *r) {
    return r->capacity - r->count;
}

/* Copy up to `room` of the n datagrams (lengths lens[i] <= slot_size, back to
 * back in src) into the free slots starting at `tail` (wx_ring_index(r,
 * count) as read together with room), each with release time `not_before`.
 * Returns how many were copied; they are not queued until wx_ring_publish().
 * Safe while a consumer reads the queued slots, which it never shares. */
size_t wx_ring_fill(WxRing *r, size_t tail, size_t room, const uint8_t *src, const size_t *lens,
                    size_t n, int64_t not_before);
static inline void wx_ring_publish(WxRing *r, size_t n) {
    r->count += n;
}
/* The n oldest datagrams left (or were dropped). */
static inline void wx_ring_consume(WxRing *r, size_t n) {
    r->head = (r->head + n) % r->capacity;
    r->count -= n;
}

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
 * `budget`), spacing them by the clock; advances the clock past them when
 * there is at least one. The datagrams stay queued. */
size_t wx_pace_take_due(WxPaceClock *c, const WxRing *r, int64_t now, int64_t burst_ns,
                        size_t budget);

#endif
