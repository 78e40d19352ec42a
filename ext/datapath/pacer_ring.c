/*
 * The pacer's ring and pacing clock (see pacer_ring.h): plain C, no Python,
 * no threads, no system calls beyond the allocator.
 */
#include "pacer_ring.h"

#include <stdlib.h>
#include <string.h>

int wx_ring_init(WxRing *r, size_t capacity, size_t slot_size) {
    memset(r, 0, sizeof *r);
    r->capacity = capacity;
    r->slot_size = slot_size;
    r->slots = malloc(capacity * slot_size);
    r->lens = calloc(capacity, sizeof(uint32_t));
    r->not_before = calloc(capacity, sizeof(int64_t));
    r->run = calloc(capacity, sizeof(void *));
    r->sub = calloc(capacity, sizeof(uint32_t));
    return r->slots && r->lens && r->not_before && r->run && r->sub ? 0 : -1;
}

void wx_ring_free(WxRing *r) {
    free(r->slots);
    free(r->lens);
    free(r->not_before);
    free(r->run);
    free(r->sub);
    r->slots = NULL;
    r->lens = NULL;
    r->not_before = NULL;
    r->run = NULL;
    r->sub = NULL;
}

size_t wx_ring_fill(WxRing *r, size_t tail, size_t room, size_t raw_tail, size_t raw_room,
                    const uint8_t *src, const size_t *lens, size_t n, int64_t not_before) {
    size_t done = 0;
    while (done < n && done < room && done < raw_room) {
        size_t idx = (tail + done) % r->capacity, slot = (raw_tail + done) % r->capacity;
        memcpy(wx_ring_slot(r, slot), src, lens[done]);
        r->lens[idx] = (uint32_t)lens[done];
        r->not_before[idx] = not_before;
        r->run[idx] = NULL;
        r->sub[idx] = (uint32_t)slot;
        src += lens[done];
        done++;
    }
    return done;
}

void wx_ring_consume(WxRing *r, size_t n) {
    size_t raw = 0;
    for (size_t k = 0; k < n; k++) raw += r->run[(r->head + k) % r->capacity] == NULL;
    r->head = (r->head + n) % r->capacity;
    r->count -= n;
    r->raw_head = (r->raw_head + raw) % r->capacity;
    r->raw_count -= raw;
}

void wx_pace_set(WxPaceClock *c, double value, int is_pps) {
    c->rate_bytes_per_s = is_pps ? 0 : value;
    c->pps = is_pps ? value : 0;
}

double wx_pace_interval_ns(const WxPaceClock *c, uint32_t len) {
    if (c->pps > 0) return 1e9 / c->pps;
    if (c->rate_bytes_per_s > 0) return (double)len * 1e9 / c->rate_bytes_per_s;
    return 0;
}

void wx_pace_restart(WxPaceClock *c, int64_t now) {
    if (c->t_next < (double)now) c->t_next = (double)now;
    if (c->t_sched < (double)now) c->t_sched = (double)now;
}

size_t wx_pace_take_due(WxPaceClock *c, const WxRing *r, int64_t now, int64_t burst_ns,
                        size_t budget) {
    double floor = (double)(now - WX_PACE_MAX_LAG_NS);
    double t = c->t_next > floor ? c->t_next : floor;
    double sched = c->t_sched;
    size_t k = 0;
    while (k < r->count && k < budget) {
        size_t idx = wx_ring_index(r, k);
        double nb = (double)r->not_before[idx];
        double rel = nb > t ? nb : t;
        if (rel > (double)(now + burst_ns)) break;
        double due = nb > sched ? nb : sched;
        double gap = wx_pace_interval_ns(c, r->lens[idx]);
        t = rel + (rel - due > WX_PACE_MAX_LAG_NS ? gap / WX_PACE_CATCH_UP : gap);
        sched = due + gap;
        k++;
    }
    if (k > 0) {
        c->t_next = t;
        c->t_sched = sched;
    }
    return k;
}
