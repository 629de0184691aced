"""The suite's order (tests/scheduling.py): every parallel worker starts on a fair share of long tests."""

from __future__ import annotations

from tests.scheduling import slice_sizes, spread


def test_slices_are_the_sizes_worksteal_hands_out():
    assert slice_sizes(10, 3) == [3, 3, 4]
    assert slice_sizes(1521, 3) == [507, 507, 507]
    assert sum(slice_sizes(1522, 4)) == 1522


def test_each_slice_starts_with_its_share_of_the_long_tests_longest_first():
    seconds: list[float | None] = [None] * 30
    for i, s in {2: 150, 5: 120, 8: 95, 11: 90, 14: 80, 20: 60, 25: 30}.items():
        seconds[i] = s
    items = list(range(30))
    ordered = spread(items, seconds, 3)

    assert sorted(ordered) == items
    heads = []
    for start, size in zip((0, 10, 20), slice_sizes(30, 3), strict=True):
        part = ordered[start : start + size]
        longs = [i for i in part if seconds[i] is not None]
        assert part[: len(longs)] == longs, part  # the long ones lead their slice ...
        assert [seconds[i] for i in longs] == sorted((seconds[i] for i in longs), reverse=True)
        heads.append(sum(seconds[i] or 0 for i in longs))
    assert max(heads) - min(heads) <= 60, heads  # ... and the slices' shares are near even
    short = [i for i in ordered if seconds[i] is None]
    assert short == [i for i in items if seconds[i] is None]  # the rest keep the collection order


def test_one_worker_or_a_small_selection_runs_the_long_tests_first():
    seconds = [None, 40.0, None, 90.0]
    assert spread([0, 1, 2, 3], seconds, 1) == [3, 1, 0, 2]
    assert spread([0, 1, 2, 3], [50.0, 40.0, 30.0, 20.0], 3) == [0, 1, 2, 3]
