"""The chaos run's timeline and world come from the seed alone (sim/chaos/schedule.py, world.py)."""

from __future__ import annotations

import itertools
from collections import Counter

from sim.chaos.schedule import PERMANENT_INDEX, ScheduleSpec, build_schedule
from sim.chaos.world import build_world


def test_the_same_seed_gives_the_same_timeline_and_another_seed_another():
    spec = ScheduleSpec(seconds=90)
    assert build_schedule(3, spec) == build_schedule(3, spec)
    assert build_schedule(3, spec) != build_schedule(4, spec)
    first, again = build_schedule(3, spec)[5], build_schedule(3, spec)[5]
    assert first.rng().random() == again.rng().random()


def test_every_run_has_its_share_of_each_fault_inside_the_phase():
    for seed in range(20):
        events = build_schedule(seed, ScheduleSpec(seconds=60))
        kinds = Counter(e.kind for e in events)
        assert kinds["kill-worker"] >= 10
        assert kinds["restart-temporal"] == 1 and kinds["drift-nodepool"] == 1
        assert kinds["second-worker-up"] == kinds["second-worker-down"] == 1
        assert kinds["vanish-instance"] >= 2 and kinds["spot-interruption"] >= 2 and kinds["churn"] >= 10
        up = next(e.at for e in events if e.kind == "second-worker-up")
        down = next(e.at for e in events if e.kind == "second-worker-down")
        assert 0 < up < down < 60
        assert all(0 <= e.at <= 60 for e in events)
        assert [e.at for e in events] == sorted(e.at for e in events)
        kills = [e.at for e in events if e.kind == "kill-worker"]
        assert min(b - a for a, b in itertools.pairwise(kills)) >= 2.0
        # The last 20 s have no kill: the workers reach their watches while the watch faults are on.
        assert max(kills) <= 40


def test_a_longer_run_restarts_temporal_more_often():
    kinds = Counter(e.kind for e in build_schedule(1, ScheduleSpec(seconds=1200)))
    assert kinds["restart-temporal"] == 4 and kinds["kill-worker"] == 160


def test_the_world_has_work_for_every_method_and_every_stubborn_pod():
    world = build_world(11)
    notes = Counter(world.notes.values())
    assert notes["expired"] == notes["expiring"] == notes["empty"] == 1
    assert len(world.drifted) == 2 and len(world.spot_nodes) >= 3
    assert build_world(11).scenario.objects == world.scenario.objects
    kinds = Counter(o["kind"] for o in world.scenario.objects)
    assert kinds["NodePool"] == 2 and kinds["PodDisruptionBudget"] >= 4
    pdbs = {
        o["metadata"]["name"]: o["spec"] for o in world.scenario.objects if o["kind"] == "PodDisruptionBudget"
    }
    assert pdbs["ledger"]["minAvailable"] == 2  # never allows: 2 replicas
    stubborn = [
        o
        for o in world.scenario.objects
        if o["kind"] == "Pod" and o["metadata"]["name"].startswith("stubborn")
    ]
    assert stubborn and all(p["spec"]["terminationGracePeriodSeconds"] == 600 for p in stubborn)


def test_the_permanent_faults_come_once_each_without_changing_the_other_faults():
    spec = ScheduleSpec(seconds=240)
    events = build_schedule(4242, spec)
    others = [e for e in events if e.index < PERMANENT_INDEX]
    assert others == build_schedule(4242, ScheduleSpec(seconds=240, permanent=False))
    permanent = Counter(e.kind for e in events if e.index >= PERMANENT_INDEX)
    assert permanent == {"deny-evictions": 1, "remove-ownership-tag": 1}
    beside = Counter(e.kind for e in build_schedule(4242, ScheduleSpec(seconds=240, karpenter=True)))
    assert beside["hold-nodeclaim"] == 1 and beside["remove-ownership-tag"] == 0
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert all(0.15 * 240 <= e.at <= 0.6 * 240 for e in events if e.index >= PERMANENT_INDEX)
