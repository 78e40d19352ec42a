/*
 * Per-path replay window: each packet number accepted at most once.
 *
 * Apart from receiver.c because it is pure bookkeeping (no Python, no
 * crypto); inline because it runs per datagram. The same rule as
 * wanxport/wire/replay.py, whose WINDOW the module exports as REPLAY_WINDOW,
 * so a test holds the two to one value.
 */
#ifndef WANXPORT_REPLAY_H
#define WANXPORT_REPLAY_H

#include <stdint.h>
#include <string.h>

/* Packet numbers remembered below the highest accepted one (a multiple of 64). */
#define WX_REPLAY_WINDOW 4096

/* Highest accepted packet number plus a ring bitmap of the WX_REPLAY_WINDOW
 * numbers ending at it: bit (pn % WX_REPLAY_WINDOW) is set when pn was accepted.
 * All-zero is the empty window. */
typedef struct {
    uint64_t hi;
    int has_hi;
    uint64_t bits[WX_REPLAY_WINDOW / 64];
} WxReplay;

/* Would pn be accepted? (Does not record it.) */
static inline int wx_replay_fresh(const WxReplay *r, uint64_t pn) {
    if (!r->has_hi || pn > r->hi) return 1;
    if (r->hi - pn >= WX_REPLAY_WINDOW) return 0;
    uint64_t b = pn % WX_REPLAY_WINDOW;
    return !((r->bits[b / 64] >> (b % 64)) & 1);
}

/* Record pn as accepted; call only once its datagram authenticated. */
static inline void wx_replay_mark(WxReplay *r, uint64_t pn) {
    if (!r->has_hi || pn > r->hi) {
        if (!r->has_hi || pn - r->hi >= WX_REPLAY_WINDOW) {
            memset(r->bits, 0, sizeof r->bits);
        } else {
            for (uint64_t k = r->hi + 1; k <= pn; k++) {
                uint64_t b = k % WX_REPLAY_WINDOW;
                r->bits[b / 64] &= ~((uint64_t)1 << (b % 64));
            }
        }
        r->hi = pn;
        r->has_hi = 1;
    }
    uint64_t b = pn % WX_REPLAY_WINDOW;
    r->bits[b / 64] |= (uint64_t)1 << (b % 64);
}

#endif
