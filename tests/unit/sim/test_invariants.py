"""The invariant checker's rules, fed by hand with a fake clock (the wiring is tested in integration)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from api import constants as k
from sim.invariants import (
    InvariantBounds,
    InvariantChecker,
    desired_healthy,
    forced_termination,
    has_disrupted_taint,
    is_protected,
)
from sim.timescale import TimeScale
from workflows.options import INSTANCE_TERMINATE_HEARTBEAT

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def node(
    name: str, instance: str | None = None, *, taint: bool = False, deadline: datetime | None = None
) -> dict:
    obj = {
        "kind": "Node",
        "metadata": {"name": name, "annotations": {}},
        "spec": {"providerID": f"aws:///us-west-2a/{instance}" if instance else ""},
    }
    if taint:
        obj["spec"]["taints"] = [{"key": k.DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}]
    if deadline is not None:
        obj["metadata"]["annotations"][k.TERMINATION_TIMESTAMP_ANNOTATION] = deadline.isoformat()
    return obj


def pod(
    name: str, node_name: str = "n1", *, owner: str = "rs-uid", ready: bool = True, **annotations
) -> dict:
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "labels": {"app": "web"},
            "annotations": dict(annotations),
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "uid": owner, "controller": True}],
        },
        "spec": {"nodeName": node_name},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "startTime": (NOW - timedelta(hours=1)).isoformat(),
        },
    }


def replicaset(replicas: int, uid: str = "rs-uid") -> dict:
    return {
        "kind": "ReplicaSet",
        "metadata": {"name": "web", "namespace": "default", "uid": uid},
        "spec": {"replicas": replicas},
    }


def pdb(**spec) -> dict:
    return {
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


def instance(instance_id: str, state: str = "running", cluster: str = "c1") -> dict:
    return {
        "InstanceId": instance_id,
        "InstanceType": "m5.large",
        "State": {"Name": state},
        "Tags": [{"Key": k.cluster_tag(cluster), "Value": "owned"}],
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def checker(clock: Clock) -> InvariantChecker:
    return InvariantChecker(
        "c1", scale=TimeScale(1.0), bounds=InvariantBounds(min_wall=0), clock=clock, wall=lambda: NOW
    )


def seed(checker: InvariantChecker, replicas: int = 3, **pdb_spec) -> list[dict]:
    checker.observe("ADDED", node("n1", "i-1"))
    checker.observe("ADDED", replicaset(replicas))
    checker.observe("ADDED", pdb(**pdb_spec))
    pods = [pod(f"web-{i}") for i in range(replicas)]
    for p in pods:
        checker.observe("ADDED", p)
    return pods


def test_desired_healthy_follows_kubernetes_rounding():
    assert desired_healthy(pdb(minAvailable=2), 3) == 2
    assert desired_healthy(pdb(minAvailable="50%"), 3) == 2  # 1.5 rounds up
    assert desired_healthy(pdb(maxUnavailable=1), 3) == 2
    assert desired_healthy(pdb(maxUnavailable="50%"), 3) == 1  # 3 - ceil(1.5)
    assert desired_healthy(pdb(maxUnavailable=5), 3) == 0
    assert desired_healthy(pdb(), 3) == 0


def test_eviction_within_budget_is_fine(checker):
    pods = seed(checker, minAvailable=2)
    checker.pod_evicted(pods[0])
    assert checker.check().ok


def test_eviction_past_the_budget_is_a_pdb_violation(checker):
    pods = seed(checker, minAvailable=2)
    checker.pod_evicted(pods[0])
    terminating = {**pods[0], "metadata": {**pods[0]["metadata"], "deletionTimestamp": NOW.isoformat()}}
    checker.observe("MODIFIED", terminating)
    checker.pod_evicted(pods[1])
    report = checker.check()
    assert [v.invariant for v in report.violations] == ["pdb-violation"]
    assert report.violations[0].subject == "pod default/web-1"
    assert report.violations[0].details == {
        "cause": "eviction",
        "pdb": "default/web",
        "healthy": 2,
        "desiredHealthy": 2,
    }


def test_max_unavailable_counts_the_replicaset_replicas(checker):
    pods = seed(checker, replicas=3, maxUnavailable=1)
    # One pod is already not ready: evicting a healthy one would leave 1 healthy of 2 required.
    checker.observe("MODIFIED", pod("web-0", ready=False))
    checker.pod_deleted(pods[1])
    assert [v.invariant for v in checker.check().violations] == ["pdb-violation"]


def test_evicting_an_unhealthy_pod_never_violates(checker):
    seed(checker, minAvailable=3)
    unready = pod("web-0", ready=False)
    checker.observe("MODIFIED", unready)
    checker.pod_evicted(unready)
    assert checker.check().ok


def test_controller_scale_down_on_a_live_node_is_not_a_disruption(checker):
    pods = seed(checker, minAvailable=3)
    checker.observe("DELETED", pods[0])
    assert checker.check().ok


def test_pods_lost_with_their_node_violate_the_budget(checker):
    pods = seed(checker, minAvailable=3)
    checker.observe("DELETED", node("n1", "i-1"))
    checker.observe("DELETED", pods[0])
    assert [v.details["cause"] for v in checker.check().violations] == ["node-gone"]


def test_pods_the_pod_gc_marks_failed_are_lost_with_their_node(checker):
    """PodGC (pkg/controller/podgc/gc_controller.go) marks an orphaned pod Failed with a
    DisruptionTarget condition before it force-deletes it: the loss is judged at the mark, not
    skipped as the deletion of a finished pod."""
    pods = seed(checker, minAvailable=3)
    checker.observe("DELETED", node("n1", "i-1"))
    failed = copy.deepcopy(pods[0])
    failed["status"]["phase"] = "Failed"
    failed["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}
    )
    checker.observe("MODIFIED", failed)
    checker.observe("DELETED", failed)
    assert [v.details["cause"] for v in checker.check().violations] == ["node-gone"]


def test_a_pod_that_finishes_is_no_loss(checker):
    pods = seed(checker, minAvailable=3)
    done = copy.deepcopy(pods[0])
    done["status"]["phase"] = "Succeeded"
    checker.observe("MODIFIED", done)
    checker.observe("DELETED", done)
    assert checker.check().ok


def test_pods_lost_with_an_instance_ec2_took_are_not_judged(checker):
    """A spot reclaim or a failed instance is no one's disruption: PDBs do not cover it."""
    pods = seed(checker, minAvailable=3)
    protected = pod("batch", owner="other", **{k.DO_NOT_DISRUPT_ANNOTATION: "true"})
    checker.observe("ADDED", protected)
    checker.instance_lost("i-1")
    checker.observe("DELETED", node("n1", "i-1"))
    checker.observe("DELETED", pods[0])
    checker.observe("DELETED", protected)
    assert checker.check().ok
    assert checker.counts["involuntary-losses"] == 2
    # An eviction of a pod of that node is still judged: karpflow asked for it.
    checker.pod_evicted(pods[1])
    assert [v.invariant for v in checker.check().violations] == ["pdb-violation"]


