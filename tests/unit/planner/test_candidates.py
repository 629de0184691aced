from datetime import datetime, timedelta

import pytest
import yaml

from planner.candidates import (
    build_candidates,
    consolidation_block,
    round_robin_by_nodepool,
    sort_by_disruption_cost,
)
from planner.plan import plan
from sim.cluster_builder import ClusterBuilder


def cluster(**pool) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodeclass()
    b.nodepool("default", **pool)
    return b


def outcome(b: ClusterBuilder) -> dict[str, str | None]:
    """node -> blocked reason, or the candidate's pod block (None: a clean candidate)."""
    candidates, blocked = build_candidates(b.context())
    out: dict[str, str | None] = {x.node: x.reason for x in blocked}
    out.update({c.name: c.pod_block for c in candidates})
    return out


def test_unmanaged_nodes_are_neither_candidates_nor_reported():
    b = cluster()
    b.node("unmanaged", pool=None)
    assert outcome(b) == {}


def test_a_node_whose_nodepool_is_missing_is_blocked():
    b = cluster()
    b.node("orphan", pool="gone")
    assert outcome(b) == {"orphan": "nodepool gone not found"}


NOT_READY_NODECLASS = """
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: sick}
spec:
  role: KarpenterNodeRole
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}]
status:
  conditions:
  - type: Ready
    status: "False"
    reason: SubnetsNotFound
    message: SubnetSelector did not match any Subnets
    lastTransitionTime: "2026-11-22T09:00:00Z"
"""


def test_a_node_whose_pools_ec2nodeclass_is_missing_or_not_ready_is_blocked():
    b = cluster()
    b.add(yaml.safe_load(NOT_READY_NODECLASS))
    b.nodepool("orphaned", nodeclass="gone")
    b.nodepool("ailing", nodeclass="sick")
    b.node("n1", pool="orphaned", nodeclass="gone")
    b.node("n2", pool="ailing", nodeclass="sick")
    b.node("n3")
    assert outcome(b) == {
        "n1": "EC2NodeClass gone not found",
        "n2": "EC2NodeClass sick is not Ready: SubnetSelector did not match any Subnets",
        "n3": None,
    }
    problems = plan(b.snapshot(), b.catalog).problems
    assert "NodePool orphaned: EC2NodeClass gone not found; its nodes are left alone" in "\n".join(problems)


def test_a_missing_ec2nodeclass_is_not_judged_when_the_snapshot_has_none():
    b = ClusterBuilder()
    b.nodepool("default", nodeclass="never-captured")
    b.node("n1", nodeclass="never-captured")
    assert outcome(b) == {"n1": None}


def test_an_uninitialized_node_is_blocked():
    b = cluster()
    b.node("fresh", initialized=False)
    assert outcome(b)["fresh"] == "node is not initialized (karpenter.sh/initialized is not true)"


def test_a_deleting_node_is_blocked():
    b = cluster()
    b.node("going", deleting=True)
    assert outcome(b)["going"] == "node is being deleted"


def test_a_node_tainted_disrupted_is_already_in_flight():
    b = cluster()
    b.node("busy", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])
    assert outcome(b)["busy"] == "disruption already in progress (karpenter.sh/disrupted taint)"


def test_node_do_not_disrupt_annotation_blocks_the_node():
    b = cluster()
    b.node("pinned", annotations={"karpenter.sh/do-not-disrupt": "true"})
    assert outcome(b)["pinned"] == "node has karpenter.sh/do-not-disrupt"


def test_pod_do_not_disrupt_blocks_graceful_disruption():
    b = cluster()
    b.node("n1")
    b.pod("batch-1", "n1", annotations={"karpenter.sh/do-not-disrupt": "true"})
    assert outcome(b)["n1"] == "pod default/batch-1 has karpenter.sh/do-not-disrupt"


def test_legacy_do_not_evict_pod_annotation_blocks_too():
    b = cluster()
    b.node("n1")
    b.pod("batch-1", "n1", annotations={"karpenter.sh/do-not-evict": "true"})
    assert outcome(b)["n1"] == "pod default/batch-1 has karpenter.sh/do-not-evict"


