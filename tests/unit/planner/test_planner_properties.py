"""Properties of whole planning passes over generated clusters (sim.cluster_builder.generate_cluster)."""

import math
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone

from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.duration import parse_duration
from api.nodepool import Budget
from planner.model import EXPIRATION, PlanOptions
from planner.plan import plan
from planner.snapshot import Node, Snapshot
from sim.cluster_builder import DEFAULT_NOW, ClusterSpec, generate_cluster

BUDGET_SETS = [
    [{"nodes": "10%"}],
    [{"nodes": "1"}],
    [{"nodes": "0", "reasons": ["Underutilized"]}, {"nodes": "3"}],
    [{"nodes": "30%", "reasons": ["Empty"]}, {"nodes": "2", "reasons": ["Drifted", "Underutilized"]}],
    [{"nodes": "100%"}, {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"}],
    [{"nodes": "50%"}, {"nodes": "1", "schedule": "@hourly", "duration": "30m", "reasons": ["Empty"]}],
    [{"nodes": "100%"}, {"nodes": "0", "schedule": "0 6 * * *", "duration": "12h"}],  # half of each UTC day
]

specs = st.builds(
    ClusterSpec,
    nodes=st.integers(3, 30),
    pods=st.integers(0, 300),
    pools=st.integers(1, 4),
    empty_fraction=st.sampled_from([0.0, 0.1, 0.4]),
    drifted_fraction=st.sampled_from([0.0, 0.1, 0.5]),
    do_not_disrupt_fraction=st.sampled_from([0.0, 0.1, 0.5]),
    pdb_fraction=st.sampled_from([0.0, 0.5, 1.0]),
    blocking_pdb_fraction=st.sampled_from([0.0, 0.5]),
    not_ready_fraction=st.sampled_from([0.0, 0.1]),
    expired_fraction=st.sampled_from([0.0, 0.1]),
    deployment_size=st.integers(1, 12),
    seed=st.integers(0, 2**16),
    budgets=st.lists(st.sampled_from(BUDGET_SETS), min_size=1, max_size=4),
)
hours = st.integers(0, 24 * 7)
# Offsets of `now` in whole quarter hours from -12:00 to +14:00: budget schedules are UTC whatever the
# offset the time is given in.
offsets = st.integers(-48, 56).map(lambda quarters: timezone(timedelta(minutes=15 * quarters)))
PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(spec: ClusterSpec, offset_hours: int, tz: timezone = UTC):
    builder = generate_cluster(spec, now=(DEFAULT_NOW + timedelta(hours=offset_hours)).astimezone(tz))
    return builder, builder.snapshot(via_yaml=False)


# --- An independent statement of the budget rules (behaviour notes §1.5) --------------------------


def _counted(node: Node) -> bool:
    return node.initialized and not (node.nodeclaim is not None and node.nodeclaim.instance_terminating)


def _disrupting_at_start(node: Node) -> bool:
    taints = {(t.key, t.value) for t in node.taints}
    tainted = any(key == "karpenter.sh/disrupted" for key, _ in taints) or (
        ("karpenter.sh/disruption", "disrupting") in taints
    )
    return not node.ready or node.deletion_timestamp is not None or tainted


def _active(budget: Budget, now: datetime) -> bool:
    """A scheduled budget is active when its last cron hit, read in UTC, is less than `duration` ago."""
    if budget.schedule is None:
        return True
    now = now.astimezone(UTC)
    last_hit = croniter(budget.schedule, now + timedelta(seconds=1)).get_prev(datetime)
    return now - last_hit < parse_duration(budget.duration or "")


def _allowed(snapshot: Snapshot, pool: str, reason: str, total: int) -> int:
    limits = [
        math.ceil(int(b.nodes[:-1]) * total / 100) if b.nodes.endswith("%") else int(b.nodes)
        for b in snapshot.nodepools[pool].spec.disruption.budgets
        if (b.reasons is None or reason in b.reasons) and _active(b, snapshot.now)
    ]
    return min(limits, default=total)


@PROPERTY_SETTINGS
@given(spec=specs, offset=hours, tz=offsets)
def test_no_plan_exceeds_a_budget(spec, offset, tz):
    builder, snapshot = build(spec, offset, tz)
    result = plan(snapshot, builder.catalog, PlanOptions(all_methods=True))
    counted = {name: node.nodepool for name, node in snapshot.nodes.items() if _counted(node)}
    total = Counter(counted.values())
    disrupting = Counter(counted[n] for n in counted if _disrupting_at_start(snapshot.nodes[n]))
    # Commands in pass order: expiration is never stopped by a budget but its nodes count; every
    # other command may only bring its pool's disrupting nodes up to what its reason allows.
    for command in result.commands:
        new = Counter(
            counted[n] for n in command.nodes if n in counted and not _disrupting_at_start(snapshot.nodes[n])
        )
        if command.method != EXPIRATION:
            for pool, count in new.items():
                allowed = _allowed(snapshot, pool, command.reason, total[pool])
                assert disrupting[pool] + count <= allowed, (
                    command.method,
                    pool,
                    disrupting[pool],
                    count,
                    allowed,
                )
        disrupting.update(new)
    for pool, reasons in result.budgets.items():
        for reason, left in reasons.items():
            assert 0 <= left <= result.budgets_at_start[pool][reason]


def _blocking(snapshot: Snapshot, node_name: str) -> str | None:
    """An independent re-statement of the graceful pod rules: any active do-not-disrupt pod, or an
    evictable pod under a PDB whose status allows no disruption (or under two PDBs)."""
    node = snapshot.nodes[node_name]
    for pod in node.pods:
        if not pod.is_active:
            continue
        if pod.annotations.get("karpenter.sh/do-not-disrupt") == "true":
            return f"do-not-disrupt {pod.key}"
        if pod.is_daemonset or pod.is_mirror:
            continue
        pdbs = [p for p in snapshot.pdbs if p.namespace == pod.namespace and p.selector.matches(pod.labels)]
        if len(pdbs) > 1 or any(p.disruptions_allowed == 0 for p in pdbs):
            return f"pdb on {pod.key}"
    return None


@PROPERTY_SETTINGS
@given(spec=specs, offset=hours)
def test_no_graceful_command_takes_a_node_with_a_do_not_disrupt_pod_or_blocking_pdb(spec, offset):
    builder, snapshot = build(spec, offset)
    result = plan(snapshot, builder.catalog, PlanOptions(all_methods=True))
    for command in result.commands:
        if command.disruption_class == "forceful":
            continue
        for node in command.nodes:
            pool = snapshot.nodepools[snapshot.nodes[node].nodepool]
            bounded = pool.spec.template.spec.termination_grace_period is not None
            if command.disruption_class == "eventual" and bounded:
                continue  # drift with a terminationGracePeriod may take blocked nodes by design
            assert _blocking(snapshot, node) is None, (command.method, node, _blocking(snapshot, node))


@PROPERTY_SETTINGS
@given(spec=specs, offset=hours)
def test_every_managed_node_is_in_exactly_one_command_or_has_a_reason(spec, offset):
    builder, snapshot = build(spec, offset)
    result = plan(snapshot, builder.catalog, PlanOptions(all_methods=True))
    named = [n for c in result.commands for n in c.nodes] + [b.node for b in result.blocked]
    managed = [n for n, node in snapshot.nodes.items() if node.nodepool]
    assert sorted(named) == sorted(managed)
    assert all(b.reason for b in result.blocked)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, offset=hours, all_methods=st.booleans())
def test_plans_are_deterministic_for_the_same_input(spec, offset, all_methods):
    outputs = set()
    for _ in range(2):
        builder, snapshot = build(spec, offset)
        outputs.add(plan(snapshot, builder.catalog, PlanOptions(all_methods=all_methods)).to_json())
    assert len(outputs) == 1
