"""`kubernetes.aio` against the emulator served inside the test's own event loop (`start()`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes.aio import client, watch

from sim.apiserver import EmulatorServer
from sim.timescale import TimeScale

from . import builders as b
from .helpers import fresh, owned_pods, status_of

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(loop_scope="session")
async def aio_emu() -> AsyncIterator[EmulatorServer]:
    srv = await EmulatorServer(timescale=TimeScale(0), bookmark_interval=0.2).start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def core(aio_emu: EmulatorServer) -> AsyncIterator[client.CoreV1Api]:
    api = aio_emu.aio_api_client()
    try:
        yield client.CoreV1Api(api)
    finally:
        await api.close()


@pytest.fixture(autouse=True)
def fresh_store(aio_emu: EmulatorServer) -> None:
    """The emulator lives for the session: every test starts from an empty store at time scale 0."""
    fresh(aio_emu, 0)


async def test_crud_conflict_and_errors(aio_emu: EmulatorServer, core: client.CoreV1Api) -> None:
    node = await core.create_node(b.node("n1"))
    node.metadata.labels["a"] = "1"
    await core.replace_node("n1", node)
    with pytest.raises(client.ApiException) as err:
        await core.replace_node("n1", node)
    assert err.value.status == 409
    with pytest.raises(client.ApiException) as err:
        await core.read_namespaced_pod("missing", "default")
    assert err.value.status == 404 and json.loads(err.value.body)["reason"] == "NotFound"
    patched = await core.patch_node("n1", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
    assert [t.key for t in patched.spec.taints] == ["k"]


async def test_watch_sees_writes_made_in_the_same_loop(
    aio_emu: EmulatorServer, core: client.CoreV1Api
) -> None:
    start = (await core.list_namespaced_pod("default")).metadata.resource_version
    seen: list[tuple[str, str]] = []

    async def consume() -> None:
        async with watch.Watch().stream(
            core.list_namespaced_pod, "default", resource_version=start, timeout_seconds=2
        ) as stream:
            async for event in stream:
                seen.append((event["type"], event["object"].metadata.name))
                if len(seen) == 4:
                    return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    await core.create_namespaced_pod("default", b.pod("w1", "n1"))
    await core.patch_namespaced_pod_status("w1", "default", {"status": b.RUNNING_READY})
    await core.delete_namespaced_pod("w1", "default")  # TimeScale(0): the grace period ends at once
    await asyncio.wait_for(task, 5)
    # created, status patched, marked for deletion (deletionTimestamp), gone
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


async def test_watch_410_and_eviction(aio_emu: EmulatorServer, core: client.CoreV1Api) -> None:
    aio_emu.store.watch_window = 2
    try:
        for i in range(5):
            await core.create_node(b.node(f"gone-{i}"))
        with pytest.raises(client.ApiException) as err:
            async with watch.Watch().stream(
                core.list_node, resource_version="1", timeout_seconds=1
            ) as stream:
                async for _ in stream:
                    pass
        assert err.value.status == 410
    finally:
        aio_emu.store.watch_window = 20_000
    rs = aio_emu.store.create("replicasets", b.replicaset("api", replicas=1))
    aio_emu.store.create(
        "pods", {**b.pod("api-0", "n1", app="api", owner=rs), "status": b.RUNNING_READY}, keep_status=True
    )
    await client.PolicyV1Api(core.api_client).create_namespaced_pod_disruption_budget(
        "default", b.pdb("api", app="api", minAvailable=1)
    )
    with pytest.raises(client.ApiException) as err:
        await core.create_namespaced_pod_eviction("api-0", "default", b.eviction("api-0"))
    assert err.value.status == 429
    await core.patch_namespaced_pod_status("api-0", "default", {"status": {"phase": "Succeeded"}})
    await core.create_namespaced_pod_eviction("api-0", "default", b.eviction("api-0"))  # terminal: no budget
    assert (await core.list_namespaced_pod("default", label_selector="app=api")).items == []


# --- evictions, deletion, selectors and patching (the sync suite's semantics, through aio) ------------


async def test_eviction_under_two_pdbs_is_a_500(aio_emu: EmulatorServer, core: client.CoreV1Api) -> None:
    owned_pods(aio_emu, "web", 2)
    policy = client.PolicyV1Api(core.api_client)
    await policy.create_namespaced_pod_disruption_budget("default", b.pdb("one", maxUnavailable=1))
    await policy.create_namespaced_pod_disruption_budget("default", b.pdb("two", maxUnavailable=1))
    with pytest.raises(client.ApiException) as err:
        await core.create_namespaced_pod_eviction("web-0", "default", b.eviction("web-0"))
    assert err.value.status == 500
    assert "more than one PodDisruptionBudget" in status_of(err.value)["message"]
    assert (await core.read_namespaced_pod("web-0", "default")).metadata.deletion_timestamp is None


async def test_eviction_of_a_running_pod_without_pdb_succeeds(
    aio_emu: EmulatorServer, core: client.CoreV1Api
) -> None:
    owned_pods(aio_emu, "web", 1)  # Running and Ready, no budget selects it
    await core.create_namespaced_pod_eviction("web-0", "default", b.eviction("web-0"))
    # 201 Created with a Success Status, as kube-apiserver answers an admitted eviction.
    assert [r.status for r in aio_emu.requests.query(resource="pods/eviction")] == [201]
    assert (await core.list_namespaced_pod("default")).items == []  # time scale 0: gone at once


async def test_finalizers_keep_a_deleted_object(core: client.CoreV1Api) -> None:
    await core.create_node({**b.node("n1"), "metadata": {"name": "n1", "finalizers": ["example.com/hold"]}})
    await core.delete_node("n1")
    held = await core.read_node("n1")
    assert held.metadata.deletion_timestamp is not None and held.metadata.finalizers == ["example.com/hold"]
    await core.patch_node("n1", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(client.ApiException) as err:
        await core.read_node("n1")
    assert err.value.status == 404


async def test_graceful_pod_deletion_at_a_nonzero_time_scale(
    aio_emu: EmulatorServer, core: client.CoreV1Api
) -> None:
    aio_emu.store.timescale.factor = 0.02  # a 10 s grace period lasts 0.2 s
    await core.create_namespaced_pod("default", b.pod("p", "n1", grace=10))
    deleted = await core.delete_namespaced_pod("p", "default")
    assert deleted.metadata.deletion_grace_period_seconds == 10
    terminating = await core.read_namespaced_pod("p", "default")
    assert terminating.metadata.deletion_timestamp is not None
    deadline = asyncio.get_running_loop().time() + 5
    while (await core.list_namespaced_pod("default")).items:
        assert asyncio.get_running_loop().time() < deadline, "the pod outlived its grace period"
        await asyncio.sleep(0.05)


async def test_label_and_field_selectors(aio_emu: EmulatorServer, core: client.CoreV1Api) -> None:
    aio_emu.store.create("pods", {**b.pod("a", "n1"), "status": b.RUNNING_READY}, keep_status=True)
    aio_emu.store.create("pods", b.pod("b", "n2", app="db"))
    aio_emu.store.create("pods", b.pod("c", None, app="db"))
    aio_emu.store.create("nodes", b.node("n1"))
    aio_emu.store.create("nodes", b.node("n2", unschedulable=True))

    async def pods(**selectors: str) -> list[str]:
        return [p.metadata.name for p in (await core.list_namespaced_pod("default", **selectors)).items]

    assert await pods(label_selector="app=db") == ["b", "c"]
    assert await pods(label_selector="app notin (db)") == ["a"]
    assert await pods(field_selector="spec.nodeName=n2") == ["b"]
    assert await pods(field_selector="status.phase=Running") == ["a"]
    assert await pods(label_selector="app=db", field_selector="spec.nodeName=") == ["c"]
    cordoned = await core.list_node(field_selector="spec.unschedulable=true")
    assert [n.metadata.name for n in cordoned.items] == ["n2"]
    with pytest.raises(client.ApiException) as err:
        await core.list_namespaced_pod("default", field_selector="spec.hostname=x")
    assert err.value.status == 400


async def test_strategic_merge_replaces_taints_whole_and_merges_finalizers(core: client.CoreV1Api) -> None:
    await core.create_node(
        {
            **b.node("n1"),
            "metadata": {"name": "n1", "finalizers": ["one"]},
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "c", "effect": "NoExecute"}]},
        }
    )
    patched = await core.patch_node(  # a dict body: the client sends a strategic merge patch
        "n1",
        {"metadata": {"finalizers": ["two"]}, "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}},
    )
    assert [t.key for t in patched.spec.taints] == ["b"]  # no patch strategy on taints: replaced
    assert patched.metadata.finalizers == ["one", "two"]  # merged as a set