def test_forced_termination_past_the_deadline_is_allowed(checker):
    pods = seed(checker, minAvailable=3)
    # Deadline 20 s away, pod grace 30 s: Karpenter already deletes the pod now.
    checker.observe("MODIFIED", node("n1", "i-1", taint=True, deadline=NOW + timedelta(seconds=20)))
    checker.pod_deleted(pods[0])
    assert checker.check(in_flight=["n1"]).ok


def test_do_not_disrupt_eviction_is_reported(checker):
    seed(checker)
    protected = pod("batch", owner="other", **{k.DO_NOT_DISRUPT_ANNOTATION: "true"})
    checker.observe("ADDED", protected)
    checker.pod_evicted(protected)
    assert [v.invariant for v in checker.check().violations] == ["do-not-disrupt"]


def test_do_not_disrupt_delete_counts_only_on_a_disrupted_node(checker):
    seed(checker)
    protected = pod("batch", owner="other", **{k.DO_NOT_DISRUPT_ANNOTATION: "true"})
    checker.observe("ADDED", protected)
    checker.pod_deleted(protected)  # a person deleting a pod on a healthy node
    assert checker.check().ok
    second = pod("batch-2", owner="other", **{k.DO_NOT_DISRUPT_ANNOTATION: "true"})
    checker.observe("ADDED", second)
    checker.observe("MODIFIED", node("n1", "i-1", taint=True))
    checker.pod_deleted(second)
    assert [v.invariant for v in checker.check(in_flight=["n1"]).violations] == ["do-not-disrupt"]


