"""The worker's collector policy (cluster/heap.py): as a pass begins (`before_pass`), and while the
cache first parses what it synced (`paused`)."""

from __future__ import annotations

import gc

from cluster.heap import HeapFreezer


def young_garbage() -> None:
    for _ in range(2_000):
        cycle: list = []
        cycle.append(cycle)


def test_a_pass_begins_with_the_young_generations_swept():
    thresholds = gc.get_threshold()
    gc.set_threshold(1_000_000, 1_000, 1_000)  # nothing collects on its own meanwhile
    try:
        young_garbage()
        gc.collect(0)  # survivors of a young collection wait in generation 1
        young_garbage()
        assert gc.get_count()[0] > 0 and gc.get_count()[1] > 0
        HeapFreezer(thresholds=thresholds).before_pass()
        assert gc.get_count()[:2] == (0, 0)
    finally:
        gc.set_threshold(*thresholds)


def test_a_freezer_without_a_policy_leaves_the_collector_alone():
    thresholds = gc.get_threshold()
    gc.set_threshold(1_000_000, 1_000, 1_000)
    try:
        young_garbage()
        before = gc.get_count()[0]
        HeapFreezer(thresholds=None).before_pass()
        assert gc.get_count()[0] >= before > 0
    finally:
        gc.set_threshold(*thresholds)


def test_the_first_parse_runs_with_the_collector_paused_and_resumes_it_even_on_failure():
    freezer = HeapFreezer(thresholds=gc.get_threshold())
    assert gc.isenabled()
    with freezer.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with freezer.paused():
            raise RuntimeError("the parse failed")
    except RuntimeError:
        pass
    assert gc.isenabled()


def test_the_first_pass_begins_without_a_collection_while_paused():
    thresholds = gc.get_threshold()
    freezer = HeapFreezer(thresholds=thresholds)
    with freezer.paused():
        young_garbage()
        before = gc.get_count()[0]
        freezer.before_pass()
        assert gc.get_count()[0] >= before > 0


def test_a_freezer_without_a_policy_does_not_pause_the_collector():
    with HeapFreezer(thresholds=None).paused():
        assert gc.isenabled()
