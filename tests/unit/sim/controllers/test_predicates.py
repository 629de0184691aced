from planner.resources import Resources
from sim.controllers.predicates import (
    node_accepts,
    node_selection_matches,
    pod_requests,
    tolerates,
    untolerated_taints,
)


def node(name="n1", labels=None, taints=None, ready=True, unschedulable=False):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_toleration_matching_rules():
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerates({"key": "k", "value": "v"}, taint)
    assert tolerates({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, taint)
    assert not tolerates({"key": "k", "value": "other"}, taint)
    assert tolerates({"key": "k", "operator": "Exists"}, taint)
    assert not tolerates({"key": "k", "operator": "Exists", "effect": "NoExecute"}, taint)
    assert tolerates({"operator": "Exists"}, taint)
    assert not tolerates({"key": "", "operator": "Equal"}, taint)
    assert not tolerates({"key": "other", "operator": "Exists"}, taint)


def test_prefer_no_schedule_never_blocks():
    taints = [{"key": "a", "effect": "PreferNoSchedule"}, {"key": "b", "effect": "NoExecute"}]
    assert [t["key"] for t in untolerated_taints([], taints)] == ["b"]


def test_node_selector_and_required_affinity():
    n = node(labels={"zone": "a", "size": "8"})
    assert node_selection_matches({"nodeSelector": {"zone": "a"}}, n)
    assert not node_selection_matches({"nodeSelector": {"zone": "b"}}, n)

    def affinity(*terms):
        required = {"nodeSelectorTerms": list(terms)}
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}

    def expr(key, operator, *values):
        return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}

    assert node_selection_matches(affinity(expr("zone", "In", "a")), n)
    assert node_selection_matches(
        affinity(
            expr("zone", "In", "x"),
            expr("size", "Gt", "4"),
        ),
        n,
    )
    assert not node_selection_matches(affinity(expr("size", "Lt", "4")), n)
    assert node_selection_matches(affinity(expr("gpu", "DoesNotExist")), n)
    assert node_selection_matches(affinity(expr("gpu", "NotIn", "x")), n)
    assert not node_selection_matches(affinity(expr("gpu", "Exists")), n)
    assert node_selection_matches(
        affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}), n
    )
    assert not node_selection_matches(affinity({}), n)  # an empty term selects nothing


def test_readiness_and_cordon_need_tolerations():
    not_ready = node(ready=False, taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
    assert not node_accepts({}, not_ready)
    ds_tolerations = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert node_accepts({"tolerations": ds_tolerations}, not_ready)
    cordoned = node(unschedulable=True)
    assert not node_accepts({}, cordoned)
    assert node_accepts({"tolerations": ds_tolerations}, cordoned)


def test_pod_requests_follow_the_init_container_rule():
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}},
            {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},  # limits default the requests
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
        "overhead": {"memory": "64Mi"},
    }
    req = pod_requests(spec)
    assert req.cpu == 2000
    assert req.memory == (256 + 1024 + 64) << 20
    assert req.pods == 1
    assert pod_requests({}) == Resources(pods=1)
