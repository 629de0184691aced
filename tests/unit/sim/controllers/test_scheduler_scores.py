"""The simulated kube-scheduler's scores, each with the kube-scheduler behaviour it reproduces
(kubernetes/kubernetes pkg/scheduler/framework/plugins/...; the files are named in each test)."""

import random

import numpy as np

from sim.controllers.scheduling import scores

from .scheduler_helpers import (
    ZONE,
    make_node,
    make_pod,
    make_replicaset,
    new_store,
    placement,
    scheduler_for,
)

# --- the arithmetic ----------------------------------------------------------------------------------


def test_least_allocated_and_balanced_allocation_give_upstreams_numbers():
    """noderesources/least_allocated_test.go and balanced_allocation_test.go, "nothing scheduled,
    resources requested, differently sized nodes": a 3000m / 5000 pod on 4000m / 10000 and on
    6000m / 10000."""
    assert scores.least_allocated(4000, 10000, 3000, 5000) == 37  # (25 + 50) / 2
    assert scores.least_allocated(6000, 10000, 3000, 5000) == 50
    assert scores.balanced_allocation(4000, 10000, 3000, 5000) == 87  # (1 - |0.75 - 0.5| / 2) * 100
    assert scores.balanced_allocation(6000, 10000, 3000, 5000) == 100
    assert scores.least_allocated(4000, 10000, 5000, 5000) == 25  # over on cpu: that resource scores 0
    assert scores.least_allocated(0, 10000, 0, 5000) == 50  # no cpu at all: memory alone
    assert scores.balanced_allocation(0, 10000, 0, 5000) == 100  # one resource: no deviation


def test_the_array_forms_agree_with_the_scalar_ones():
    rng = random.Random(3)
    cases = [
        (
            rng.choice([0, 2000, 4000]),
            rng.choice([0, 8 << 30]),
            rng.randrange(0, 6000),
            rng.randrange(0, 12 << 30),
        )
        for _ in range(500)
    ]
    columns = [np.array(c, dtype=np.int64) for c in zip(*cases, strict=True)]
    assert list(scores.least_allocated_many(*columns)) == [scores.least_allocated(*c) for c in cases]
    assert list(scores.balanced_allocation_many(*columns)) == [scores.balanced_allocation(*c) for c in cases]


def test_normalizations():
    """helper/normalize_score.go DefaultNormalizeScore (reversed for TaintToleration), PodTopologySpread
    NormalizeScore (ignored nodes 0, `100 * (max + min - s) / max`), InterPodAffinity's min-max, and
    Go's math.Round (half away from zero, where numpy rounds half to even)."""
    ints = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    assert list(scores.taint_toleration_normalized(ints(0, 1, 2))) == [100, 50, 0]
    assert list(scores.taint_toleration_normalized(ints(0, 0))) == [100, 100]
    assert list(scores.node_affinity_normalized(ints(0, 5, 10))) == [0, 50, 100]
    ignored = np.array([False, False, True])
    assert list(scores.spread_normalized(ints(2, 6, 0), ignored)) == [100, 33, 0]
    assert list(scores.spread_normalized(ints(0, 0), None)) == [100, 100]
    assert list(scores.inter_pod_normalized(ints(-2, 0, 2))) == [0, 50, 100]
    assert list(scores.inter_pod_normalized(ints(3, 3))) == [0, 0]
    assert list(scores.go_round(np.array([2.5, 3.5, 0.49]))) == [3, 4, 0]


# --- NodeResourcesFit LeastAllocated and BalancedAllocation (noderesources/) ------------------------------


async def test_least_allocated_counts_pods_without_requests_at_the_non_zero_defaults():
    """Scoring counts 100m / 200Mi for a container that requests nothing (pkg/scheduler/util
    GetNonzeroRequests): ten best-effort pods make a node look busier than an empty one."""
    store = new_store()
    make_node(store, "a")
    make_node(store, "b")
    for i in range(10):
        make_pod(store, f"idle-{i}", cpu=None, memory=None, nodeName="a")
    make_pod(store, "new")
    assert await scheduler_for(store).schedule_pass() == 1
    assert placement(store)["new"] == "b"


async def test_balanced_allocation_breaks_a_least_allocated_tie():
    """Both nodes score 73 on LeastAllocated for a 100m / 128Mi pod (a: cpu half used, b: memory
    half used); BalancedAllocation gives a 74 (|0.525 - 0.008| / 2 off balance) and b 75."""
    store = new_store()
    make_node(store, "a")
    make_node(store, "b")
    make_pod(store, "cpu-heavy", cpu="2", memory="0", nodeName="a")
    make_pod(store, "memory-heavy", cpu="0", memory="8Gi", nodeName="b")
    make_pod(store, "new")
    assert await scheduler_for(store).schedule_pass() == 1
    assert placement(store)["new"] == "b"


# --- TaintToleration and NodeAffinity (tainttoleration/, nodeaffinity/) ------------------------------------