def test_do_not_disrupt_durations_lapse():
    p = pod("x", **{k.DO_NOT_DISRUPT_ANNOTATION: "30m"})  # started an hour ago
    assert not is_protected(p, NOW)
    assert is_protected(pod("y", **{k.DO_NOT_DISRUPT_ANNOTATION: "2h"}), NOW)
    assert is_protected(pod("z", **{k.LEGACY_DO_NOT_EVICT_ANNOTATION: "true"}), NOW)
    assert not is_protected(pod("w", **{k.DO_NOT_DISRUPT_ANNOTATION: "maybe"}), NOW)


def test_forced_termination_uses_the_pods_grace_period():
    p = pod("x")
    p["spec"]["terminationGracePeriodSeconds"] = 5
    assert not forced_termination(p, node("n", deadline=NOW + timedelta(seconds=10)), NOW)
    assert forced_termination(p, node("n", deadline=NOW + timedelta(seconds=5)), NOW)
    assert not forced_termination(p, node("n"), NOW)


def test_beside_karpenter_the_nodeclaims_deadline_forces_too():
    """Karpenter's drain reads the deadline off the NodeClaim: a pod deleted by it is a forced
    termination even when the node itself carries no deadline (the earlier of the two counts)."""
    p = pod("x")
    p["spec"]["terminationGracePeriodSeconds"] = 5
    assert forced_termination(p, node("n"), NOW, claim_deadline=NOW + timedelta(seconds=5))
    assert not forced_termination(p, node("n"), NOW, claim_deadline=NOW + timedelta(seconds=10))
    late_node = node("n", deadline=NOW + timedelta(hours=1))
    assert forced_termination(p, late_node, NOW, claim_deadline=NOW + timedelta(seconds=5))


def test_either_disruption_taint_key_says_a_disruption_is_in_flight():
    tainted = node("n", taint=True)
    assert has_disrupted_taint(tainted)
    tainted["spec"]["taints"] = [{"key": k.KARPFLOW_DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}]
    assert has_disrupted_taint(tainted)
    tainted["spec"]["taints"] = [{"key": "karpflow.io/leaving", "effect": "PreferNoSchedule"}]
    assert not has_disrupted_taint(tainted)


def test_pods_lost_after_the_replacement_bound(checker, clock):
    pods = seed(checker, replicas=3)
    checker.tick()  # fully scheduled once: now judged
    checker.observe("DELETED", pods[0])
    clock.t += 299
    assert checker.check().ok
    clock.t += 2
    report = checker.check()
    assert [(v.invariant, v.subject) for v in report.violations] == [("pods-lost", "replicaset default/web")]
    clock.t += 100
    assert len(checker.check().violations) == 1  # one episode, one violation


def test_a_replacement_closes_the_episode(checker, clock):
    pods = seed(checker, replicas=2)
    checker.tick()
    checker.observe("DELETED", pods[0])
    clock.t += 200
    checker.tick()
    checker.observe("ADDED", pod("web-new"))
    clock.t += 200
    assert checker.check().ok


def test_a_workload_that_never_had_its_replicas_is_not_judged(checker, clock):
    checker.observe("ADDED", node("n1", "i-1"))
    checker.observe("ADDED", replicaset(2))
    checker.observe("ADDED", pod("web-0"))
    pending = pod("web-1", node_name="")
    checker.observe("ADDED", pending)
    clock.t += 10_000
    assert checker.check().ok


def test_leaked_instance_without_a_node(checker, clock):
    checker.observe_instances([instance("i-1"), instance("i-other", cluster="someone-else")])
    clock.t += 899
    assert checker.check().ok
    clock.t += 2
    report = checker.check()
    assert [(v.invariant, v.subject) for v in report.violations] == [("leaked-instance", "instance i-1")]


def test_instance_outliving_its_node_leaks_after_the_short_bound(checker, clock):
    checker.observe("ADDED", node("n1", "i-1"))
    checker.observe_instances([instance("i-1")])
    assert checker.check().ok
    checker.observe("DELETED", node("n1", "i-1"))
    clock.t += 61
    assert [v.invariant for v in checker.check().violations] == ["leaked-instance"]


def test_terminated_instances_do_not_leak(checker, clock):
    checker.observe_instances([instance("i-1", state="terminated")])
    clock.t += 10_000
    assert checker.check().ok


def test_orphan_node_after_its_instance_is_gone(checker, clock):
    checker.observe("ADDED", node("n1", "i-1"))
    checker.observe_instances([instance("i-1", state="terminated")])
    checker.tick()
    clock.t += 121
    assert [(v.invariant, v.subject) for v in checker.check().violations] == [("orphan-node", "node n1")]