def test_do_not_disrupt_with_a_duration_protects_only_for_that_long_after_start():
    b = cluster()
    b.node("n1")
    b.node("n2")
    b.pod("young", "n1", age=timedelta(minutes=10), annotations={"karpenter.sh/do-not-disrupt": "30m"})
    b.pod("old", "n2", age=timedelta(hours=2), annotations={"karpenter.sh/do-not-disrupt": "30m"})
    result = outcome(b)
    assert result["n1"] == "pod default/young has karpenter.sh/do-not-disrupt=30m"
    assert result["n2"] is None


def test_terminating_and_finished_pods_do_not_block():
    b = cluster()
    b.node("n1")
    b.pod("leaving", "n1", deleting=True, annotations={"karpenter.sh/do-not-disrupt": "true"})
    b.pod("done", "n1", phase="Succeeded", annotations={"karpenter.sh/do-not-disrupt": "true"})
    assert outcome(b)["n1"] is None


def test_a_pdb_with_no_disruptions_allowed_blocks_the_node():
    b = cluster()
    b.node("n1")
    b.pod("web-1", "n1", app="web")
    b.pdb("web", match_labels={"app": "web"}, allowed=0)
    assert outcome(b)["n1"] == "pdb default/web prevents pod evictions"


def test_a_pdb_that_still_allows_disruptions_does_not_block():
    b = cluster()
    b.node("n1")
    b.pod("web-1", "n1", app="web")
    b.pdb("web", match_labels={"app": "web"}, allowed=1)
    assert outcome(b)["n1"] is None


def test_a_pod_under_two_pdbs_blocks_the_node():
    b = cluster()
    b.node("n1")
    b.pod("web-1", "n1", app="web", labels={"tier": "front"})
    b.pdb("web", match_labels={"app": "web"}, allowed=5)
    b.pdb("front", match_labels={"tier": "front"}, allowed=5)
    assert outcome(b)["n1"] == (
        "pod default/web-1 is covered by more than one PDB (default/front, default/web);"
        " evictions would be refused"
    )


def test_always_allow_lets_an_unready_pod_through_a_blocking_pdb():
    b = cluster()
    b.node("n1")
    b.node("n2")
    b.pod("web-1", "n1", app="web", ready=False)
    b.pod("api-1", "n2", app="api", ready=False)
    b.pdb("web", match_labels={"app": "web"}, allowed=0, unhealthy_pod_eviction_policy="AlwaysAllow")
    b.pdb("api", match_labels={"app": "api"}, allowed=0)
    result = outcome(b)
    assert result["n1"] is None
    assert result["n2"] == "pdb default/api prevents pod evictions"


def test_daemonset_pods_tolerating_the_disrupted_taint_are_not_checked_against_pdbs():
    b = cluster()
    b.node("n1")
    b.daemonset_pod("n1", "kube-proxy")
    b.pdb("kube-proxy", namespace="kube-system", match_labels={"app": "kube-proxy"}, allowed=0)
    assert outcome(b)["n1"] is None


def test_reschedulable_pods_skip_daemonset_mirror_and_finished_pods_but_keep_terminating_statefulset_pods():
    b = cluster()
    b.node("n1")
    b.pod("web-1", "n1")
    b.daemonset_pod("n1")
    b.pod("etcd-n1", "n1", namespace="kube-system", owner=("Node", "n1"))
    b.pod("job-1", "n1", phase="Succeeded", owner=("Job", "job"))
    b.pod("db-0", "n1", owner=("StatefulSet", "db"), deleting=True)
    b.pod("web-2", "n1", deleting=True)
    (candidate,), _ = build_candidates(b.context())
    assert sorted(p.key for p in candidate.reschedulable_pods) == ["default/db-0", "default/web-1"]


def test_node_do_not_consolidate_blocks_consolidation_but_not_other_methods():
    b = cluster()
    b.node("n1", annotations={"karpenter.sh/do-not-consolidate": "true"})
    ctx = b.context()
    (candidate,), blocked = build_candidates(ctx)
    assert blocked == []
    assert consolidation_block(ctx, candidate) == "node has karpenter.sh/do-not-consolidate"


