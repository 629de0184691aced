"""The node-deletion watcher's check for terminations that closed unfinished costs O(closed runs),
not O(nodes deleting) (cluster/node_deletions.py). The boundaries are faked: the Temporal client
(visibility answers what the test says closed) and a Kubernetes API that fails any call, since the
check must not read nodes. The real path runs in tests/integration/workflows/test_guards.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from api.constants import TERMINATION_FINALIZER
from api.workflow_ids import termination_workflow_id
from cluster.node_deletions import NodeDeletionWatcher

CLUSTER = "unit"
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


class NoKube:
    """Any call fails the test: the check reads the watch's own view of the nodes."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the check called kube.{name}")


class Visibility:
    """Runs and their status; `closed` is what a visibility query lists; `down` makes it fail."""

    def __init__(self) -> None:
        self.status: dict[str, WorkflowExecutionStatus] = {}
        self.closed: list[str] = []
        self.queries: list[str] = []
        self.described: list[str] = []
        self.starts: list[str] = []
        self.down = False

    def get_workflow_handle(self, workflow_id: str) -> Any:
        async def describe() -> Any:
            self.described.append(workflow_id)
            return SimpleNamespace(status=self.status.get(workflow_id, WorkflowExecutionStatus.RUNNING))

        return SimpleNamespace(describe=describe)

    def list_workflows(self, query: str) -> AsyncIterator[Any]:
        self.queries.append(query)

        async def listed() -> AsyncIterator[Any]:
            if self.down:
                raise RuntimeError("visibility is down")
            for workflow_id in self.closed:
                yield SimpleNamespace(id=workflow_id)

        return listed()

    async def start_workflow(self, *_: Any, id: str, **__: Any) -> Any:
        self.starts.append(id)
        self.status[id] = WorkflowExecutionStatus.RUNNING
        return SimpleNamespace(id=id, result_run_id="run")


def deleting(index: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"node-{index}",
            "uid": f"uid-{index}",
            "deletionTimestamp": "2026-11-27T11:59:00Z",
            "finalizers": [TERMINATION_FINALIZER],
        }
    }


def run_id(index: int) -> str:
    return termination_workflow_id(CLUSTER, f"node-{index}", f"uid-{index}")


async def watching(count: int) -> tuple[NodeDeletionWatcher, Visibility]:
    client = Visibility()
    watcher = NodeDeletionWatcher(NoKube(), client, "queue", cluster=CLUSTER)  # type: ignore[arg-type]
    for index in range(count):
        await watcher._consider(deleting(index))
    return watcher, client


async def test_after_the_first_check_only_runs_that_closed_unfinished_are_described():
    watcher, client = await watching(100)
    assert await watcher.retry_unfinished(NOW) == []
    assert len(client.described) == 100  # the first check looks at every node once

    client.described.clear()
    client.status[run_id(7)] = WorkflowExecutionStatus.FAILED
    client.closed = [run_id(7), "termination/other-cluster/node-7/uid-7"]
    assert await watcher.retry_unfinished(NOW + timedelta(seconds=10)) == []
    assert client.described == [run_id(7)]
    assert "termination failed (1 time(s))" in watcher.waiting["node-7"]
    assert "ExecutionStatus IN (" in client.queries[-1] and "'TimedOut'" in client.queries[-1]
    assert f"CloseTime >= '{(NOW - timedelta(seconds=60)).isoformat()}'" in client.queries[-1]

    # Out of visibility's window now, it is still looked at while it waits, and started again.
    client.described.clear()
    client.closed = []
    assert await watcher.retry_unfinished(NOW + timedelta(seconds=45)) == ["node-7"]
    assert client.described == [run_id(7)] and client.starts.count(run_id(7)) == 2
    assert "node-7" not in watcher.waiting

    client.described.clear()
    assert await watcher.retry_unfinished(NOW + timedelta(seconds=55)) == []
    assert client.described == []  # running again, and nothing else closed: nothing described


async def test_when_visibility_fails_every_termination_is_described():
    watcher, client = await watching(5)
    await watcher.retry_unfinished(NOW)
    client.described.clear()
    client.down = True
    client.status[run_id(3)] = WorkflowExecutionStatus.TIMED_OUT
    await watcher.retry_unfinished(NOW + timedelta(seconds=10))
    assert sorted(client.described) == sorted(run_id(i) for i in range(5))
    assert watcher.visibility_failures == 1 and "timed_out" in watcher.waiting["node-3"]


async def test_a_list_forgets_the_nodes_whose_deletion_the_watch_missed():
    client = Visibility()
    listings = [[deleting(1), deleting(2)], [deleting(2)]]

    class Kube:
        async def list_nodes(self, **_: Any) -> dict[str, Any]:
            return {"items": listings.pop(0), "metadata": {"resourceVersion": "1"}}

        async def watch(self, *_: Any) -> AsyncIterator[dict[str, Any]]:
            if not listings:
                raise asyncio.CancelledError  # the second watch: the test is over
            yield {"type": "ERROR", "object": {"code": 410}}  # too old: list again

    watcher = NodeDeletionWatcher(Kube(), client, "queue", cluster=CLUSTER)  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await watcher._watch_loop()
    assert watcher.names == {"uid-2": "node-2"}
    await watcher.retry_unfinished(NOW)
    assert client.described == [run_id(2)]


async def test_a_watch_the_server_ends_is_opened_again_from_its_last_version_without_a_listing():
    """Issue 34: the watcher listed every node each time the server ended its watch (every 5 minutes
    per worker); now only at start and after an error, in pages."""
    client = Visibility()
    calls: list[tuple[str, Any]] = []

    class Kube:
        async def list_nodes(self, **page: Any) -> dict[str, Any]:
            calls.append(("list", page.get("continue_token")))
            if page.get("continue_token") is None:
                return {"items": [deleting(1)], "metadata": {"resourceVersion": "5", "continue": "next"}}
            return {"items": [deleting(2)], "metadata": {"resourceVersion": "5"}}

        async def watch(self, path: str, version: str, *_: Any) -> AsyncIterator[dict[str, Any]]:
            calls.append(("watch", version))
            if len([c for c in calls if c[0] == "watch"]) == 3:
                raise asyncio.CancelledError  # the test is over
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(int(version) + 10)}}}

    watcher = NodeDeletionWatcher(Kube(), client, "queue", cluster=CLUSTER)  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await watcher._watch_loop()
    assert calls == [("list", None), ("list", "next"), ("watch", "5"), ("watch", "15"), ("watch", "25")]
    assert set(watcher.names) == {"uid-1", "uid-2"}
