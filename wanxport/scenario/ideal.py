"""The ideal completion time of a transfer (DESIGN.md section 4).

Every run report divides this bound by the measured completion time, so it
must be computed exactly as the contract says, the same for the simulator and
for real emulation:

    smallest T with  sum_i integral_0^(T - d_i) (bw_i(t)/8) (1 - loss_i(t)) up_i(t) dt >= B

Each path's delivery rate is piecewise constant (it changes only at events),
so the left side is a piecewise-linear, non-decreasing function of T with
breakpoints at d_i + event time. We sweep the breakpoints in order and solve
the linear piece that crosses B: exact, no numeric stepping.
"""

from __future__ import annotations

import math

from wanxport.scenario.model import PathSpec, Scenario


def _rate_Bps(spec: PathSpec, t_s: float, direction: str) -> float:
    """Payload bytes per second path ``spec`` can deliver at time ``t_s`` (events applied)."""
    params = spec.params_at(t_s, direction)
    if params.down:
        return 0.0
    return params.bandwidth_mbps * 1e6 / 8.0 * (1.0 - params.effective_loss)


def _one_direction(scenario: Scenario, size_bytes: int, direction: str) -> float:
    # Breakpoints: (arrival-side time, path index, rate from then on). A path
    # contributes nothing before d_i, then each timeline segment's rate shifted by d_i.
    changes: list[tuple[float, int, float]] = []
    for i, spec in enumerate(scenario.paths):
        delay_s = spec.params_at(0.0, direction).rtt_ms / 2000.0
        for at_s in (0.0, *spec.change_times()):
            changes.append((delay_s + at_s, i, _rate_Bps(spec, at_s, direction)))
    changes.sort(key=lambda c: c[0])

    rates = [0.0] * len(scenario.paths)
    total_rate = 0.0
    delivered = 0.0
    now = 0.0
    index = 0
    while index < len(changes):
        at = changes[index][0]
        if total_rate > 0 and delivered + total_rate * (at - now) >= size_bytes:
            return now + (size_bytes - delivered) / total_rate
        delivered += total_rate * (at - now)
        now = at
        while index < len(changes) and changes[index][0] == at:
            rates[changes[index][1]] = changes[index][2]
            index += 1
        total_rate = math.fsum(rates)  # exact re-sum: no drift over many breakpoints
    if total_rate <= 0:
        return math.inf
    return now + (size_bytes - delivered) / total_rate


def ideal_time_s(scenario: Scenario, size_bytes: int | None = None, direction: str | None = None) -> float:
    """Ideal completion time in seconds; ``math.inf`` if the bytes can never all arrive.

    ``size_bytes`` and ``direction`` default to the scenario's ``[transfer]``.
    ``direction`` is "a->b", "b->a" or "both" (the larger of the two one-way
    ideals; each side sends ``size_bytes``, the b->a one over the ``reverse``
    parameters).
    """
    size = scenario.transfer.size_bytes if size_bytes is None else size_bytes
    which = scenario.transfer.direction if direction is None else direction
    if size <= 0:
        return 0.0
    if which == "both":
        return max(_one_direction(scenario, size, d) for d in ("a->b", "b->a"))
    if which not in ("a->b", "b->a"):
        raise ValueError(f"direction must be 'a->b', 'b->a' or 'both', got {which!r}")
    return _one_direction(scenario, size, which)


def pipeline_step_ideal_s(scenario: Scenario, message_bytes: int, microbatches: int) -> float:
    """A lower bound of one step of a two-stage pipeline, stage 0 at site a and stage 1 at b,
    compute taken as free: each of ``microbatches`` activations of ``message_bytes`` crosses
    a -> b and its gradient (as large) crosses back.

    Every activation must arrive (the a->b ideal of all of them together), and the last
    microbatch's gradient can leave b only once its activation arrived, then needs at least
    its own b->a ideal; the gradients together bound the step on their own too (the b->a
    ideal of all of them). Exact for a scenario without events; with events the second
    term starts the gradient's timeline at zero, as every ideal here does.
    """
    total = microbatches * message_bytes
    return max(ideal_time_s(scenario, total, "both"),
               ideal_time_s(scenario, total, "a->b") + ideal_time_s(scenario, message_bytes, "b->a"))
