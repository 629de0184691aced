"""Properties of consolidation over generated clusters, checked with arithmetic independent of the
simulation (planner-core's Resources and selector code, not the simulator's vectors and caches)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube.selectors import terms_match, tolerates_all
from planner.consolidation import MultiNodeConsolidation, SingleNodeConsolidation
from planner.model import PlanOptions
from planner.plan import plan
from planner.resources import ZERO
from planner.scheduling.adapter import SnapshotSimulation
from sim.cluster_builder import DEFAULT_NOW, ClusterSpec, generate_cluster

specs = st.builds(
    ClusterSpec,
    nodes=st.integers(2, 24),
    pods=st.integers(0, 240),
    pools=st.integers(1, 3),
    empty_fraction=st.sampled_from([0.0, 0.1]),
    drifted_fraction=st.just(0.0),
    do_not_disrupt_fraction=st.sampled_from([0.0, 0.1]),
    pdb_fraction=st.sampled_from([0.0, 0.3]),
    blocking_pdb_fraction=st.sampled_from([0.0, 0.5]),
    not_ready_fraction=st.just(0.0),
    expired_fraction=st.sampled_from([0.0, 0.1]),
    deployment_size=st.integers(1, 10),
    seed=st.integers(0, 2**16),
    budgets=st.just([[{"nodes": "100%"}]]),
)
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEWER = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def consolidation_plan(
    spec: ClusterSpec, spot_to_spot: bool = False, hours: int = 0, max_replacements: int = 1
):
    builder = generate_cluster(spec, now=DEFAULT_NOW + timedelta(hours=hours))
    snapshot = builder.snapshot(via_yaml=False)
    options = PlanOptions(all_methods=True, spot_to_spot=spot_to_spot, max_replacements=max_replacements)
    result = plan(
        snapshot, builder.catalog, options, methods=[MultiNodeConsolidation(), SingleNodeConsolidation()]
    )
    return builder, snapshot, result


@SETTINGS
@given(spec=specs, hours=st.integers(0, 48), max_replacements=st.sampled_from([1, 4]))
def test_every_moved_pod_fits_where_the_command_puts_it(spec, hours, max_replacements):
    """The command's own placements (existing nodes) and replacements (new nodes), checked here."""
    builder, snapshot, result = consolidation_plan(spec, hours=hours, max_replacements=max_replacements)
    sim = SnapshotSimulation(snapshot, builder.catalog)
    gone: set[str] = set()  # nodes of earlier commands of the pass
    for command in result.commands_:
        gone_before = set(gone)
        gone.update(command.nodes)
        if command.method == "expiration":
            continue
        moved = {p.key: p for p in sim.pods_of(command.nodes)}
        on_replacement = {p.key: i for i, r in enumerate(command.replacements) for p in r.pods}
        assert set(moved) == set(command.placements) | set(on_replacement)
        assert not set(command.placements) & set(on_replacement)
        placed_on: dict[str, list] = defaultdict(list)
        for key, target in command.placements.items():
            assert target not in command.nodes and target not in gone_before
            placed_on[target].append(moved[key])
        for target, pods in placed_on.items():
            node = snapshot.nodes.get(target)
            if node is None:
                continue  # a new node: checked against instance types below
            used = ZERO
            for p in node.pods:
                if not p.is_terminal:
                    used = used + p.requests
            for p in pods:
                used = used + p.requests
                labels = node.labels
                assert all(labels.get(k) == v for k, v in p.node_selector.items())
                assert terms_match(p.node_affinity, labels)
                assert tolerates_all(p.tolerations, node.taints)
            assert used.fits(node.allocatable), (target, used, node.allocatable)
        for replacement in command.replacements:
            need = ZERO
            for ds in snapshot.daemonsets:  # generated DaemonSets tolerate everything and select no nodes
                need = need + ds.pod.requests
            for p in replacement.pods:
                need = need + p.requests
            for it in replacement.instance_types:
                assert need.fits(it.allocatable_resources), (it.name, need)


@SETTINGS
@given(spec=specs, spot_to_spot=st.booleans(), max_replacements=st.sampled_from([1, 4]))
def test_every_replacement_is_strictly_cheaper(spec, spot_to_spot, max_replacements):
    """Whatever option each new node launches as, all of them together cost less than the nodes.
    (Consolidation only: an expired node's replacements are capacity for its pods, not savings.)"""
    builder, snapshot, result = consolidation_plan(spec, spot_to_spot, max_replacements=max_replacements)
    for command in result.commands_:
        if command.decision != "replace" or command.method == "expiration":
            continue
        assert 1 <= len(command.replacements) <= max_replacements
        if command.method != "multi-node-consolidation":
            assert len(command.replacements) == 1
        source = sum(
            builder.catalog.get(n.instance_type).price(n.zone, n.capacity_type)  # type: ignore[union-attr]
            for n in (snapshot.nodes[name] for name in command.nodes)
        )
        worst_total = 0.0
        for replacement in command.replacements:
            assert replacement.instance_types
            worst = 0.0
            for it in replacement.instance_types:
                launch = [
                    o.price
                    for o in it.offerings
                    if o.available
                    and o.capacity_type == replacement.capacity_type
                    and o.zone in replacement.zones
                ]
                assert launch, it.name
                worst = max(worst, *launch)
            worst_total += worst
        assert worst_total < source, (worst_total, source)
        assert command.savings_per_hour > 0


@FEWER
@given(spec=specs, max_replacements=st.sampled_from([1, 4]))
def test_plans_are_deterministic(spec, max_replacements):
    first = consolidation_plan(spec, max_replacements=max_replacements)[2]
    second = consolidation_plan(spec, max_replacements=max_replacements)[2]
    assert first.to_json() == second.to_json()
