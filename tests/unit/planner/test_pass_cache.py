"""A plan made with a PassCache kept across passes equals one made fresh (planner/pass_cache.py).

The passes follow a cluster that changes between them as a live one does (pods edited, moved,
finished, annotated do-not-disrupt, deleted and created; nodes tainted; PDBs and budgets edited;
re-lists), through the snapshot builder the worker uses, so unchanged pods are the same objects from
one pass to the next and the cache really is reused. The reference plans each pass on a snapshot
built from scratch, without a cache.
"""

from __future__ import annotations

import gc
import random
import weakref
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.catalog import bundled_catalog
from planner.pass_cache import NodePods, PassCache
from planner.plan import plan, validate_command
from planner.scheduling.adapter import RECENT_SNAPSHOTS, SnapshotSimulation
from sim.cluster_builder import DEFAULT_NOW
from tests.unit.planner.test_snapshot_builder import Informers, changed_in_steps, cluster, from_scratch

CATALOG = bundled_catalog("us-west-2")


def passes(seed: int, steps: list[int], nodes: int = 16, pods: int = 160) -> PassCache:
    """Plan after each step both ways and compare; returns the cache for the caller's checks."""
    objects, instances = cluster(seed, nodes=nodes, pods=pods)
    informers = Informers(objects)
    rng = random.Random(seed)
    cache = PassCache()
    for serial in changed_in_steps(informers, rng, steps):
        nodes_now = list(informers.items["Node"])
        held = {key.lstrip("/") for key in rng.sample(nodes_now, min(len(nodes_now), rng.randint(0, 2)))}
        now = DEFAULT_NOW + timedelta(minutes=3 * serial)  # do-not-disrupt windows run out meanwhile
        cached = plan(informers.builder.snapshot(now, instances, held), CATALOG, cache=cache)
        fresh = plan(from_scratch(informers, now, instances, held), CATALOG)
        assert cached.model_dump() == fresh.model_dump()
        # The controller re-validates the commands on the next view; the same verdicts either way.
        for command in cached.commands:
            later = now + timedelta(seconds=15)
            with_cache = validate_command(
                informers.builder.snapshot(later, instances, held), CATALOG, command, cache=cache
            )
            without = validate_command(from_scratch(informers, later, instances, held), CATALOG, command)
            assert with_cache.model_dump() == without.model_dump()
    return cache


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 9), steps=st.lists(st.integers(0, 10), min_size=2, max_size=5))
def test_a_plan_with_the_cache_equals_a_fresh_plan_as_the_cluster_changes(seed, steps):
    passes(seed, steps)


def test_the_cache_is_reused_for_unchanged_nodes_and_renewed_for_changed_ones():
    cache = passes(11, [0, 0, 3, 8, 1], nodes=30, pods=300)
    # Unchanged nodes hit; every pass after the first; changed nodes miss.
    assert cache.hits > cache.misses > 0
    assert cache.sim_nodes and cache.bound


def test_node_pods_follow_the_pods_they_were_built_from():
    objects, instances = cluster(4, nodes=6, pods=60)
    informers = Informers(objects)
    snapshot = informers.builder.snapshot(DEFAULT_NOW, instances)
    node = max(snapshot.nodes.values(), key=lambda n: len(n.pods))
    cache = PassCache()
    first = cache.node_pods(node)
    assert cache.node_pods(node) is first  # the same pods: reused
    node.pods = node.pods[:-1]
    second = cache.node_pods(node)
    assert second is not first  # a pod fewer: worked out again
    assert second.pods == tuple(node.pods)
    assert [p.key for p in second.reschedulable] == [p.key for p in node.pods if p.is_reschedulable]
    assert second.eviction_cost == NodePods(node.pods).eviction_cost


def prepared(simulation: SnapshotSimulation) -> dict[str, Any]:
    """What the simulator derives of the bound pods, as plain values."""
    sim = simulation.simulator
    return {
        "nodes": [(n.name, n.alloc, n.free, n.ports, n.klass) for n in sim.nodes],
        "labelsets": {key: dict(per_node) for key, per_node in sim._labelsets.items()},
        "order": list(sim._labelsets),
        "anti": {term: dict(counts) for term, counts in sim._inv_terms.items()},
    }


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 9), steps=st.lists(st.integers(0, 12), min_size=2, max_size=5))
def test_the_simulator_prepared_with_the_cache_equals_one_prepared_fresh(seed, steps):
    objects, instances = cluster(seed, nodes=12, pods=150)
    informers = Informers(objects)
    rng = random.Random(seed)
    cache = PassCache()
    for serial in changed_in_steps(informers, rng, steps):
        now = DEFAULT_NOW + timedelta(minutes=serial)
        cached = SnapshotSimulation(informers.builder.snapshot(now, instances), CATALOG, cache=cache)
        fresh = SnapshotSimulation(from_scratch(informers, now, instances, set()), CATALOG)
        assert prepared(cached) == prepared(fresh)


def test_passes_do_not_keep_their_snapshots_alive():
    """A worker plans a new snapshot every pass: the prepared simulations the planner memoises per
    snapshot must not keep every one of them (and its simulation) in memory."""
    objects, instances = cluster(11, nodes=30, pods=300)  # a cluster whose passes simulate
    informers = Informers(objects)
    cache = PassCache()
    alive = []
    for minute in range(8):
        snapshot = informers.builder.snapshot(DEFAULT_NOW + timedelta(minutes=minute), instances)
        plan(snapshot, CATALOG, cache=cache)
        alive.append(weakref.ref(snapshot))
        del snapshot
    gc.collect()
    kept = sum(1 for ref in alive if ref() is not None)
    assert kept <= RECENT_SNAPSHOTS


def test_a_node_the_builder_did_not_touch_keeps_its_pods_source():
    objects, instances = cluster(4, nodes=6, pods=60)
    informers = Informers(objects)
    first = informers.builder.snapshot(DEFAULT_NOW, instances)
    second = informers.builder.snapshot(DEFAULT_NOW, instances)
    name = max(first.nodes, key=lambda n: len(first.nodes[n].pods))
    assert second.nodes[name].pods_source is first.nodes[name].pods_source is not None
    pod = next(o for o in informers.items["Pod"].values() if o["spec"].get("nodeName") == name)
    informers.event("Pod", "MODIFIED", {**pod, "metadata": {**pod["metadata"], "labels": {"changed": "yes"}}})
    third = informers.builder.snapshot(DEFAULT_NOW, instances)
    assert third.nodes[name].pods_source is not first.nodes[name].pods_source
    cache = PassCache()
    cache.node_pods(first.nodes[name])
    cache.end_pass()
    assert cache.node_pods(second.nodes[name]).pods == tuple(second.nodes[name].pods)
    changed = cache.node_pods(third.nodes[name])
    assert [p.labels for p in changed.pods] == [p.labels for p in third.nodes[name].pods]
