"""The order tests run in under xdist's work stealing (tests/conftest.py `spread_slow_first`)."""

from __future__ import annotations

from tests.conftest import spread_slow_first


def seconds_by_name(name: str) -> float | None:
    return 30.0 if name.startswith("slow") else None


def blocks(items: list[str], workers: int) -> list[list[str]]:
    """What work stealing hands each worker at the start: contiguous blocks, as xdist cuts them."""
    out, start, remaining = [], 0, len(items)
    for k in range(workers):
        size = remaining // (workers - k)
        out.append(items[start : start + size])
        start, remaining = start + size, remaining - size
    return out


def test_each_worker_starts_on_its_share_of_the_slow_tests():
    items = [f"fast{i}" for i in range(20)] + ["slowA", "slowB", "slowC", "slowD", "slowE"]
    spread = spread_slow_first(items, 4, seconds_by_name)

    assert sorted(spread) == sorted(items)  # nothing lost, nothing twice
    heads = [block[: 2 if k == 0 else 1] for k, block in enumerate(blocks(spread, 4))]
    assert heads == [["slowA", "slowE"], ["slowB"], ["slowC"], ["slowD"]]
    assert [n for n in spread if n.startswith("fast")] == [f"fast{i}" for i in range(20)]  # stable


def test_without_xdist_the_slow_tests_simply_come_first():
    items = ["a", "slow1", "b", "slow2"]
    assert spread_slow_first(items, 1, seconds_by_name) == ["slow1", "slow2", "a", "b"]


def test_the_longest_slow_tests_start_at_once_on_different_workers():
    """A 300 s test and two 120 s ones get a worker each at the start; the 30 s ones fill the
    fourth, then whichever worker has the fewest slow seconds, whatever their order in the list."""
    seconds = {"slow30a": 30, "slow30b": 30, "slow120a": 120, "slow30c": 30, "slow300": 300, "slow120b": 120}
    items = [f"fast{i}" for i in range(30)] + list(seconds)
    spread = spread_slow_first(items, 4, lambda name: seconds.get(name))

    heads = [[n for n in block if n in seconds] for block in blocks(spread, 4)]
    assert heads == [["slow300"], ["slow120a"], ["slow120b"], ["slow30a", "slow30b", "slow30c"]]
    assert sorted(spread) == sorted(items)
