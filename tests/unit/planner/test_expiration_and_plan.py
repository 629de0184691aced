import json
from datetime import timedelta

from planner.drift import Drift
from planner.emptiness import Emptiness
from planner.model import EMPTINESS, BudgetMap, Candidate, Command, DisruptionClass, PlanContext, PlanOptions
from planner.plan import plan
from sim.cluster_builder import NODECLAIM_SPEC, ClusterBuilder


def run(b: ClusterBuilder, methods=None, **options):
    methods = methods if methods is not None else [Emptiness(), Drift()]
    return plan(b.snapshot(), b.catalog, PlanOptions(**options), methods=methods, simulate=None)


# --- Expiration -------------------------------------------------------------------------------------


def test_an_expired_node_gets_a_forceful_command_outside_the_budgets():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h", budgets=[{"nodes": "0"}])
    b.node("old", age=timedelta(hours=25))
    b.pod("web-1", "old", app="web", annotations={"karpenter.sh/do-not-disrupt": "true"})
    b.pdb("web", match_labels={"app": "web"}, allowed=0)
    b.node("young", age=timedelta(hours=23))
    result = run(b)
    (command,) = result.commands
    assert (command.method, command.reason, command.decision) == ("expiration", "Expired", "delete")
    assert command.nodes == ["old"] and command.replacements == [] and command.disruption_class == "forceful"
    assert command.savings_per_hour == 0.0
    assert command.message == "expired at 2026-11-22T09:00:00Z (expireAfter 24h)"


def test_expire_after_never_and_the_720h_default():
    b = ClusterBuilder()
    b.nodepool("forever", expire_after="Never")
    b.nodepool("default")
    b.node("a", pool="forever", age=timedelta(days=400))
    b.node("b", age=timedelta(days=31))
    b.node("c", age=timedelta(days=29))
    assert [c.nodes for c in run(b, methods=[]).commands] == [["b"]]


def test_a_nodeclaim_expire_after_wins_over_the_nodepool():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="720h")
    node = b.node("n1", age=timedelta(hours=3))
    b.add(
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": "c1", "creationTimestamp": node["metadata"]["creationTimestamp"]},
            "spec": {**NODECLAIM_SPEC, "expireAfter": "2h"},
            "status": {"nodeName": "n1"},
        }
    )
    assert [c.nodes for c in run(b, methods=[]).commands] == [["n1"]]


def test_expiring_nodes_count_as_disrupting_for_the_other_methods():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h", budgets=[{"nodes": "1"}])
    b.node("expired", age=timedelta(days=2))
    b.pod("web-1", "expired")
    b.node("empty", age=timedelta(hours=2))
    result = run(b)
    assert [c.method for c in result.commands] == ["expiration"]
    assert {x.node: x.reason for x in result.blocked}["empty"].startswith(
        "empty, but nodepool default budget"
    )
    assert result.budgets["default"]["Empty"] == 0


# --- The pass ---------------------------------------------------------------------------------------


class Recorder:
    """A method that records what it was given and returns a fixed command for its first candidate."""

    def __init__(self, name, produce=True, disruption_class=DisruptionClass.GRACEFUL):
        self.name = name
        self.reason = "Underutilized"
        self.disruption_class = disruption_class
        self.consolidation_type = "single"
        self.produce = produce
        self.seen: list[str] | None = None

    def should_disrupt(self, ctx: PlanContext, candidate: Candidate) -> bool:
        return True

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        self.seen = [c.name for c in candidates]
        if not self.produce or not candidates or not budgets.take(candidates[0].pool_name):
            return []
        return [Command(self.name, self.reason, [candidates[0]])]

    def validate(self, ctx, command):
        raise AssertionError("not used")


def busy_cluster() -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    for name, pods in (("n1", 3), ("n2", 1), ("n3", 2)):
        b.node(name)
        for i in range(pods):
            b.pod(f"{name}-web-{i}", name)
    b.node("blocked")
    b.pod("batch-1", "blocked", annotations={"karpenter.sh/do-not-disrupt": "true"})
    return b


def test_the_first_method_that_produces_commands_ends_the_pass():
    first, second = Recorder("first"), Recorder("second")
    result = run(busy_cluster(), methods=[first, second])
    assert [c.method for c in result.commands] == ["first"]
    assert second.seen is None and result.summary.ended_by == "first"
    left = {x.node: x.reason for x in result.blocked}
    assert left["n1"] == "not chosen this pass: first produced commands, which ends the pass"


def test_methods_that_produce_nothing_let_the_next_one_run():
    first, second = Recorder("first", produce=False), Recorder("second")
    result = run(busy_cluster(), methods=[first, second])
    assert [c.method for c in result.commands] == ["second"]


