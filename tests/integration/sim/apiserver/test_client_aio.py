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
