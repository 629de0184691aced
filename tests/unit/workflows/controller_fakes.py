"""Scripted stand-ins for the controller's activities (plan_pass and the pass's own activities),
registered under the real names, beside FakeCluster's disruption and termination activities.

A test scripts each pass (`PassScript`): what it returns, what it fails with. Per-node reasons go
through the worker's real `SentReasons`, so what reaches the workflow is what a worker would send.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest_asyncio
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities import errors
from activities.planning import SentReasons
from api.controller_io import (
    ControlsUpkeep,
    FailedCommand,
    PassRequest,
    PassResult,
    PlannedCommand,
    ValidateRequest,
    Verdict,
)
from api.garbage_io import GarbageCollectionRequest, GarbageCollectionResult
from runtime.connections import ensure_search_attributes, with_karpflow_converter
from tests.unit.workflows.fakes import FakeCluster
from worker import WORKFLOWS

CONTROLLER_ACTIVITIES = (
    "plan_pass",
    "validate_commands",
    "untaint_orphans",
    "sync_nodepool_finalizers",
    "sync_operator_controls",
    "apply_annotations",
    "collect_garbage",
)


def refusal(what: str) -> ApplicationError:
    return ApplicationError(f"{what}: refused by the test", type=errors.INVALID, non_retryable=True)


@dataclass
class PassScript:
    """What one pass sees. `fail` names activities that fail for good in this pass."""

    commands: list[PlannedCommand] = field(default_factory=list)
    failed: list[FailedCommand] = field(default_factory=list)
    orphan_taints: list[str] = field(default_factory=list)
    finalizers: dict[str, bool] = field(default_factory=dict)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    upkeep: ControlsUpkeep | None = None
    fail: set[str] = field(default_factory=set)


class FakeController:
    def __init__(self) -> None:
        self.script: list[PassScript] = []  # one entry a pass, then empty passes
        self.requests: list[PassRequest] = []
        self.calls: list[str] = []
        self.reasons: dict[str, str] = {}  # what the planner says of each node now
        self.each_pass: Callable[[int, FakeController], None] | None = None  # e.g. change reasons
        self.full_reasons = False  # a worker of the previous version: every reason in `blocked`, every pass
        self.gates: dict[int, asyncio.Event] = {}  # plan_pass call number -> waits until set
        self.sent = SentReasons()
        self.upkeeps: list[ControlsUpkeep] = []
        # What each collect_garbage call got, and what the next ones return (then nothing collected).
        self.collections: list[GarbageCollectionRequest] = []
        self.garbage: list[GarbageCollectionResult] = []
        self._current = PassScript()

    def next_script(self) -> PassScript:
        return self.script.pop(0) if self.script else PassScript()

    def hold(self, call: int) -> asyncio.Event:
        """plan_pass call number `call` waits until the returned event is set."""
        self.gates[call] = asyncio.Event()
        return self.gates[call]

    def activities(self) -> list[Any]:
        return [
            self.plan_pass,
            self.validate_commands,
            self.untaint_orphans,
            self.sync_nodepool_finalizers,
            self.sync_operator_controls,
            self.apply_annotations,
            self.collect_garbage,
        ]

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        if name in self._current.fail:
            raise refusal(name)

    @activity.defn(name="plan_pass")
    async def plan_pass(self, request: PassRequest) -> PassResult:
        self.requests.append(request)
        gate = self.gates.get(len(self.requests))
        if gate is not None:
            await gate.wait()
        if self.each_pass is not None:
            self.each_pass(len(self.requests), self)
        self._current = self.next_script()
        self._maybe_fail("plan_pass")
        if self.full_reasons:
            reasons, blocked = None, dict(self.reasons)
        else:
            reasons = self.sent.update(activity.info().workflow_id, request.reasons_base, self.reasons)
            blocked = {}
        return PassResult(
            at=datetime.now(UTC),
            commands=self._current.commands,
            reasons=reasons,
            blocked=blocked,
            failed=self._current.failed,
            orphan_taints=self._current.orphan_taints,
            nodepool_finalizers=self._current.finalizers,
            annotations=self._current.annotations,
            upkeep=self._current.upkeep,
            nodes=len(self.reasons),
        )

    @activity.defn(name="validate_commands")
    async def validate_commands(self, request: ValidateRequest) -> list[Verdict]:
        self._maybe_fail("validate_commands")
        return [Verdict(workflow_id=c.workflow_id, valid=True, command=c) for c in request.commands]

    @activity.defn(name="untaint_orphans")
    async def untaint_orphans(self, nodes: list[str]) -> list[str]:
        self._maybe_fail("untaint_orphans")
        return nodes

    @activity.defn(name="sync_nodepool_finalizers")
    async def sync_nodepool_finalizers(self, changes: dict[str, bool]) -> int:
        self._maybe_fail("sync_nodepool_finalizers")
        return len(changes)

    @activity.defn(name="sync_operator_controls")
    async def sync_operator_controls(self, upkeep: ControlsUpkeep) -> int:
        self._maybe_fail("sync_operator_controls")
        self.upkeeps.append(upkeep)
        return len(upkeep.conditions) + upkeep.stale_claims

    @activity.defn(name="apply_annotations")
    async def apply_annotations(self, changes: list[dict[str, Any]]) -> int:
        self._maybe_fail("apply_annotations")
        return len(changes)

    @activity.defn(name="collect_garbage")
    async def collect_garbage(self, request: GarbageCollectionRequest) -> GarbageCollectionResult:
        # Not in `calls`: a collection comes with the first pass of a run and then by time, not by
        # what the pass found; the tests that read `calls` script the passes.
        self.collections.append(request)
        if "collect_garbage" in self._current.fail:
            raise refusal("collect_garbage")
        return self.garbage.pop(0) if self.garbage else GarbageCollectionResult(at=datetime.now(UTC))


def activity_name(fn: Any) -> str:
    return fn.__temporal_activity_definition.name


def other_activities(cluster: FakeCluster) -> list[Any]:
    """FakeCluster's disruption and termination activities, without its controller ones."""
    return [a for a in cluster.activities() if activity_name(a) not in CONTROLLER_ACTIVITIES]


@dataclass
class ControllerHarness:
    client: Client
    controller: FakeController
    cluster: FakeCluster
    task_queue: str

    def id(self, prefix: str) -> str:
        return f"{prefix}/{uuid.uuid4().hex[:8]}"


async def _harness(client: Client) -> AsyncIterator[ControllerHarness]:
    controller, cluster = FakeController(), FakeCluster()
    task_queue = f"unit-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        activities=[*controller.activities(), *other_activities(cluster)],
    ):
        yield ControllerHarness(client, controller, cluster, task_queue)


@pytest_asyncio.fixture(name="controller_harness")
async def controller_harness_fixture(dev_server_env: WorkflowEnvironment) -> AsyncIterator[ControllerHarness]:
    """On the real dev server. The time-skipping test server failed these tests now and then under
    load: a query that went unanswered for 30 s ("no status"); a controller that took updates then
    continued as new and made no pass for 30 s; a chain that reported 826 passes in 2 runs of at
    most 4 passes each."""
    client = with_karpflow_converter(dev_server_env.client)
    assert await ensure_search_attributes(client)
    async for harness in _harness(client):
        yield harness