def test_all_methods_runs_every_method_and_later_ones_skip_chosen_nodes():
    first, second = Recorder("first"), Recorder("second")
    result = run(busy_cluster(), methods=[first, second], all_methods=True)
    assert [c.method for c in result.commands] == ["first", "second"]
    assert result.commands[0].nodes[0] not in second.seen


def test_methods_get_candidates_in_disruption_cost_order_without_pod_blocked_ones():
    graceful = Recorder("graceful", produce=False)
    run(busy_cluster(), methods=[graceful])
    assert graceful.seen == ["n2", "n3", "n1"]


def test_every_managed_node_not_in_a_command_has_a_reason():
    b = busy_cluster()
    b.node("unmanaged", pool=None)
    b.node("fresh", initialized=False)
    result = run(b, methods=[Emptiness(), Drift()])
    assert result.commands == []
    reasons = {x.node: x.reason for x in result.blocked}
    assert set(reasons) == {"n1", "n2", "n3", "blocked", "fresh"}
    assert reasons["blocked"] == "pod default/batch-1 has karpenter.sh/do-not-disrupt"
    assert reasons["n1"] == "not empty and not drifted (no consolidation method available)"
    assert all(reasons.values())
    assert result.summary.managed == 5 and result.summary.nodes == 6


def test_plan_json_has_the_documented_shape():
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("empty")
    b.node("busy")
    b.pod("web-1", "busy", app="web")
    b.pdb("web", match_labels={"app": "web"}, allowed=0)
    data = json.loads(run(b).to_json())
    assert data["at"] == "2026-11-22T10:00:00Z"
    (command,) = data["commands"]
    assert {"method", "reason", "decision", "nodes", "nodepools", "replacements", "savingsPerHour"} <= set(
        command
    )
    assert (
        command["method"] == EMPTINESS
        and command["nodes"] == ["empty"]
        and command["nodepools"] == ["default"]
    )
    assert data["blocked"] == [
        {
            "node": "busy",
            "nodepool": "default",
            "reason": "pdb default/web prevents pod evictions",
            "details": [],
        }
    ]
    # 2 nodes, default budget 10% rounded up: 1 allowed when the pass starts, 0 once "empty" goes.
    assert data["budgetsAtStart"] == {"default": {"Underutilized": 1, "Empty": 1, "Drifted": 1}}
    assert data["budgets"] == {"default": {"Underutilized": 0, "Empty": 0, "Drifted": 0}}
    assert data["budgetNodes"] == {"default": {"nodes": 2, "disrupting": 0, "thisPlan": 1}}


def test_budgets_are_reported_at_the_start_of_the_pass_and_after_its_commands():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h", budgets=[{"nodes": "3"}])
    b.node("expired", age=timedelta(days=2))
    b.pod("web-1", "expired")
    # NotReady for less than repair's 30 min toleration: disrupting for budgets, not yet repaired.
    b.node("notready", ready=False, age=timedelta(hours=2), ready_for=timedelta(minutes=5))
    b.node("empty", age=timedelta(hours=2))
    b.node("busy", age=timedelta(hours=2))
    b.pod("web-2", "busy")
    result = run(b)
    assert [c.method for c in result.commands] == ["expiration", "emptiness"]
    # 3 allowed; notready was disrupting before the pass: 2 left at its start, and its two commands
    # (expired, then empty) spend them.
    assert result.budgets_at_start["default"] == {"Underutilized": 2, "Empty": 2, "Drifted": 2}
    assert result.budgets["default"] == {"Underutilized": 0, "Empty": 0, "Drifted": 0}
    counts = result.budget_nodes["default"]
    assert (counts.nodes, counts.disrupting, counts.this_plan) == (4, 1, 2)


def test_plans_are_deterministic():
    b = busy_cluster()
    for i in range(5):
        b.node(f"e{i}")
    first = run(b, all_methods=True).to_json()
    assert all(run(b, all_methods=True).to_json() == first for _ in range(3))


def test_an_expired_nodes_pods_that_fit_nowhere_get_replacements_before_it_drains():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h")
    b.node("old", age=timedelta(hours=25))
    b.pod("big", "old", cpu="1500m")
    b.node("young", age=timedelta(hours=1))
    b.pod("other", "young", cpu="1500m")  # no room left for `big`
    result = plan(b.snapshot(), b.catalog, PlanOptions(), methods=[])
    (command,) = result.commands
    assert command.reason == "Expired" and command.nodes == ["old"] and command.disruption_class == "forceful"
    (replacement,) = command.replacements
    assert replacement.nodepool == "default" and replacement.pods == 1
    assert "replacement(s) for its pods are launched first" in command.message


def test_an_expired_node_whose_pods_fit_elsewhere_needs_no_replacement():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h")
    b.node("old", age=timedelta(hours=25))
    b.pod("small", "old", cpu="100m")
    b.node("young", age=timedelta(hours=1))
    (command,) = plan(b.snapshot(), b.catalog, PlanOptions(), methods=[]).commands
    assert command.replacements == []
