"""The order the suite runs in, so that parallel workers (pytest-xdist, `--dist worksteal`) end together.

worksteal first hands worker k the k-th contiguous slice of the collection order, and an idle worker
later steals the tail of a busy worker's queue, never its head. So the long tests (marked
`@pytest.mark.slow(seconds=...)`, an estimate from a full run) go at the heads of the slices, spread
over the workers longest first onto the least loaded (LPT), and the short tests fill each slice
behind them: every worker starts on its share of long tests at once and the short ones, which can be
stolen, even out the end. Without xdist (one worker) the long tests simply come first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import pytest

# A test marked slow without an estimate.
DEFAULT_SLOW_SECONDS = 30.0

T = TypeVar("T")


def expected_seconds(item: pytest.Item) -> float | None:
    """The slow marker's estimate, None for a test that is not marked slow."""
    marker = item.get_closest_marker("slow")
    if marker is None:
        return None
    return float(marker.kwargs.get("seconds", marker.args[0] if marker.args else DEFAULT_SLOW_SECONDS))


def slice_sizes(total: int, workers: int) -> list[int]:
    """The sizes of the slices worksteal hands out first (xdist's WorkStealingScheduling.check_schedule)."""
    sizes = []
    for k in range(workers):
        sizes.append((total - sum(sizes)) // (workers - k))
    return sizes


def spread(items: Sequence[T], seconds: Sequence[float | None], workers: int) -> list[T]:
    """`items` reordered: each slice starts with its share of the long ones (`seconds` not None)."""
    slow = sorted(
        (i for i, s in enumerate(seconds) if s is not None), key=lambda i: -(seconds[i] or 0.0)
    )  # sorted() is stable: equal estimates keep the collection order
    fast = [items[i] for i, s in enumerate(seconds) if s is None]
    if workers <= 1:
        return [items[i] for i in slow] + fast
    bins: list[list[int]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for i in slow:
        k = min(range(workers), key=lambda w: (load[w], len(bins[w])))
        bins[k].append(i)
        load[k] += seconds[i] or 0.0
    sizes = slice_sizes(len(items), workers)
    if any(len(b) > size for b, size in zip(bins, sizes, strict=True)):
        # A small selection (-k) with more long tests than a slice holds: long ones first will do.
        return [items[i] for i in slow] + fast
    ordered: list[T] = []
    rest = iter(fast)
    for b, size in zip(bins, sizes, strict=True):
        ordered.extend(items[i] for i in b)
        ordered.extend(next(rest) for _ in range(size - len(b)))
    return ordered
