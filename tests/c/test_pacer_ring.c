/*
 * The pacer's ring and pacing clock (ext/datapath/pacer_ring.c) on their own:
 * built by tests/test_native_pacer_ring.py with no Python headers and no
 * pthread, which is what keeps that file pure. Times are plain numbers, so
 * the release schedule is checked exactly, not by measuring a thread.
 * Prints one line per failed check and exits 1 if any failed.
 */
#include "pacer_ring.h"
#include "replay.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                      \
    do {                                                                 \
        if (!(cond)) {                                                   \
            printf("%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            failures++;                                                  \
        }                                                                \
    } while (0)

/* Fill n datagrams of `len` bytes, byte value = index, all with not_before nb. */
static size_t put(WxRing *r, size_t n, size_t len, int64_t nb) {
    uint8_t src[64 * 16];
    size_t lens[64];
    for (size_t i = 0; i < n; i++) {
        memset(src + i * len, (int)(r->count + i), len);
        lens[i] = len;
    }
    size_t k = wx_ring_fill(r, wx_ring_index(r, r->count), wx_ring_room(r), wx_ring_raw_tail(r),
                            wx_ring_raw_room(r), src, lens, n, nb);
    wx_ring_publish(r, k, k);
    return k;
}

static void test_ring_is_a_bounded_fifo_that_wraps(void) {
    WxRing r;
    CHECK(wx_ring_init(&r, 4, 16) == 0);
    CHECK(put(&r, 6, 10, 0) == 4); /* backpressure: a prefix fits */
    CHECK(r.count == 4 && wx_ring_room(&r) == 0);
    CHECK(put(&r, 1, 10, 0) == 0);
    wx_ring_consume(&r, 3);
    CHECK(r.head == 3 && r.count == 1);
    CHECK(put(&r, 3, 7, 0) == 3); /* wraps to slots 0, 1, 2 */
    for (size_t k = 0; k < r.count; k++) {
        size_t idx = wx_ring_index(&r, k);
        CHECK(idx == (3 + k) % 4);
        CHECK(r.lens[idx] == (k == 0 ? 10u : 7u));
    }
    CHECK(wx_ring_slot(&r, 0)[0] == 1 && wx_ring_slot(&r, 2)[6] == 3);
    wx_ring_free(&r);
}

/* Entries that name a data run hold no raw slot: raw datagrams queued around them
 * take consecutive raw slots, which free up as their own entries are consumed. */
static void test_raw_slots_are_a_fifo_apart_from_data_entries(void) {
    WxRing r;
    int run_a, run_b; /* the ring never looks inside a run: any distinct pointers */
    CHECK(wx_ring_init(&r, 4, 16) == 0);
    CHECK(put(&r, 1, 10, 0) == 1); /* entry 0, raw slot 0 */
    for (int i = 0; i < 2; i++) {  /* entries 1, 2: data */
        size_t idx = wx_ring_index(&r, r.count);
        r.run[idx] = i ? (void *)&run_b : (void *)&run_a;
        r.sub[idx] = 0;
        r.lens[idx] = 100;
        wx_ring_publish(&r, 1, 0);
    }
    CHECK(put(&r, 1, 10, 0) == 1); /* entry 3, raw slot 1 */
    CHECK(r.count == 4 && r.raw_count == 2 && wx_ring_raw_room(&r) == 2);
    CHECK(r.sub[0] == 0 && r.sub[3] == 1 && wx_ring_slot(&r, 1)[0] == 3);
    wx_ring_consume(&r, 2); /* one raw, one data */
    CHECK(r.count == 2 && r.raw_count == 1 && r.raw_head == 1);
    wx_ring_consume(&r, 2);
    CHECK(r.count == 0 && r.raw_count == 0 && r.raw_head == 2);
    wx_ring_free(&r);
}

static void test_pps_clock_spaces_datagrams_and_stops_at_the_horizon(void) {
    WxRing r;
    WxPaceClock c = {0};
    CHECK(wx_ring_init(&r, 16, 16) == 0);
    wx_pace_set(&c, 1000.0, 1); /* 1 ms apart */
    CHECK(wx_pace_interval_ns(&c, 1) == 1e6 && wx_pace_interval_ns(&c, 1500) == 1e6);
    put(&r, 10, 8, 0);
    int64_t now = 5000000000LL;
    wx_pace_restart(&c, now); /* an idle clock starts now, with no credit */
    CHECK(wx_pace_head_release(&c, &r) == now);
    CHECK(wx_pace_take_due(&c, &r, now, 0, 64) == 1); /* only the head is due */
    CHECK(c.t_next == (double)(now + 1000000));
    CHECK(wx_pace_take_due(&c, &r, now, 0, 64) == 0); /* nothing more before 1 ms */
    CHECK(c.t_next == (double)(now + 1000000));
    /* A burst window takes what falls due within it: heads at +1, +2, +3 ms. */
    CHECK(wx_pace_take_due(&c, &r, now + 1000000, 2000000, 64) == 3);
    CHECK(c.t_next == (double)(now + 4000000));
    CHECK(wx_pace_take_due(&c, &r, now + 9000000, 0, 2) == 2); /* the budget bounds a round */
    wx_ring_free(&r);
}

static void test_byte_rate_a_late_thread_catches_up_at_most_max_lag(void) {
    WxRing r;
    WxPaceClock c = {0};
    CHECK(wx_ring_init(&r, 64, 16) == 0);
    wx_pace_set(&c, 1e6, 0); /* 1 MB/s: 10 bytes = 10 us */
    CHECK(c.pps == 0 && c.rate_bytes_per_s == 1e6);
    CHECK(wx_pace_interval_ns(&c, 10) == 10000.0);
    put(&r, 64, 10, 0);
    wx_pace_restart(&c, 0);
    /* 10 ms late: only WX_PACE_MAX_LAG_NS (1 ms = 100 datagrams) of the
     * schedule may go at once, and there are 64 queued, all due; being behind
     * the schedule, they are spaced WX_PACE_CATCH_UP times closer. */
    int64_t now = 10000000;
    CHECK(wx_pace_take_due(&c, &r, now, 0, 64) == 64);
    CHECK(c.t_next == (double)(now - WX_PACE_MAX_LAG_NS) + 64 * 10000 / WX_PACE_CATCH_UP);
    CHECK(c.t_sched == 64 * 10000.0); /* the schedule: where a punctual thread would be */
    wx_ring_free(&r);
}

/* A thread that wakes `late_ns` after its head's release every time it sleeps
 * (a round that leaves a due head runs the next at once): the lateness of the
 * last datagram, behind the schedule a punctual one keeps. */
static int64_t lag_of_a_late_thread(int64_t late_ns) {
    WxRing r;
    WxPaceClock c = {0};
    CHECK(wx_ring_init(&r, 4096, 16) == 0);
    wx_pace_set(&c, 1e6, 0); /* 10-byte datagrams: 10 us each at the pacer's rate */
    /* As the core plans them: packets of 32 datagrams, 1.25 x slower than the pacer
     * spreads them (PACER_HEADROOM), 100 packets = 40 ms of schedule. */
    for (int64_t k = 0; k < 100; k++) CHECK(put(&r, 32, 10, k * 400000) == 32);
    wx_pace_restart(&c, 0);
    int64_t now = 0, last = 0;
    while (r.count) {
        int64_t at = wx_pace_head_release(&c, &r);
        if (at > now) now = at + late_ns;
        size_t n = wx_pace_take_due(&c, &r, now, 0, 64);
        if (n) last = now;
        wx_ring_consume(&r, n);
    }
    wx_ring_free(&r);
    return last - (99 * 400000 + 31 * 10000);
}

static void test_a_thread_late_at_every_wake_keeps_up_with_the_schedule(void) {
    CHECK(lag_of_a_late_thread(0) == 0);
    /* Woken 3 ms late every time (a busy host): a clock that dropped each wake's
     * lateness beyond WX_PACE_MAX_LAG_NS fell further behind at every wake (the
     * ring grew for as long as the core went on planning); it stays within
     * one late wake of the schedule. */
    int64_t lag = lag_of_a_late_thread(3000000);
    CHECK(lag <= 3000000 + WX_PACE_MAX_LAG_NS);
}

static void test_not_before_holds_a_datagram_back(void) {
    WxRing r;
    WxPaceClock c = {0}; /* unpaced */
    CHECK(wx_ring_init(&r, 8, 16) == 0);
    CHECK(wx_pace_interval_ns(&c, 1000) == 0);
    put(&r, 2, 4, 0);
    put(&r, 2, 4, 700);
    wx_pace_restart(&c, 100);
    CHECK(wx_pace_head_release(&c, &r) == 100);
    CHECK(wx_pace_take_due(&c, &r, 100, 0, 8) == 2); /* the unpaced pair; the rest waits */
    wx_ring_consume(&r, 2);
    CHECK(wx_pace_head_release(&c, &r) == 700);
    CHECK(wx_pace_take_due(&c, &r, 699, 0, 8) == 0);
    CHECK(wx_pace_take_due(&c, &r, 700, 0, 8) == 2);
    wx_pace_restart(&c, 50); /* restart never moves the clock back */
    CHECK(c.t_next == 700.0);
    wx_ring_free(&r);
}

static void test_replay_window_edges(void) {
    WxReplay w;
    memset(&w, 0, sizeof w);
    CHECK(wx_replay_fresh(&w, 0));
    wx_replay_mark(&w, 5000);
    CHECK(!wx_replay_fresh(&w, 5000));
    CHECK(wx_replay_fresh(&w, 5000 - WX_REPLAY_WINDOW + 1)); /* the oldest remembered */
    CHECK(!wx_replay_fresh(&w, 5000 - WX_REPLAY_WINDOW));    /* too old: rejected unseen */
    wx_replay_mark(&w, 4999);
    CHECK(!wx_replay_fresh(&w, 4999) && wx_replay_fresh(&w, 4998));
    wx_replay_mark(&w, 5000 + WX_REPLAY_WINDOW); /* a jump past the window forgets it all */
    CHECK(!wx_replay_fresh(&w, 5000 + WX_REPLAY_WINDOW) && wx_replay_fresh(&w, 5001));
}

int main(void) {
    test_ring_is_a_bounded_fifo_that_wraps();
    test_raw_slots_are_a_fifo_apart_from_data_entries();
    test_pps_clock_spaces_datagrams_and_stops_at_the_horizon();
    test_byte_rate_a_late_thread_catches_up_at_most_max_lag();
    test_a_thread_late_at_every_wake_keeps_up_with_the_schedule();
    test_not_before_holds_a_datagram_back();
    test_replay_window_edges();
    if (failures) printf("%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
