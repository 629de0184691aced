"""Issue 34: the activities' loops read from the worker's informer cache, not from the API server. A
drain, a volume wait and a replacement's wait run against the emulator with a ClusterCache beside
them, as in the worker; the emulator's request log counts what reached the server while they ran:
no LIST a poll, only the one read that confirms "nothing is left"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from temporalio.testing import ActivityEnvironment

from activities.kubernetes import KubernetesActivities
from api.activity_io import (
    BeginTerminationRequest,
    DrainRequest,
    LaunchedInstance,
    LaunchTemplate,
    RegistrationRequest,
    VolumeRequest,
)
from api.constants import REGISTERED_LABEL
from api.workflow_io import Offering
from cluster.informer import ClusterCache
from cluster.reads import ClusterReads

from .conftest import CLUSTER

pytestmark = pytest.mark.integration

POLL = 0.02  # seconds: many polls while the pods terminate (a grace of 100 s is 1 s here)


@pytest_asyncio.fixture
async def cached(world: Any) -> AsyncIterator[tuple[Any, KubernetesActivities, ClusterCache]]:
    world.nodepool()
    cache = ClusterCache(world.kube)
    acts = KubernetesActivities(
        world.kube,
        poll_interval=POLL,
        ownership=world.aws().ownership,
        cluster=CLUSTER,
        reads=ClusterReads(world.kube, cache),
    )
    yield world, acts, cache
    await cache.stop()


async def synced(cache: ClusterCache) -> None:
    cache.start()
    assert await cache.wait_synced(30)
    assert cache.current("VolumeAttachment") is not None or await _wait_current(cache, "VolumeAttachment")


async def _wait_current(cache: ClusterCache, kind: str) -> bool:
    for _ in range(500):
        if cache.current(kind) is not None:
            return True
        await asyncio.sleep(0.01)
    return False


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(POLL)
    raise AssertionError("never happened")


def since(world: Any, seq: int, verb: str, resource: str) -> int:
    return len(world.emu.requests.query(verb=verb, resource=resource, since_seq=seq))


def last_seq(world: Any) -> int:
    records = world.emu.requests.query(limit=1)
    return records[-1].seq if records else 0


async def test_a_drain_lists_the_nodes_pods_from_the_server_once_not_every_poll(cached):
    world, acts, cache = cached
    world.node("n1")
    for i in range(3):
        world.pod(f"web-{i}", "n1", spec={"terminationGracePeriodSeconds": 100})
    await synced(cache)
    env = ActivityEnvironment()
    polls: list[Any] = []
    env.on_heartbeat = lambda *details: polls.append(details)
    began = await env.run(acts.begin_termination, BeginTerminationRequest(node="n1", reason="Drifted"))
    mark = last_seq(world)

    drained = await env.run(acts.drain_node, DrainRequest(node="n1", uid=began.uid, reason="Drifted"))

    assert drained.evicted == 3 and not world.emu.store.list("pods").items
    assert len(polls) >= 5, "the pods should have taken several polls to terminate"
    assert since(world, mark, "create", "pods/eviction") == 3
    assert since(world, mark, "list", "pods") == 1  # "no pod left", from the server
    assert since(world, mark, "get", "nodes") == 0
    assert since(world, mark, "list", "poddisruptionbudgets") == 0


async def test_a_volume_wait_lists_attachments_from_the_server_only_once_they_look_gone(cached):
    world, acts, cache = cached
    world.node("n1")
    world.emu.store.create(
        "volumeattachments",
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {"name": "csi-1"},
            "spec": {
                "attacher": "ebs.csi.aws.com",
                "nodeName": "n1",
                "source": {"persistentVolumeName": "pv-1"},
            },
        },
    )
    await synced(cache)
    env = ActivityEnvironment()
    polls: list[Any] = []
    env.on_heartbeat = lambda *details: polls.append(details)
    mark = last_seq(world)
    waiting = asyncio.create_task(env.run(acts.await_volumes_detached, VolumeRequest(node="n1")))
    await until(lambda: len(polls) >= 5)  # the attachment held it for several polls
    world.emu.store.delete("volumeattachments", "csi-1")

    assert await asyncio.wait_for(waiting, 30)
    assert since(world, mark, "list", "volumeattachments") == 1
    assert since(world, mark, "get", "nodes") == 0


async def test_a_replacements_wait_finds_its_node_in_the_cache_and_writes_on_its_version(cached):
    world, acts, cache = cached
    await synced(cache)
    instance_id = world.instance()
    provider_id = f"aws:///us-west-2a/{instance_id}"
    request = RegistrationRequest(
        instance=LaunchedInstance(
            instance_id=instance_id,
            provider_id=provider_id,
            private_dns_name="ip-10-0-0-9",
            offering=Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="on-demand"),
        ),
        template=LaunchTemplate(
            nodepool="default", nodeclass="default", subnets={}, security_group_ids=[], amis=[]
        ),
        poll_interval_seconds=POLL,
    )
    env = ActivityEnvironment()
    polls: list[Any] = []
    env.on_heartbeat = lambda *details: polls.append(details)
    mark = last_seq(world)
    waiting = asyncio.create_task(env.run(acts.await_node_registered, request))
    await until(lambda: len(polls) >= 5)  # polls without a Node
    node = world.builder.node("ip-10-0-0-9", zone="us-west-2a", initialized=False)
    node["spec"]["providerID"] = provider_id
    node["metadata"]["labels"].pop(REGISTERED_LABEL, None)  # as the kubelet registers it
    world.emu.store.create("nodes", node, keep_status=True)

    registered = await asyncio.wait_for(waiting, 30)
    assert registered.node == "ip-10-0-0-9"
    assert world.get_node("ip-10-0-0-9")["metadata"]["labels"][REGISTERED_LABEL] == "true"
    assert since(world, mark, "list", "nodes") == 0 and since(world, mark, "get", "nodes") <= 1
    assert since(world, mark, "update", "nodes") >= 1


async def test_the_cache_lists_in_pages_and_a_relist_after_410_resumes_from_its_version(world):
    from urllib.parse import parse_qs

    from sim.apiserver.faults import FaultRule

    world.nodepool()
    world.node("n1")
    for i in range(7):
        world.pod(f"web-{i}", "n1")
    cache = ClusterCache(world.kube, watch_timeout=1)  # the server ends each watch after a second
    pods = cache.informer("Pod")
    assert pods is not None
    pods.page_size = 3
    try:
        cache.start()
        assert await cache.wait_synced(30)
        first = [parse_qs(r.query) for r in world.emu.requests.query(verb="list", resource="pods")]
        assert len(first) == 3 and all(q["limit"] == ["3"] for q in first)
        assert "continue" not in first[0] and all("continue" in q for q in first[1:])
        assert len(pods.items) == 7

        # The next watch is refused as too old: the relist asks for no older than what it saw.
        await until(lambda: pods.watching)
        mark = last_seq(world)
        world.emu.faults.add(FaultRule(verb="watch", resource="pods", status=410, times=1))
        world.pod("web-late", "n1")
        await until(lambda: pods.stats.relists_resumed >= 1 and "default/web-late" in pods.items)
        relist = [
            parse_qs(r.query) for r in world.emu.requests.query(verb="list", resource="pods", since_seq=mark)
        ]
        assert relist[0]["resourceVersionMatch"] == ["NotOlderThan"] and relist[0]["resourceVersion"] != ["0"]
    finally:
        await cache.stop()


async def test_a_termination_gate_held_by_a_budget_polls_the_cache_and_reads_only_the_budget(cached):
    from api.activity_io import TerminationGateRequest

    from .test_budget_claims import install_crds, ndb

    world, acts, cache = cached
    install_crds(world)
    world.node("n1", labels={"example.com/role": "ingress"})
    ndb(world, "ingress", 0, {"example.com/role": "ingress"})
    await synced(cache)
    await until(lambda: len(cache.objects_of("NodeDisruptionBudget")) == 1)
    request = TerminationGateRequest(
        node="n1",
        uid=world.get_node("n1")["metadata"]["uid"],
        reason="Manual",
        holder="termination/prod/n1/u@r",
    )
    mark = last_seq(world)
    for _ in range(5):
        gate = await ActivityEnvironment().run(acts.termination_gate, request)
        assert not gate.go and gate.waiting_for == "NodeDisruptionBudget ingress"

    assert since(world, mark, "get", "nodedisruptionbudgets") == 5  # the claim, on the budget's version
    for verb, resource in [
        ("list", "nodes"),
        ("get", "nodes"),
        ("list", "nodedisruptionbudgets"),
        ("list", "maintenancewindows"),
    ]:
        assert since(world, mark, verb, resource) == 0, (verb, resource)


async def test_the_claim_sweep_reads_nodes_and_budgets_from_the_cache(cached):
    from activities import budget_claims

    from .test_budget_claims import claims, install_crds, ndb

    world, _, cache = cached
    install_crds(world)
    for name in ("in-0", "in-1"):
        world.node(name, labels={"example.com/role": "ingress"})
    ndb(world, "ingress", 2, {"example.com/role": "ingress"})
    await synced(cache)
    reads = ClusterReads(world.kube, cache)
    nodes = [world.get_node("in-0"), world.get_node("in-1")]
    assert (
        await budget_claims.claim(world.kube, nodes, "disruption/x/crashed@r", "Drifted", reads=reads) is None
    )
    world.emu.store.delete("nodes", "in-0")
    node = world.get_node("in-0")
    if node is not None:  # the finalizer holds it: release it as a termination would
        node["metadata"]["finalizers"] = []
        world.emu.store.update("nodes", node)
    await until(lambda: cache.current("Node") is not None and "/in-0" not in cache.current("Node").items)
    await until(
        lambda: any(c.get("status", {}).get("claims") for c in cache.objects_of("NodeDisruptionBudget"))
    )
    mark = last_seq(world)

    dropped = await budget_claims.sweep(world.kube, {"disruption/x/crashed"}, 3600, reads=reads)

    assert dropped == 1 and [c["node"] for c in claims(world, "ingress")] == ["in-1"]
    assert (
        since(world, mark, "list", "nodes") == 0 and since(world, mark, "list", "nodedisruptionbudgets") == 0
    )