@pytest.mark.parametrize(
    ("node_kwargs", "expected"),
    [
        ({"instance_type": "x9.huge"}, "instance type x9.huge is not in the catalog; cannot price it"),
        ({"capacity_type": "dedicated"}, "the catalog has no offering for dedicated m5.large in us-west-2a"),
    ],
)
def test_consolidation_needs_a_priced_instance_type(node_kwargs, expected):
    b = cluster()
    b.node("n1", **node_kwargs)
    ctx = b.context()
    (candidate,), _ = build_candidates(ctx)
    assert consolidation_block(ctx, candidate).startswith(expected)


def test_a_reserved_node_is_priced_even_without_a_reserved_offering():
    # A reservation no EC2NodeClass selects any more still prices its node as Karpenter prices a
    # reserved offering (on-demand / 10^7, planner/reservations.py): it is paid for, so never worth
    # moving out to on-demand, and still deletable (tests/unit/planner/test_reservations.py).
    b = cluster()
    b.node("n1", capacity_type="reserved")
    ctx = b.context()
    (candidate,), _ = build_candidates(ctx)
    assert candidate.price is not None and 0 < candidate.price < 1e-6
    assert consolidation_block(ctx, candidate) is None


def test_when_empty_policy_only_consolidates_empty_nodes():
    b = cluster(policy="WhenEmpty")
    b.node("busy")
    b.pod("web-1", "busy")
    b.node("idle")
    ctx = b.context()
    candidates, _ = build_candidates(ctx)
    blocks = {c.name: consolidation_block(ctx, c) for c in candidates}
    assert blocks == {
        "busy": "nodepool default has consolidationPolicy WhenEmpty and the node is not empty",
        "idle": None,
    }


def test_consolidatable_only_after_consolidate_after_since_the_last_pod_event():
    b = cluster(consolidate_after="30m")
    b.node("recent")
    b.pod("web-1", "recent", age=timedelta(minutes=10))  # bound 10 minutes ago
    b.node("quiet")
    b.pod("web-2", "quiet", age=timedelta(hours=2))
    b.node("new-node", age=timedelta(minutes=20), ready_for=timedelta(minutes=19))
    ctx = b.context()
    candidates = {c.name: c for c in build_candidates(ctx)[0]}
    assert candidates["recent"].consolidatable_at == ctx.now + timedelta(minutes=20)
    assert consolidation_block(ctx, candidates["recent"]).startswith(
        "not consolidatable until 2026-11-22T10:20:00Z"
    )
    assert consolidation_block(ctx, candidates["quiet"]) is None
    assert not candidates["new-node"].consolidatable(ctx.now)  # became Ready 19 minutes ago


def test_daemonset_pod_events_do_not_reset_the_consolidate_after_clock():
    b = cluster(consolidate_after="30m")
    b.node("n1", ready_for=timedelta(hours=3))
    b.daemonset_pod("n1")  # started an hour ago, but DaemonSet pods do not count
    b.objects[-1]["status"]["startTime"] = "2026-11-22T09:59:00Z"
    ctx = b.context()
    (candidate,), _ = build_candidates(ctx)
    assert candidate.consolidatable(ctx.now)