async def test_fewer_untolerated_prefer_no_schedule_taints_win():
    """TaintToleration Score counts the PreferNoSchedule taints the pod does not tolerate; normalized
    reversed and weighted 3, one taint fewer outweighs an emptier node."""
    prefer = lambda key: {"key": key, "effect": "PreferNoSchedule"}  # noqa: E731
    store = new_store()
    make_node(store, "a", cpu="64", taints=[prefer("x"), prefer("y")])
    make_node(store, "b", cpu="2", taints=[prefer("x")])
    make_pod(store, "new", tolerations=[])
    make_pod(store, "tolerant", tolerations=[{"operator": "Exists"}])
    assert await scheduler_for(store).schedule_pass() == 2
    assert placement(store) == {"new": "b", "tolerant": "a"}


async def test_preferred_node_affinity_weights_draw_the_pod():
    """NodeAffinity Score: the weights of the preferred terms a node matches, normalized and
    weighted 2: the preferred zone wins over a much emptier node."""
    store = new_store()
    make_node(store, "a", zone="a", cpu="64")
    make_node(store, "b", zone="b", cpu="2")
    preferred = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["b"]}]},
                }
            ]
        }
    }
    make_pod(store, "new", affinity=preferred)
    assert await scheduler_for(store).schedule_pass() == 1
    assert placement(store)["new"] == "b"


# --- InterPodAffinity (interpodaffinity/scoring.go) ----------------------------------------------------


def _preferred(kind: str, app: str, weight: int = 50) -> dict:
    return {
        kind: {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": weight,
                    "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": ZONE},
                }
            ]
        }
    }


async def test_preferred_pod_affinity_and_anti_affinity():
    """processExistingPod: + the weight in the zone of a pod the preferred affinity term matches,
    - the weight for an anti-affinity term."""
    store = new_store()
    make_node(store, "a1", zone="a", cpu="64")
    make_node(store, "b1", zone="b", cpu="2")
    make_node(store, "c1", zone="c", cpu="64")
    make_pod(store, "cache", labels={"app": "cache"}, nodeName="b1")
    make_pod(store, "noisy", labels={"app": "noisy"}, nodeName="a1")
    make_pod(store, "near-cache", affinity=_preferred("podAffinity", "cache"))
    make_pod(store, "quiet", affinity=_preferred("podAntiAffinity", "noisy"))
    assert await scheduler_for(store).schedule_pass() == 2
    where = placement(store)
    assert where["near-cache"] == "b1"
    assert where["quiet"] == "c1"  # a1 is as empty, but in noisy's zone


async def test_an_existing_pods_required_affinity_draws_its_target():
    """processExistingPod: an existing pod's required affinity term that matches the incoming pod adds
    hardPodAffinityWeight (1) in its zone: the target goes where it is wanted."""
    store = new_store()
    make_node(store, "a1", zone="a", cpu="2")
    make_node(store, "b1", zone="b", cpu="64")
    api = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}
            ]
        }
    }
    make_pod(store, "api", labels={"app": "api"}, nodeName="a1", affinity=api)
    make_pod(store, "db", labels={"app": "db"})
    assert await scheduler_for(store).schedule_pass() == 1
    assert placement(store)["db"] == "a1"


# --- PodTopologySpread (podtopologyspread/scoring.go) ------------------------------------------------------


async def _two_nodes_six_pods(owner: bool, service: bool = False) -> dict[str, int]:
    store = new_store()
    make_node(store, "big", cpu="4", memory="16Gi")
    make_node(store, "small", cpu="2", memory="8Gi")
    ref = make_replicaset(store, "web-1", "web") if owner else None
    if service:
        store.create(
            "services",
            {"metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": {"app": "web"}}},
        )
    for i in range(6):
        make_pod(store, f"web-{i}", cpu="100m", memory="256Mi", labels={"app": "web"}, owner=ref)
    assert await scheduler_for(store).schedule_pass() == 6
    counts = {"big": 0, "small": 0}
    for node in placement(store).values():
        counts[node] += 1
    return counts


async def test_system_default_spreading_applies_to_a_replicasets_pods():
    """systemDefaultConstraints (hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway) with
    DefaultSelector: a ReplicaSet's pods (and pods a Service selects) are spread by count, where
    LeastAllocated alone puts twice as many on the node twice as big; bare pods are not spread."""
    assert await _two_nodes_six_pods(owner=False) == {"big": 4, "small": 2}
    assert await _two_nodes_six_pods(owner=True) == {"big": 3, "small": 3}
    assert await _two_nodes_six_pods(owner=False, service=True) == {"big": 3, "small": 3}


async def test_a_schedule_anyway_constraint_prefers_the_emptier_zone():
    """The pod's own ScheduleAnyway constraint replaces the defaults: the less crowded zone scores
    higher even when its node is half full (LeastAllocated alone picks the empty big node)."""
    store = new_store()
    make_node(store, "a1", zone="a", cpu="64")
    make_node(store, "b1", zone="b", cpu="2")
    make_pod(store, "filler", cpu="1", nodeName="b1")
    for i in range(2):
        make_pod(store, f"old-{i}", labels={"app": "web"}, nodeName="a1")
    soft = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    make_pod(store, "new", labels={"app": "web"}, topologySpreadConstraints=soft)
    assert await scheduler_for(store).schedule_pass() == 1
    assert placement(store)["new"] == "b1"
