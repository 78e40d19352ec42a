"""Which member sends a joiner the state: the furthest along, then the best-connected to
the joiners (what its last links to them carried), then the lowest rank."""

from __future__ import annotations

import numpy as np

from wanxport.collective.elastic_state import source_and_receivers

# rows: [current, step, first call not done, done beyond, bytes/s carried to the joiners]


def table(*rows: list[int]) -> np.ndarray:
    return np.array(rows, dtype=np.int64)


def test_the_member_whose_links_carried_most_to_the_joiner_sends() -> None:
    agreed = table([1, 7, 0, 0, 3_000_000], [0, 0, 0, 0, 0], [1, 7, 0, 0, 18_000_000])
    assert source_and_receivers(agreed) == (2, [1])


def test_unknown_rates_fall_back_to_the_lowest_rank() -> None:
    agreed = table([1, 7, 0, 0, 0], [1, 7, 0, 0, 0], [0, 0, 0, 0, 0])
    assert source_and_receivers(agreed) == (0, [2])


def test_being_further_along_outweighs_a_faster_link() -> None:
    """A member a step behind must itself receive: its state is not the current one."""
    agreed = table([1, 8, 0, 0, 1_000], [1, 7, 0, 0, 90_000_000], [0, 0, 0, 0, 0])
    assert source_and_receivers(agreed) == (0, [1, 2])


def test_an_agreement_without_the_rate_column_still_picks_the_lowest_rank() -> None:
    agreed = table([1, 7, 0, 0], [0, 0, 0, 0], [1, 7, 0, 0])
    assert source_and_receivers(agreed) == (0, [1])
