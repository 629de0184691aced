"""The simulated kubelet's crash loop (sim/controllers/kubelet.py) writes what the real kubelet does,
so that the rollout gate sees a bad AMI on the local stack: restartCount 1 at once (the first exit is
restarted without back-off), then one more per back-off of 10 s doubling; lastState.terminated;
Ready False with its lastTransitionTime left where it first turned False."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from activities.rollout_health import RolloutHealthActivities
from api.rollout_health_io import WaveHealthRequest
from api.rollout_policy import RolloutPolicy
from kube.times import rfc3339
from sim.controllers.kubelet import Kubelets
from sim.timescale import TimeScale

LONG_AGO = "2026-01-01T00:00:00Z"
NODE: dict[str, Any] = {
    "metadata": {
        "name": "n1",
        "uid": "uid-n1",
        "creationTimestamp": rfc3339(datetime.now(UTC) - timedelta(minutes=3)),
        "labels": {"karpenter.sh/nodepool": "general"},
    },
    "spec": {},
    "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": LONG_AGO}]},
}


class Store:
    """The one pod, written through `mutate` as the emulator's store does."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod

    def mutate(self, resource: str, name: str, fn: Callable[..., Any], ns: str, **_: Any) -> dict[str, Any]:
        current = copy.deepcopy(self.pod)
        result = fn(current)
        self.pod = current if result is None else result
        return self.pod

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return [self.pod]


class Informer:
    def add_handler(self, handler: Any) -> None:
        pass

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        return NODE if plural == "nodes" else None


class RecordedTimers:
    """Timers that run when the test says, remembering each delay."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, Callable[[], None]]] = []

    def after(self, delay: float, fn: Callable[[], None], what: str = "") -> None:
        self.pending.append((delay, fn))

    def fire(self) -> float:
        delay, fn = self.pending.pop(0)
        fn()
        return delay


def crash_looping_kubelet() -> tuple[Kubelets, Store, RecordedTimers]:
    pod = {
        "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web"},
        "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "shop/web:2"}]},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": LONG_AGO}],
        },
    }
    store = Store(pod)
    kubelets = Kubelets(store, Informer(), TimeScale(1.0), crash_looping=lambda node: True)  # type: ignore[arg-type]
    timers = RecordedTimers()
    kubelets.timers = timers  # type: ignore[assignment]
    return kubelets, store, timers


def container(store: Store) -> dict[str, Any]:
    (status,) = store.pod["status"]["containerStatuses"]
    return dict(status)


def ready(store: Store) -> dict[str, Any]:
    return next(c for c in store.pod["status"]["conditions"] if c["type"] == "Ready")


def test_the_first_exit_is_restarted_at_once_then_each_after_a_doubling_back_off():
    kubelets, store, timers = crash_looping_kubelet()
    kubelets._start("shop", "web", "uid-web", "n1")
    first = container(store)
    assert store.pod["status"]["phase"] == "Running"
    assert (first["restartCount"], first["ready"], first["started"]) == (1, False, False)
    assert first["state"]["waiting"] == {
        "reason": "CrashLoopBackOff",
        "message": "back-off 10s restarting failed container=app pod=web_shop(uid-web)",
    }
    assert first["lastState"]["terminated"]["exitCode"] == 1
    assert (ready(store)["status"], ready(store)["reason"]) == ("False", "ContainersNotReady")
    ready(store)["lastTransitionTime"] = LONG_AGO  # as if it had turned False long ago

    waited = [timers.fire() for _ in range(3)]
    assert waited == [10.0, 20.0, 40.0]
    assert container(store)["restartCount"] == 4
    assert "back-off 80s" in container(store)["state"]["waiting"]["message"]
    # Ready stayed False all along: its transition time is still the first one; PodScheduled's too.
    assert ready(store)["lastTransitionTime"] == LONG_AGO
    scheduled = next(c for c in store.pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["lastTransitionTime"] == LONG_AGO


def test_the_back_off_stops_doubling_at_five_minutes():
    kubelets, _, timers = crash_looping_kubelet()
    kubelets._start("shop", "web", "uid-web", "n1")
    waited = [timers.fire() for _ in range(8)]
    assert waited == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0]


async def test_the_rollout_gate_sees_the_crash_loop_from_the_pod_alone():
    kubelets, store, timers = crash_looping_kubelet()
    kubelets._start("shop", "web", "uid-web", "n1")
    for _ in range(3):
        timers.fire()

    # The node was created 3 minutes ago *now*, not when the module was imported: under xdist a test
    # may run many minutes after its collection, and the wave began before its node.
    node = {
        **NODE,
        "metadata": {
            **NODE["metadata"],
            "creationTimestamp": rfc3339(datetime.now(UTC) - timedelta(minutes=3)),
        },
    }

    class Reads:
        async def nodes_with_label(self, key: str, value: str) -> list[dict[str, Any]]:
            return [node]

        async def pods_on_node(self, name: str) -> list[dict[str, Any]]:
            return [store.pod]

        async def unbound_pods(self) -> list[dict[str, Any]]:
            return []

    since = datetime.now(UTC) - timedelta(minutes=10)
    policy = RolloutPolicy.model_validate({"maxRestarts": 3})
    gate = RolloutHealthActivities(None, Reads())  # type: ignore[arg-type]
    health = await gate.check_wave_health(
        WaveHealthRequest(rollout_id="r", nodepool="general", since=since, policy=policy)
    )
    assert health.verdict == "Failed"
    assert health.reasons == [
        "pod shop/web on node n1: container app restarted 4 times (maxRestarts 3),"
        " last exit: Error (exit code 1)"
    ]
