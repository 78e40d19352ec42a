"""Windowed extrema of a path's samples: the bandwidth max and the RTT min.

A rate-based model of a path is two extrema over sliding windows: the
bottleneck bandwidth is the largest recent delivery rate (queues and ack
compression only ever make a sample smaller), and the propagation delay is
the smallest recent RTT (queues only ever make it larger). Old samples must
age out, or the model never follows a route or capacity that changed. The two
windows are measured differently, hence two filters:

* :class:`RoundMaxFilter` is the exact maximum over the last N round trips,
  with round numbers counted by the caller. A window in rounds rather than
  seconds holds the same number of samples on a 10 ms and a 150 ms path.
* :class:`RunningMinFilter` is a minimum over the last W seconds, Kathleen
  Nichols' three-sample running filter: constant work and memory per sample,
  and its answer is always a sample from inside the window, which is all a
  min-RTT model needs.

Both are plain state machines: time and round numbers are arguments.
"""

from __future__ import annotations


class RoundMaxFilter:
    """Maximum of the samples taken in the last ``rounds`` round trips (0.0 when empty).

    One slot per round holds that round's largest sample. The filter ages
    only when a sample arrives, by the rounds since the previous one: a
    caller that skips samples while the path idles (BBR skips app-limited
    ones) keeps the estimate it had, instead of seeing it decay to nothing.
    Round numbers must not decrease between :meth:`reset` calls.
    """

    __slots__ = ("rounds", "_slots", "_round", "value")

    def __init__(self, rounds: int) -> None:
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
        self.rounds = rounds
        self.reset()

    def reset(self) -> None:
        """Forget every sample (the round count starts over at 0)."""
        self._slots = [0.0] * self.rounds
        self._round = 0
        # The maximum, kept as samples arrive (read it, never set it): a field, not a
        # property, so BBR's hot path and a statistics snapshot read it without a call.
        self.value = 0.0

    def update(self, round_count: int, value: float) -> None:
        """Take ``value``, a sample of round ``round_count``."""
        slots = self._slots
        n = self.rounds
        if round_count != self._round:
            # Clear the slots of the rounds since the last sample, which had none.
            for r in range(round_count - min(round_count - self._round, n), round_count):
                slots[(r + 1) % n] = 0.0
            self._round = round_count
            slots[round_count % n] = value
            self.value = max(slots)
        elif value > slots[round_count % n]:
            slots[round_count % n] = value
            if value > self.value:
                self.value = value


class RunningMinFilter:
    """Minimum of the samples of roughly the last ``window_s`` seconds.

    It keeps three (time, value) pairs: the best, second-best and third-best
    minimum of successive sub-windows. A new overall minimum, or the whole
    window having expired, resets all three; when the best ages out the
    others move up. The answer is never older than the window, never larger
    than the latest sample, and never smaller than the window's true minimum.
    """

    __slots__ = ("window_s", "_t0", "_v0", "_t1", "_v1", "_t2", "_v2")

    def __init__(self, window_s: float, now: float, value: float) -> None:
        if not window_s > 0.0:
            raise ValueError(f"window_s must be > 0 seconds, got {window_s!r}")
        self.window_s = float(window_s)
        self.reset(now, value)

    def reset(self, now: float, value: float) -> None:
        """Start over from one sample."""
        self._t0 = self._t1 = self._t2 = now
        self._v0 = self._v1 = self._v2 = value

    @property
    def value(self) -> float:
        return self._v0

    def update(self, now: float, value: float) -> None:
        """Take ``value``, a sample at time ``now`` (non-decreasing)."""
        window = self.window_s
        if value <= self._v0 or now - self._t2 > window:
            self.reset(now, value)
            return
        if value <= self._v1:
            self._t1 = self._t2 = now
            self._v1 = self._v2 = value
        elif value <= self._v2:
            self._t2 = now
            self._v2 = value
        elapsed = now - self._t0
        if elapsed > window:
            # The best sample aged out: promote the others.
            self._t0, self._v0 = self._t1, self._v1
            self._t1, self._v1 = self._t2, self._v2
            self._t2, self._v2 = now, value
            if now - self._t0 > window:
                self._t0, self._v0 = self._t1, self._v1
                self._t1, self._v1 = self._t2, self._v2
                self._t2, self._v2 = now, value
        elif self._t1 == self._t0 and elapsed > window / 4.0:
            # A quarter of the window passed without a second choice: take one.
            self._t1 = self._t2 = now
            self._v1 = self._v2 = value
        elif self._t2 == self._t1 and elapsed > window / 2.0:
            self._t2 = now
            self._v2 = value