def test_a_pod_finishing_or_terminating_resets_the_clock():
    b = cluster(consolidate_after="30m")
    b.node("n1", ready_for=timedelta(hours=3))
    job = b.pod("job-1", "n1", phase="Succeeded", age=timedelta(hours=2), owner=("Job", "job"))
    job["status"]["containerStatuses"] = [
        {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-22T09:50:00Z"}}}
    ]
    b.node("n2", ready_for=timedelta(hours=3))
    b.pod("web-1", "n2", age=timedelta(hours=2), deleting=True)  # deleted 5 s ago
    ctx = b.context()
    candidates = {c.name: c for c in build_candidates(ctx)[0]}
    assert candidates["n1"].consolidatable_at == ctx.now + timedelta(minutes=20)
    assert candidates["n2"].consolidatable_at == ctx.now - timedelta(seconds=5) + timedelta(minutes=30)


TERMINATING_POD = """
kind: Pod
metadata:
  name: web-1
  namespace: default
  ownerReferences: [{kind: ReplicaSet, name: web, controller: true}]
  creationTimestamp: "2026-11-22T08:00:00Z"
  deletionTimestamp: "2026-11-22T10:01:00Z"   # in the future: request time + grace period
{grace}
spec:
  nodeName: n1
  terminationGracePeriodSeconds: 120
  containers: [{name: c}]
status: {phase: Running, startTime: "2026-11-22T08:00:00Z"}
"""


@pytest.mark.parametrize(
    ("grace", "requested"),
    [
        ("  deletionGracePeriodSeconds: 300", "09:56:00"),  # the grace the delete request gave
        ("", "09:59:00"),  # else the pod spec's terminationGracePeriodSeconds
    ],
)
def test_consolidate_after_counts_from_the_delete_request_not_the_deletion_timestamp(grace, requested):
    b = cluster(consolidate_after="30m")
    b.node("n1", ready_for=timedelta(hours=3))
    b.add(yaml.safe_load(TERMINATING_POD.replace("{grace}", grace)))
    (candidate,), _ = build_candidates(b.context())
    assert candidate.consolidatable_at == datetime.fromisoformat(f"2026-11-22T{requested}Z") + timedelta(
        minutes=30
    )


def test_consolidate_after_never_disables_consolidation():
    b = cluster(consolidate_after="Never")
    b.node("n1")
    ctx = b.context()
    (candidate,), _ = build_candidates(ctx)
    assert candidate.consolidatable_at is None
    assert (
        consolidation_block(ctx, candidate)
        == "consolidation is disabled for nodepool default (consolidateAfter: Never)"
    )


def test_disruption_cost_puts_fewer_lower_priority_and_soon_expiring_nodes_first():
    b = cluster(expire_after="100h")
    b.node("two-pods", age=timedelta(hours=10))
    b.pod("a-1", "two-pods")
    b.pod("a-2", "two-pods")
    b.node("one-pod", age=timedelta(hours=10))
    b.pod("b-1", "one-pod")
    b.node("one-important-pod", age=timedelta(hours=10))
    b.pod("c-1", "one-important-pod", priority=2**25)  # +1 eviction cost
    b.node("two-pods-expiring", age=timedelta(hours=90))  # 10% lifetime left
    b.pod("d-1", "two-pods-expiring")
    b.pod("d-2", "two-pods-expiring")
    candidates, _ = build_candidates(b.context())
    costs = {c.name: round(c.disruption_cost, 6) for c in candidates}
    assert costs == {"two-pods": 1.8, "one-pod": 0.9, "one-important-pod": 1.8, "two-pods-expiring": 0.2}
    order = [c.name for c in sort_by_disruption_cost(candidates)]
    assert order == ["two-pods-expiring", "one-pod", "one-important-pod", "two-pods"]


def test_eviction_cost_uses_deletion_cost_and_clamps():
    b = cluster(expire_after="Never")
    b.node("n1")
    b.pod("cheap", "n1", annotations={"controller.kubernetes.io/pod-deletion-cost": str(-(2**31))})
    b.node("n2")
    b.pod("precious", "n2", priority=2_000_000_000)
    candidates = {c.name: c.disruption_cost for c in build_candidates(b.context())[0]}
    assert candidates == {"n1": -10.0, "n2": 10.0}


def test_round_robin_interleaves_nodepools_and_puts_unreached_pools_first():
    b = cluster()
    b.nodepool("other")
    for i in range(3):
        b.node(f"a{i}")
        b.node(f"b{i}", pool="other")
    candidates = sort_by_disruption_cost(build_candidates(b.context())[0])
    assert [c.name for c in round_robin_by_nodepool(candidates)] == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert [c.name for c in round_robin_by_nodepool(candidates, ["other"])] == [
        "b0",
        "a0",
        "b1",
        "a1",
        "b2",
        "a2",
    ]