def test_stale_taint_with_an_in_flight_source(checker, clock):
    in_flight = {"n1"}
    checker.set_in_flight_source(lambda: in_flight)
    checker.observe("ADDED", node("n1", taint=True))
    clock.t += 1000
    assert checker.check().ok  # in flight: fine however long
    in_flight.clear()
    checker.tick()
    clock.t += 61
    assert [v.invariant for v in checker.check().violations] == ["stale-disrupted-taint"]


def test_stale_taint_without_a_source_is_judged_at_the_end_of_the_window(checker):
    checker.observe("ADDED", node("n1", taint=True))
    checker.observe("ADDED", {**node("n2", taint=True), "metadata": {"name": "n2", "deletionTimestamp": "x"}})
    checker.tick()
    assert not checker.violations  # ticks do not judge without a source
    report = checker.check(end_of_window=True)
    assert [(v.invariant, v.subject) for v in report.violations] == [("stale-disrupted-taint", "node n1")]
    assert report.unjudged == {}


def test_a_check_without_in_flight_list_leaves_taints_unjudged(checker, clock):
    checker.observe("ADDED", node("n1", taint=True))  # a disruption may be working on it right now
    report = checker.check()
    assert report.ok and report.unjudged == {"stale-disrupted-taint": ["node n1"]}
    assert "unknown without an in-flight list: node n1" in report.summary()
    checker.observe("MODIFIED", node("n1"))  # the disruption ended and untainted it
    clock.t += 1000
    report = checker.check(in_flight=[])
    assert report.ok and report.unjudged == {}  # nothing was recorded by the blind check


def test_bounds_are_simulated_seconds(clock):
    checker = InvariantChecker("c1", scale=TimeScale(0.01), bounds=InvariantBounds(min_wall=0), clock=clock)
    checker.observe_instances([instance("i-1")])
    clock.t += 9.1  # 900 simulated seconds at 1/100
    assert not checker.check().ok


def test_announced_requests_give_the_store_event_its_cause(checker):
    pods = seed(checker, minAvailable=3)
    token = checker.announce("default", "web-0", "eviction")
    terminating = {**pods[0], "metadata": {**pods[0]["metadata"], "deletionTimestamp": NOW.isoformat()}}
    checker.observe("MODIFIED", terminating)  # what the store emits inside the eviction request
    checker.withdraw(token)
    report = checker.check()
    assert [(v.invariant, v.details["cause"]) for v in report.violations] == [("pdb-violation", "eviction")]
    assert report.observed["evictions"] == 1
    # Without an announcement the same change is a controller's doing on a live node: not judged.
    checker.observe("MODIFIED", {**pods[1], "metadata": {**pods[1]["metadata"], "deletionTimestamp": "x"}})
    assert len(checker.check().violations) == 1


def test_pods_lost_waits_for_its_wall_floor_on_a_fast_scale(clock):
    fast = InvariantChecker("c1", scale=TimeScale(0.01), bounds=InvariantBounds(min_wall=0), clock=clock)
    pods = seed(fast, replicas=2)
    fast.tick()
    fast.observe("DELETED", pods[0])
    clock.t += 9  # 900 s simulated, but a loaded machine may take this long to reschedule
    assert fast.check().ok
    clock.t += 2
    assert [v.invariant for v in fast.check().violations] == ["pods-lost"]


def test_orphan_node_waits_for_its_wall_floor_on_a_fast_scale(clock):
    """A termination whose worker was killed between terminating the instance and deleting the Node
    (or while terminate_instance waited for EC2) resumes after Temporal's timeouts, real seconds however
    fast the simulated clock runs."""
    floor = InvariantBounds().orphan_min_wall
    assert floor == INSTANCE_TERMINATE_HEARTBEAT.total_seconds() + 30  # a heartbeat timeout, task timeouts
    fast = InvariantChecker("c1", scale=TimeScale(0.01), bounds=InvariantBounds(min_wall=0), clock=clock)
    fast.observe("ADDED", node("n1", "i-1"))
    fast.observe_instances([instance("i-1", state="terminated")])
    fast.tick()
    clock.t += floor - 1  # far past 120 s simulated: the recovery is real time
    assert fast.check().ok
    clock.t += 2
    assert [(v.invariant, v.subject) for v in fast.check().violations] == [("orphan-node", "node n1")]
