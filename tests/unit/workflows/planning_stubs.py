"""The two boundaries of the planning activities, stubbed for unit tests: the worker's informer cache
(a fixed list of objects, optionally slow to sync) and Temporal visibility (nothing in flight; the
time-skipping server has no visibility API). The planner and the activities themselves are real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from activities.planning import PlanningActivities
from cluster.informer import RESOURCES
from planner.model import PlanOptions
from planner.snapshot import Snapshot
from planner.snapshot_builder import SnapshotBuilder
from sim.cluster_builder import ClusterBuilder


class StaticCache:
    """The informer cache's face to the activities, over a list of objects that tests may edit in
    place: listed again into the same SnapshotBuilder the real cache feeds before every snapshot (the
    builder's objects carry no resourceVersion, so each is parsed again). `stale_kinds` is what
    `ClusterCache.stale()` says."""

    def __init__(self, objects: list[dict[str, Any]], sync_seconds: float = 0.0) -> None:
        self.items = objects
        self.sync_seconds = sync_seconds
        self.stale_kinds: list[str] = []
        self.builder = SnapshotBuilder([r.kind for r in RESOURCES])
        self.started = False

    def start(self) -> None:
        self.started = True

    async def wait_synced(self, within: float) -> bool:
        await asyncio.sleep(min(self.sync_seconds, within))
        return self.sync_seconds <= within

    async def wait_ready(self, within: float) -> bool:
        return await self.wait_synced(within)

    def pass_planned(self) -> None:
        pass

    def objects(self) -> Iterator[dict[str, Any]]:
        return iter(self.items)

    def objects_of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.items if o.get("kind") == kind]

    def snapshot(self, now: datetime, instances: Any = (), held: Any = ()) -> Snapshot:
        for kind in self.builder.kinds:
            self.builder.replace(kind, self.objects_of(kind))
        return self.builder.snapshot(now, instances, held)

    def unsynced(self) -> list[str]:
        return []

    def stale(self) -> list[str]:
        return list(self.stale_kinds)


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
    objects: list[dict[str, Any]],
    sync_seconds: float = 0.0,
    visibility: NoVisibility | None = None,
    karpenter_coexistence: bool = False,
    options: PlanOptions | None = None,
) -> PlanningActivities:
    return PlanningActivities(
        StaticCache(objects, sync_seconds),  # type: ignore[arg-type]
        kube=None,  # type: ignore[arg-type]
        client=visibility or NoVisibility(),  # type: ignore[arg-type]
        region="us-west-2",
        karpenter_coexistence=karpenter_coexistence,
        options=options,
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
