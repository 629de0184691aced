"""The scheduler against the in-process store (no servers): placement rules and bookkeeping."""

import random

from planner.resources import ZERO
from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.node_objects import ready_condition
from sim.controllers.predicates import node_accepts, node_allocatable, pod_requests
from sim.controllers.scheduler import RESOURCES, Scheduler
from sim.timescale import TimeScale


def make_node(store, name, cpu="4", memory="16Gi", pods="110", labels=None, taints=None, ready=True):
    store.create(
        "nodes",
        {
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or []},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
                "conditions": [
                    ready_condition("True" if ready else "False", "r", "m", "2026-01-01T00:00:00Z")
                ],
            },
        },
        keep_status=True,
    )


def make_pod(store, name, cpu="100m", memory="128Mi", **spec):
    store.create(
        "pods",
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
                ],
                **spec,
            },
        },
    )


def scheduler_for(store):
    informer = Informer(store, RESOURCES)
    scheduler = Scheduler(store, informer)
    informer.start()
    return scheduler


def placement(store):
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in store.list("pods").items}


async def test_least_allocated_spreads_and_is_deterministic():
    results = []
    for _ in range(2):
        store = Store(TimeScale(0))
        for name in ("a", "b", "c"):
            make_node(store, name)
        for i in range(6):
            make_pod(store, f"p{i}", cpu="500m")
        scheduler = scheduler_for(store)
        assert await scheduler.schedule_pass() == 6
        results.append(placement(store))
    assert results[0] == results[1]
    per_node = {}
    for node in results[0].values():
        per_node[node] = per_node.get(node, 0) + 1
    assert per_node == {"a": 2, "b": 2, "c": 2}


async def test_bound_pods_count_and_pods_that_fit_nowhere_are_marked():
    store = Store(TimeScale(0))
    make_node(store, "small", cpu="1", memory="2Gi", pods="3")
    make_pod(store, "already", cpu="600m", nodeName="small")
    make_pod(store, "fits", cpu="300m")
    make_pod(store, "too-big", cpu="300m")  # 600m + 300m + 300m > 1 cpu
    scheduler = scheduler_for(store)
    assert await scheduler.schedule_pass() == 1
    pods = {p["metadata"]["name"]: p for p in store.list("pods").items}
    assert pods["fits"]["spec"]["nodeName"] == "small"
    waiting = pods["too-big"]
    assert "nodeName" not in waiting["spec"]
    [cond] = [c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"].startswith("0/1 nodes are available")
    # Room frees up when a bound pod goes: the waiting pod is placed by the next pass.
    store.delete("pods", "already", "default", grace_period_seconds=0)
    scheduler.informer.sync()
    assert scheduler.wake.is_set()
    assert await scheduler.schedule_pass() == 1
    assert store.get("pods", "too-big", "default")["spec"]["nodeName"] == "small"


async def test_many_pods_never_overcommit_and_leftovers_truly_fit_nowhere():
    rng = random.Random(5)
    store = Store(TimeScale(0))
    for i in range(25):
        labels = {"zone": f"z{i % 3}"}
        taints = [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}] if i % 7 == 0 else []
        make_node(
            store,
            f"n{i:02d}",
            cpu=str(rng.choice([2, 4, 8])),
            memory=f"{rng.choice([4, 8, 16])}Gi",
            pods=str(rng.choice([8, 29, 58])),
            labels=labels,
            taints=taints,
            ready=i % 11 != 0,
        )
    for i in range(600):
        extra = {}
        if i % 5 == 0:
            extra["nodeSelector"] = {"zone": f"z{i % 3}"}
        if i % 9 == 0:
            extra["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
        make_pod(
            store,
            f"p{i:04d}",
            cpu=f"{rng.choice([100, 250, 500, 1000])}m",
            memory=f"{rng.choice([128, 512, 1024])}Mi",
            **extra,
        )
    scheduler = scheduler_for(store)
    bound = await scheduler.schedule_pass()
    assert 0 < bound < 600

    nodes = {n["metadata"]["name"]: n for n in store.list("nodes").items}
    used = {name: ZERO for name in nodes}
    pods = store.list("pods").items
    for pod in pods:
        if pod["spec"].get("nodeName"):
            node = nodes[pod["spec"]["nodeName"]]
            assert node_accepts(pod["spec"], node), pod["metadata"]["name"]
            used[node["metadata"]["name"]] = used[node["metadata"]["name"]] + pod_requests(pod["spec"])
    for name, node in nodes.items():
        assert used[name].fits(node_allocatable(node)), name
    for pod in pods:
        if not pod["spec"].get("nodeName"):
            request = pod_requests(pod["spec"])
            assert not any(
                node_accepts(pod["spec"], node) and (used[name] + request).fits(node_allocatable(node))
                for name, node in nodes.items()
            ), pod["metadata"]["name"]
    # The scheduler's incremental bookkeeping matches a recount from scratch.
    assert all(scheduler.used.get(name, ZERO) == used[name] for name in nodes)


async def test_prefer_no_schedule_nodes_take_pods_only_when_nothing_else_fits():
    """kube-scheduler's TaintToleration score: an emptier node tainted PreferNoSchedule (the one Optimal
    consolidation removes next) comes after every untainted node that fits; it still takes what no
    other node fits, and pods tolerating the taint see no difference."""
    store = Store(TimeScale(0))
    leaving = [{"key": "karpflow.io/leaving", "effect": "PreferNoSchedule"}]
    make_node(store, "busy", cpu="2")
    make_node(store, "empty-leaving", cpu="8", taints=leaving)
    make_pod(store, "filler", cpu="1", nodeName="busy")
    for i in range(3):
        make_pod(store, f"p{i}", cpu="400m")  # two fit on busy, the third does not
    make_pod(
        store, "tolerant", cpu="100m", tolerations=[{"key": "karpflow.io/leaving", "operator": "Exists"}]
    )
    scheduler = scheduler_for(store)
    assert await scheduler.schedule_pass() == 4
    where = placement(store)
    assert sorted(n for p, n in where.items() if p.startswith("p")) == ["busy", "busy", "empty-leaving"]
    assert where["tolerant"] == "empty-leaving"  # LeastAllocated alone: the emptier node
