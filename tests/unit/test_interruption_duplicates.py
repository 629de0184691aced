"""The interruption poller drops repeated warnings before any Temporal call (issue 21).

A unit test: Temporal and the API server are faked at their boundary (the client's start and signal
calls, the API's requests), to count the calls the poller makes for a burst of repeats.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from cluster.interruption import InterruptionPoller

INSTANCES = [f"i-{n:017x}" for n in range(1, 6)]


def node(instance: str) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {
            "name": f"node-{instance}",
            "uid": f"uid-{instance}",
            "labels": {
                "karpenter.sh/nodepool": "default",
                "node.kubernetes.io/instance-type": "m5.large",
                "topology.kubernetes.io/zone": "us-west-2a",
                "karpenter.sh/capacity-type": "spot",
            },
        },
        "spec": {"providerID": f"aws:///us-west-2a/{instance}"},
    }


class FakeKube:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def list_nodes(self) -> dict[str, Any]:
        self.calls["list_nodes"] += 1
        return {"items": [node(i) for i in INSTANCES]}

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls[f"{method} {path.split('/')[-1]}"] += 1
        return {}


class FakeHandle:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    async def signal(self, *_: Any) -> None:
        self.client.calls["signal"] += 1


class FakeClient:
    def __init__(self, fail: bool = False) -> None:
        self.calls: Counter[str] = Counter()
        self.fail = fail

    async def start_workflow(self, workflow: str, _input: Any, *, id: str, **_: Any) -> Any:
        self.calls["start_workflow"] += 1
        await asyncio.sleep(0.05)  # a round trip: the repeats arrive meanwhile
        if self.fail:
            raise RuntimeError("Temporal is unavailable")
        return None

    def get_workflow_handle(self, _id: str) -> FakeHandle:
        return FakeHandle(self)


def message(instance: str, n: int) -> dict[str, Any]:
    body = {
        "version": "0",
        "id": f"warning-{instance}-{n}",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-west-2",
        "resources": [],
        "detail": {"instance-id": instance, "instance-action": "terminate"},
    }
    return {"MessageId": f"m-{instance}-{n}", "Body": json.dumps(body)}


def poller(client: FakeClient) -> InterruptionPoller:
    return InterruptionPoller(None, "queue", FakeKube(), client, "tq", "cluster")  # type: ignore[arg-type]


async def test_five_warnings_per_instance_at_once_start_one_workflow_each_and_signal_once():
    client = FakeClient()
    p = poller(client)
    burst = [message(i, n) for n in range(5) for i in INSTANCES]
    await asyncio.gather(*(p.handle(m) for m in burst))  # concurrently, as the poller handles them
    await asyncio.gather(*(p.handle(message(i, 9)) for i in INSTANCES))  # and once more, later
    assert client.calls["start_workflow"] == len(INSTANCES)
    assert client.calls["signal"] == len(INSTANCES)  # the offering is reported unavailable once
    assert p.counters["duplicate"] == 5 * len(INSTANCES)
    assert len(p.latencies) == len(INSTANCES)


async def test_when_the_first_message_fails_its_repeats_fail_too_and_are_left_for_redelivery():
    client = FakeClient(fail=True)
    p = poller(client)
    outcomes = await asyncio.gather(
        *(p.handle(message(INSTANCES[0], n)) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, Exception) for o in outcomes)
    assert client.calls["start_workflow"] == 1
    client.fail = False  # redelivered: handled now
    await p.handle(message(INSTANCES[0], 3))
    assert client.calls["start_workflow"] == 2


@pytest.fixture(autouse=True)
def _fast_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Karpenter's Event for the message is best effort: not what these tests count."""

    async def nothing(*_: Any, **__: Any) -> None:
        return None

    monkeypatch.setattr(InterruptionPoller, "_record_event", nothing)


async def test_the_latencies_it_keeps_are_bounded_and_the_count_is_not(monkeypatch: pytest.MonkeyPatch):
    """Issue 30 item 9: the poller kept every latency it ever measured, for the life of the worker."""
    import cluster.interruption as interruption

    monkeypatch.setattr(interruption, "LATENCY_SAMPLES", 3)
    p = poller(FakeClient())
    for i in INSTANCES:
        await p.handle(message(i, 0))
    assert p.counters["acted"] == len(INSTANCES) == 5
    assert len(p.latencies) == 3  # the latest ones, sortable as bench/bench_interruption.py reads them


async def test_an_instance_a_current_cache_does_not_know_costs_no_listing_of_the_nodes():
    """Issue 34: a warning for an instance of another cluster listed every node, twice."""
    from cluster.informer import ClusterCache, Resource

    kube = FakeKube()
    cache = ClusterCache(kube, resources=(Resource("Node", "v1", "nodes"),))  # type: ignore[arg-type]
    (nodes,) = cache.informers
    nodes._listed({f"/{n['metadata']['name']}": n for n in (node(i) for i in INSTANCES)}, missing=False)
    nodes.watching = True
    p = InterruptionPoller(None, "queue", kube, FakeClient(), "tq", "cluster", cache=cache)  # type: ignore[arg-type]
    assert await p._node_of("i-0ther0cluster000") is None
    assert (await p._node_of(INSTANCES[0]) or {}).get("metadata", {}).get("name") == f"node-{INSTANCES[0]}"
    assert kube.calls["list_nodes"] == 0
    nodes.watching, nodes.current_at = False, float("-inf")  # a cache whose watch failed long ago
    assert await p._node_of("i-0ther0cluster000") is None and kube.calls["list_nodes"] >= 1
