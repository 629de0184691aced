import copy

from sim.controllers.daemonsets import daemon_tolerations, pinned_affinity, pinned_node, should_run
from sim.controllers.workloads import _delete_priority, template_hash


def node(labels=None, taints=None):
    return {"metadata": {"name": "n1", "labels": labels or {}}, "spec": {"taints": taints or []}}


def test_daemon_pods_get_the_automatic_tolerations_only():
    tolerations = daemon_tolerations({"tolerations": [{"key": "mine", "operator": "Exists"}]})
    keys = {(t["key"], t["effect"]) for t in tolerations if "effect" in t}
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in keys
    assert ("node.kubernetes.io/not-ready", "NoExecute") in keys
    assert ("node.kubernetes.io/network-unavailable", "NoSchedule") not in keys
    assert not any(t["key"] == "karpenter.sh/disrupted" for t in tolerations)
    assert {"key": "mine", "operator": "Exists"} in tolerations
    host = daemon_tolerations({"hostNetwork": True})
    assert any(t["key"] == "node.kubernetes.io/network-unavailable" for t in host)


def test_should_run_distinguishes_new_pods_from_existing_ones():
    spec = {"nodeSelector": {"role": "worker"}}
    tolerations = daemon_tolerations(spec)
    assert should_run(spec, tolerations, node({"role": "worker"})) == (True, True)
    assert should_run(spec, tolerations, node({"role": "db"})) == (False, False)
    disrupted = node({"role": "worker"}, [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])
    assert should_run(spec, tolerations, disrupted) == (False, True)  # no new pod, the old one stays
    evicting = node({"role": "worker"}, [{"key": "dedicated", "effect": "NoExecute"}])
    assert should_run(spec, tolerations, evicting) == (False, False)
    tolerant = {**spec, "tolerations": [{"key": "karpenter.sh/disrupted", "operator": "Exists"}]}
    assert should_run(tolerant, daemon_tolerations(tolerant), disrupted) == (True, True)


def test_a_node_being_deleted_keeps_its_daemon_pods():
    """NodeShouldRunDaemonPod (pkg/controller/daemon/daemon_controller.go) reads the node's name,
    affinity and taints only: a finalizer holding `kubectl delete node` changes none of them."""
    spec = {"nodeSelector": {"role": "worker"}}
    deleting = node({"role": "worker"})
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting["metadata"]["finalizers"] = ["karpenter.sh/termination"]
    assert should_run(spec, daemon_tolerations(spec), deleting) == (True, True)


def test_a_template_naming_another_node_runs_nowhere_else():
    spec = {"nodeName": "n2"}
    assert should_run(spec, daemon_tolerations(spec), node()) == (False, False)


def test_daemon_pods_pin_to_their_node_and_keep_preferences():
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]
    spec = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}}
    before = copy.deepcopy(spec)
    affinity = pinned_affinity(spec, "node-7")
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert pinned_node({"spec": {"affinity": affinity}}) == "node-7"
    assert pinned_node({"spec": {"nodeName": "node-8", "affinity": affinity}}) == "node-8"
    assert spec == before  # the DaemonSet's template is not modified


def test_template_hash_is_stable_and_sensitive():
    template = {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    same = {"spec": {"containers": [{"image": "x", "name": "c"}]}, "metadata": {"labels": {"app": "a"}}}
    assert template_hash(template) == template_hash(same)
    assert template_hash(template) != template_hash({**template, "metadata": {"labels": {"app": "b"}}})
    assert set(template_hash(template)) <= set("bcdfghjklmnpqrstvwxz2456789")


def test_scale_down_removes_unscheduled_then_unready_then_cheap_then_young_pods():
    def pod(name, node=None, phase="Pending", ready=False, cost=None, created="2026-01-01T00:00:00Z"):
        annotations = {"controller.kubernetes.io/pod-deletion-cost": str(cost)} if cost is not None else {}
        return {
            "metadata": {"name": name, "annotations": annotations, "creationTimestamp": created},
            "spec": {"nodeName": node} if node else {},
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }

    pods = [
        pod("old-ready", "n", "Running", True, created="2026-01-01T00:00:00Z"),
        pod("young-ready", "n", "Running", True, created="2026-01-02T00:00:00Z"),
        pod("costly", "n", "Running", True, cost=100, created="2026-01-03T00:00:00Z"),
        pod("unready", "n", "Running", False),
        pod("bound-pending", "n"),
        pod("unscheduled"),
    ]
    order = [p["metadata"]["name"] for p in sorted(pods, key=_delete_priority)]
    assert order == ["unscheduled", "bound-pending", "unready", "young-ready", "old-ready", "costly"]
