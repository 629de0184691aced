"""The control plane's answer to sick and gone nodes, on the in-process store: the node lifecycle
controller's NoExecute taints, the taint manager's deletions and the pod GC's quarantine (each rule
cites the kubernetes/kubernetes file it follows)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.constants import DEFAULT_POD_TOLERATIONS
from sim.apiserver import NotFound, Store
from sim.controllers.informer import Informer
from sim.controllers.noexecute_taints import NoExecuteTaints, swapped, wanted_taint
from sim.controllers.podgc import PodGC
from sim.controllers.taint_eviction import TaintEviction, matching_tolerations, min_toleration_seconds
from sim.timescale import TimeScale

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"


def node(name: str, ready: str | None = "True", taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": ready}] if ready else []
    return {
        "metadata": {"name": name},
        "spec": {"taints": taints or []},
        "status": {"conditions": conditions},
    }


def pod(name: str, node_name: str, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node_name, "containers": [{"name": "c", "image": "x"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def running(store: Store, name: str) -> dict[str, Any]:
    def run(p: dict[str, Any]) -> None:
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}

    return store.mutate("pods", name, run, "default", subresource="status")


def noexecute(obj: dict[str, Any]) -> list[str]:
    return sorted(t["key"] for t in obj["spec"].get("taints") or () if t["effect"] == "NoExecute")


@pytest.fixture
def store() -> Store:
    return Store(TimeScale(0))


# --- the node lifecycle controller's NoExecute taints -------------------------------------------------


def test_the_ready_condition_picks_one_noexecute_taint():
    """doNoExecuteTaintingPass (pkg/controller/nodelifecycle/node_lifecycle_controller.go): False is
    not-ready, Unknown unreachable, the two exclusive; markNodeAsReachable removes both."""
    assert wanted_taint(node("n", "False")) == NOT_READY
    assert wanted_taint(node("n", "Unknown")) == UNREACHABLE
    assert wanted_taint(node("n", "True")) is None
    assert wanted_taint(node("n", None)) is None
    mine = {"key": "dedicated", "effect": "NoExecute"}
    schedule_half = {"key": UNREACHABLE, "effect": "NoSchedule"}
    taints = [mine, schedule_half, {"key": NOT_READY, "effect": "NoExecute", "timeAdded": "t0"}]
    out = swapped(taints, UNREACHABLE, "t1")
    assert out == [mine, schedule_half, {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": "t1"}]
    assert swapped(out, UNREACHABLE, "t2") == out  # already right: its timeAdded stays
    assert swapped(out, None, "t3") == [mine, schedule_half]


async def test_the_controller_taints_a_node_as_its_condition_changes(store):
    informer = Informer(store, ["nodes"])
    taints = NoExecuteTaints(store, informer)
    informer.start()
    store.create("nodes", node("n1", "False"), keep_status=True)
    informer.sync()
    for name in sorted(taints.pending):
        taints.reconcile(name)
    assert noexecute(store.get("nodes", "n1")) == [NOT_READY]

    def unknown(n: dict[str, Any]) -> None:
        n["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]

    store.mutate("nodes", "n1", unknown, subresource="status")
    informer.sync()
    assert taints.reconcile("n1") and noexecute(store.get("nodes", "n1")) == [UNREACHABLE]

    def ready(n: dict[str, Any]) -> None:
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]

    store.mutate("nodes", "n1", ready, subresource="status")
    assert taints.reconcile("n1") and noexecute(store.get("nodes", "n1")) == []
    assert not taints.reconcile("n1")  # nothing to do, nothing written


# --- the taint manager ----------------------------------------------------------------------------------


def test_matching_tolerations_and_the_shortest_toleration_time():
    """GetMatchingTolerations and getMinTolerationTime (pkg/controller/tainteviction/taint_eviction.go)."""
    unreachable = {"key": UNREACHABLE, "effect": "NoExecute"}
    other = {"key": "dedicated", "effect": "NoExecute", "value": "db"}
    defaults = [dict(t) for t in DEFAULT_POD_TOLERATIONS]
    ok, used = matching_tolerations([unreachable], defaults)
    assert ok and min_toleration_seconds(used) == 300
    assert matching_tolerations([unreachable, other], defaults) == (False, [])
    forever = [{"key": "dedicated", "operator": "Exists"}, {"operator": "Exists", "effect": "NoExecute"}]
    ok, used = matching_tolerations([unreachable, other], forever)
    assert ok and min_toleration_seconds(used) is None
    assert min_toleration_seconds([{"tolerationSeconds": 30}, {"tolerationSeconds": 5}]) == 5
    assert min_toleration_seconds([{"tolerationSeconds": 0}, {}]) == 0
    assert min_toleration_seconds([{"tolerationSeconds": -1}]) == 0


async def test_the_taint_manager_deletes_what_does_not_tolerate_and_waits_out_the_rest():
    store = Store(TimeScale(1.0))  # a deleted pod stays Terminating for its 30 s grace
    informer = Informer(store, ["nodes", "pods"])
    manager = TaintEviction(store, informer, TimeScale(0.001))  # 300 s is 0.3 s
    informer.start()
    unreachable = node("n1", "Unknown", [{"key": UNREACHABLE, "effect": "NoExecute"}])
    store.create("nodes", unreachable, keep_status=True)
    short = [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 20}]
    daemon = [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]
    for name, tolerations in (("short", short), ("default", None), ("daemon", daemon)):
        store.create("pods", pod(name, "n1", tolerations))
        running(store, name)

    async def pump() -> None:  # what SimControllers' informer task does
        while True:
            await informer.wait()
            informer.sync()

    tasks = [asyncio.create_task(manager.run()), asyncio.create_task(pump())]
    try:
        for _ in range(100):
            await asyncio.sleep(0.01)
            if manager.deleted:
                break
        # The 20 s toleration ran out first; the 300 s default one is still scheduled.
        gone = store.get("pods", "short", "default")
        assert gone["metadata"].get("deletionTimestamp")
        condition = next(c for c in gone["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert (condition["status"], condition["reason"]) == ("True", "DeletionByTaintManager")
        assert set(manager.scheduled) == {("default", "default")}
        scheduled = manager.scheduled[("default", "default")]
        assert scheduled.fire_at - scheduled.created == pytest.approx(0.3)
        # The node recovers: the scheduled deletion is cancelled; the daemon pod was never at risk.
        store.patch("nodes", "n1", {"spec": {"taints": []}})
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not manager.scheduled:
                break
        assert not manager.scheduled and manager.deleted == 1
        await asyncio.sleep(0.35)
        for name in ("default", "daemon"):
            assert not store.get("pods", name, "default")["metadata"].get("deletionTimestamp")
    finally:
        for task in tasks:
            task.cancel()
        manager.stop()


# --- pod GC -----------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_pod_gc_waits_out_the_quarantine_then_marks_failed_and_force_deletes(store):
    """gcOrphaned (pkg/controller/podgc/gc_controller.go): a pod's node missing from the cache is
    quarantined 40 s, checked with a GET, and then its pods are marked Failed (DisruptionTarget,
    DeletionByPodGC) and deleted with grace period 0."""
    clock = Clock()
    informer = Informer(store, ["nodes", "pods"])
    gc = PodGC(store, informer, TimeScale(1.0), clock=clock)
    informer.start()
    store.create("nodes", node("n1"), keep_status=True)
    store.create("nodes", node("n2"), keep_status=True)
    store.create("pods", pod("orphan", "n1"))
    store.create("pods", pod("kept", "n2"))
    running(store, "orphan")
    store.delete("nodes", "n1")
    seen_failed: list[dict[str, Any]] = []
    store.add_listener(
        lambda e: (
            seen_failed.append(e.object)
            if e.type == "MODIFIED" and (e.object.get("status") or {}).get("phase") == "Failed"
            else None
        )
    )

    assert gc.gc() == 0 and "n1" in gc.quarantined  # first seen missing: quarantined
    clock.t = 39.0
    assert gc.gc() == 0
    assert store.get("pods", "orphan", "default")  # still there inside the quarantine
    clock.t = 40.0
    assert gc.gc() == 1
    with pytest.raises(NotFound):
        store.get("pods", "orphan", "default")
    assert store.get("pods", "kept", "default")
    (failed,) = seen_failed
    condition = next(c for c in failed["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (condition["reason"], condition["message"]) == ("DeletionByPodGC", "PodGC: node no longer exists")
    assert not gc.quarantined


async def test_a_node_back_within_the_quarantine_keeps_its_pods(store):
    clock = Clock()
    informer = Informer(store, ["nodes", "pods"])
    gc = PodGC(store, informer, TimeScale(1.0), clock=clock)
    informer.start()
    store.create("pods", pod("early", "n3"))  # bound to a node that is not there yet
    assert gc.gc() == 0 and "n3" in gc.quarantined
    store.create("nodes", node("n3"), keep_status=True)
    clock.t = 60.0
    assert gc.gc() == 0 and not gc.quarantined
    assert store.get("pods", "early", "default")
