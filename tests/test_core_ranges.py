"""RangeSet against a plain Python set of integers (the obviously correct model)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core.ranges import RangeSet

DOMAIN = 120

spans = st.tuples(st.integers(0, DOMAIN), st.integers(0, 30)).map(lambda t: (t[0], t[0] + t[1]))
ops = st.lists(
    st.one_of(
        spans.map(lambda s: ("add", s)),
        spans.map(lambda s: ("add", s)),
        st.integers(0, DOMAIN + 30).map(lambda v: ("discard_below", (v, v))),
    ),
    max_size=40,
)


def check_structure(rs: RangeSet, model: set[int]) -> None:
    ranges = rs.ranges()
    for start, end in ranges:
        assert start < end
    for (_, e1), (s2, _) in zip(ranges, ranges[1:], strict=False):
        assert e1 < s2, "ranges are sorted, disjoint and not touching"
    assert {i for s, e in ranges for i in range(s, e)} == model
    assert rs.total == len(model)
    assert len(rs) == len(ranges) == len(list(rs))


def model_gaps(model: set[int], start: int, end: int) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    for i in range(start, end):
        if i in model:
            continue
        if gaps and gaps[-1][1] == i:
            gaps[-1] = (gaps[-1][0], i + 1)
        else:
            gaps.append((i, i + 1))
    return gaps


@settings(max_examples=250, deadline=None, derandomize=True)
@given(ops, st.lists(spans, min_size=1, max_size=8))
def test_rangeset_matches_set_model(operations: list[tuple[str, tuple[int, int]]],
                                    queries: list[tuple[int, int]]) -> None:
    rs, model = RangeSet(), set[int]()
    for op, (a, b) in operations:
        if op == "add":
            new = set(range(a, b)) - model
            assert rs.add(a, b) == len(new)
            model |= new
        else:
            rs.discard_below(a)
            model = {i for i in model if i >= a}
        check_structure(rs, model)
    for a, b in queries:
        assert rs.gaps(a, b) == model_gaps(model, a, b)
        if a < b:
            assert rs.contains(a, b) == all(i in model for i in range(a, b))
        assert rs.contains_point(a) == (a in model)
        first_gap = a
        while first_gap in model:
            first_gap += 1
        assert rs.first_gap_after(a) == first_gap
    full = rs.ranges()
    for count in range(len(full) + 2):
        assert rs.last(count) == list(reversed(full))[:count]


def test_add_returns_only_new_and_ignores_empty() -> None:
    rs = RangeSet()
    assert rs.add(5, 5) == 0 and rs.add(6, 2) == 0 and rs.total == 0
    assert rs.add(10, 20) == 10
    assert rs.add(0, 5) == 5
    assert rs.add(5, 10) == 5  # bridges both neighbours into one range
    assert rs.ranges() == [(0, 20)]
    assert rs.add(0, 20) == 0


def test_discard_below_trims_inside_a_range() -> None:
    rs = RangeSet()
    rs.add(0, 10)
    rs.add(20, 30)
    rs.discard_below(25)
    assert rs.ranges() == [(25, 30)] and rs.total == 5
    rs.discard_below(100)
    assert rs.ranges() == [] and rs.total == 0
