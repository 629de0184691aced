"""The two boundaries of the planning activities, stubbed for unit tests: the worker's informer cache
(a fixed list of objects, optionally slow to sync) and Temporal visibility (nothing in flight; the
time-skipping server has no visibility API). The planner and the activities themselves are real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from activities.planning import PlanningActivities
from sim.cluster_builder import ClusterBuilder


class StaticCache:
    def __init__(self, objects: list[dict[str, Any]], sync_seconds: float = 0.0) -> None:
        self.items = objects
        self.sync_seconds = sync_seconds

    async def wait_synced(self, within: float) -> bool:
        await asyncio.sleep(min(self.sync_seconds, within))
        return self.sync_seconds <= within

    def objects(self) -> Iterator[dict[str, Any]]:
        return iter(self.items)

    def unsynced(self) -> list[str]:
        return []


class NoVisibility:
    """Lists nothing; remembers the queries."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def list_workflows(self, query: str) -> AsyncIterator[Any]:
        self.queries.append(query)

        async def nothing() -> AsyncIterator[Any]:
            return
            yield

        return nothing()


class StartedVisibility(NoVisibility):
    """Lists `started` (closed executions, as `client.list_workflows` yields them) to the queries by
    StartTime (what rate budgets count), nothing to the others."""

    def __init__(self, started: list[Any]) -> None:
        super().__init__()
        self.started = started

    def list_workflows(self, query: str) -> AsyncIterator[Any]:
        self.queries.append(query)
        listed = self.started if "StartTime >" in query else []

        async def executions() -> AsyncIterator[Any]:
            for execution in listed:
                yield execution

        return executions()


def planning(
    objects: list[dict[str, Any]], sync_seconds: float = 0.0, visibility: NoVisibility | None = None
) -> PlanningActivities:
    return PlanningActivities(
        StaticCache(objects, sync_seconds),  # type: ignore[arg-type]
        kube=None,  # type: ignore[arg-type]
        client=visibility or NoVisibility(),  # type: ignore[arg-type]
        region="us-west-2",
    )


def quiet_cluster(nodes: int) -> ClusterBuilder:
    """`nodes` busy nodes of one WhenEmpty pool: nothing to do, a reason for every node."""
    b = ClusterBuilder(now=datetime.now(UTC))
    b.nodeclass()
    b.nodepool("default", policy="WhenEmpty", consolidate_after="0s")
    for index in range(nodes):
        name = f"ip-10-0-{index // 256}-{index % 256}.us-west-2.compute.internal"
        b.node(name, age=timedelta(days=2, minutes=index))
        b.pod(f"web-{index}", name)
    return b
