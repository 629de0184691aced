"""The ControllerWorkflow's history over a long life: prints figures, asserts nothing.

    .venv/bin/python bench/bench_controller_history.py                    # 3,000 nodes, 2,000 passes
    .venv/bin/python bench/bench_controller_history.py --nodes 1000 --passes 300

Runs the real ControllerWorkflow on Temporal's time-skipping test server (accelerated: 10 ms between
passes instead of 10 s; the history does not depend on the interval), with malformed signals sent
at random, and a plan_pass built from the real planner:

- the real planner plans a generated cluster once (sim.cluster_builder.generate_cluster): its
  per-node reasons, budgets and commands are what a pass of that cluster returns;
- each pass then changes what a busy cluster changes: a few nodes' reasons (0.5 % of the nodes), a
  command in one pass out of ten (a real command of that plan; the planner then explains every
  other node with "not chosen this pass: ... produced commands", so nearly every reason changes
  twice, the worst case for sending changes), a failed command now and then (listed by two passes,
  as visibility's look-back does), in-flight commands;
- the result goes through the worker's real `SentReasons` (changes only, when the controller holds
  what this worker sent last), as activities/planning.py sends it; at random points that memory is
  lost, as when the next pass runs on another worker (the controller then gets every reason);
- the commands it starts stay running (no worker polls their task queue), as long drains do.

At the end every run's history is replayed on the current code (what a new worker does after a
crash; tests/integration/controller/test_supervision.py kills real worker processes).

Printed: how many runs, why each continued as new, the largest history of a run in bytes and
events, failed workflow tasks and replays (must be 0), and the controller's status at the end.
Goal: every run under 10 MB (Temporal fails a workflow at 50 MB), never a failed workflow task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio import activity
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.planning import SentReasons, planned_command
from api.controller_io import (
    ControllerInput,
    ControllerStatus,
    FailedCommand,
    PassRequest,
    PassResult,
    PlannedCommand,
    ValidateRequest,
    Verdict,
)
from api.garbage_io import GarbageCollectionRequest, GarbageCollectionResult
from planner.plan import plan
from planner.snapshot import Snapshot
from runtime.connections import ensure_search_attributes, with_karpflow_converter
from sim.binaries import temporal_test_server
from sim.cluster_builder import ClusterSpec, generate_cluster
from worker import WORKFLOWS

NOT_CHOSEN = "not chosen this pass: {method} produced commands, which ends the pass"
BAD_SIGNALS: list[tuple[str, list[Any]]] = [
    (
        "offering_unavailable",
        [{"instance_type": "m5.large", "zone": "us-west-2a", "until": "2099-01-01T00:00:00"}],
    ),
    ("offering_unavailable", ["garbage"]),
    ("offering_unavailable", [{"zone": "us-west-2a"}, 2]),
    ("wake", [[1, 2]]),
    ("no_such_signal", [{}]),
]


@dataclass
class PlannedCluster:
    """One real plan of a generated cluster: what a pass of it returns."""

    reasons: dict[str, str]
    commands: list[PlannedCommand]
    budgets: dict[str, dict[str, int]]
    nodes: int

    @classmethod
    def generate(cls, nodes: int, seed: int = 1) -> PlannedCluster:
        now = datetime.now(UTC)
        b = generate_cluster(ClusterSpec(nodes=nodes, pods=nodes * 10, pools=4, seed=seed), now=now)
        result = plan(Snapshot.from_objects(b.as_list()["items"], now=now), b.catalog)
        planned = [planned_command(c) for c in result.commands_]
        return cls({x.node: x.reason for x in result.blocked}, planned, result.budgets, nodes)


@dataclass
class BusyCluster:
    """What each pass of a busy cluster returns; shared by every worker of the bench."""

    planned: PlannedCluster
    rng: random.Random
    reasons: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    started: int = 0
    in_flight: list[str] = field(default_factory=list)
    failures: list[FailedCommand] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reasons = dict(self.planned.reasons)
        self.texts = sorted(set(self.reasons.values()))

    def next_pass(self) -> tuple[list[PlannedCommand], dict[str, str], list[FailedCommand]]:
        self.calls += 1
        nodes = list(self.planned.reasons)
        for node in self.rng.sample(nodes, max(1, len(nodes) // 200)):
            self.reasons[node] = self.rng.choice(self.texts)
        commands: list[PlannedCommand] = []
        reasons = self.reasons
        if self.rng.random() < 0.1 and self.planned.commands:
            command = self.planned.commands[self.started % len(self.planned.commands)]
            self.started += 1
            commands = [command.model_copy(update={"workflow_id": f"{command.workflow_id}-{self.started}"})]
            reasons = {n: NOT_CHOSEN.format(method=command.method) for n in reasons if n not in command.nodes}
            self.in_flight = [*self.in_flight, commands[0].workflow_id][-5:]
        failed = list(self.failures)  # last pass's failure, listed again (look-back)
        self.failures = []
        if self.rng.random() < 0.02:
            pool = self.rng.choice(sorted(self.planned.budgets) or ["default"])
            self.failures = [
                FailedCommand(
                    workflow_id=f"disruption/{pool}/Drifted/f{self.calls}",
                    run_id=uuid.uuid4().hex,
                    nodepools=[pool],
                    reason="Drifted",
                    closed_at=datetime.now(UTC),
                )
            ]
            failed += self.failures
        return commands, reasons, failed


class BenchActivities:
    """One worker's controller activities: its own memory of what it sent (a new worker has none)."""

    def __init__(self, cluster: BusyCluster) -> None:
        self.cluster = cluster
        self.sent = SentReasons()

    def all(self) -> list[Any]:
        return [
            self.plan_pass,
            self.validate_commands,
            self.untaint_orphans,
            self.sync_finalizers,
            self.annotate,
            self.collect_garbage,
        ]

    @activity.defn(name="plan_pass")
    async def plan_pass(self, request: PassRequest) -> PassResult:
        commands, reasons, failed = self.cluster.next_pass()
        return PassResult(
            at=datetime.now(UTC),
            commands=commands,
            reasons=self.sent.update(activity.info().workflow_id, request.reasons_base, reasons),
            budgets=self.cluster.planned.budgets,
            in_flight=self.cluster.in_flight,
            failed=failed,
            nodes=self.cluster.planned.nodes,
        )

    @activity.defn(name="validate_commands")
    async def validate_commands(self, request: ValidateRequest) -> list[Verdict]:
        return [Verdict(workflow_id=c.workflow_id, valid=True, command=c) for c in request.commands]

    @activity.defn(name="untaint_orphans")
    async def untaint_orphans(self, nodes: list[str]) -> list[str]:
        return nodes

    @activity.defn(name="sync_nodepool_finalizers")
    async def sync_finalizers(self, changes: dict[str, bool]) -> int:
        return len(changes)

    @activity.defn(name="apply_annotations")
    async def annotate(self, changes: list[dict[str, Any]]) -> int:
        return len(changes)

    @activity.defn(name="collect_garbage")
    async def collect_garbage(self, request: GarbageCollectionRequest) -> GarbageCollectionResult:
        return GarbageCollectionResult(at=datetime.now(UTC))


@dataclass
class Run:
    run_id: str
    events: int
    bytes: int
    ended: str
    failed_tasks: int
    replay_error: str = ""
    # Why each workflow task failed (the server's cause and the failure's message), for the report.
    task_failures: list[str] = field(default_factory=list)


@dataclass
class Figures:
    nodes: int
    reasons: int
    reasons_bytes: int
    passes: int
    runs: list[Run]
    forgotten: int
    signals: int
    status: ControllerStatus
    still_running: bool
    seconds: float

    @property
    def largest(self) -> Run:
        return max(self.runs, key=lambda r: r.bytes)


def history_bytes(history: WorkflowHistory) -> int:
    return sum(event.ByteSize() for event in history.events)


async def chain(client: Client, workflow_id: str, first_run: str) -> list[Run]:
    """Every run from `first_run` on, the current one included, with the size of its history."""
    runs, run_id = [], first_run
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        history = await handle.fetch_history()
        last = history.events[-1]
        following = ""
        if last.HasField("workflow_execution_continued_as_new_event_attributes"):
            following = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        causes = [
            f"{WorkflowTaskFailedCause.Name(a.cause)}: {a.failure.message}"
            for e in history.events
            if e.HasField("workflow_task_failed_event_attributes")
            for a in [e.workflow_task_failed_event_attributes]
        ]
        failed = len(causes)
        passes = sum(
            1
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "plan_pass"
        )
        ended = "running" if not following else "history limit" if passes < 100 else "100 passes"
        replayed = await Replayer(
            workflows=list(WORKFLOWS), data_converter=pydantic_data_converter
        ).replay_workflow(history, raise_on_replay_failure=False)
        error = repr(replayed.replay_failure) if replayed.replay_failure else ""
        runs.append(Run(run_id, len(history.events), history_bytes(history), ended, failed, error, causes))
        run_id = following
    return runs


async def measure(
    client: Client,
    cluster: PlannedCluster,
    passes: int,
    *,
    seed: int = 17,
    forget_every: tuple[int, int] = (50, 150),
    signal_every: tuple[int, int] = (10, 60),
    max_history_bytes: int | None = None,
    progress: bool = False,
) -> Figures:
    rng = random.Random(seed)
    busy = BusyCluster(cluster, rng)
    task_queue = f"bench-{uuid.uuid4().hex[:8]}"
    workflow_id = f"karpflow-controller/{task_queue}"
    # The commands it starts go to a task queue no worker polls: they stay running, as long drains do.
    children = f"{task_queue}-commands"
    fields: dict[str, Any] = {"cluster": "bench", "task_queue": children, "interval_seconds": 0.01}
    fields["validation_seconds"] = 0.01
    if max_history_bytes is not None:
        fields["max_history_bytes"] = max_history_bytes
    began = time.perf_counter()
    forgotten = signals = 0
    bench = BenchActivities(busy)
    async with Worker(client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=bench.all()):
        handle = await client.start_workflow(
            "ControllerWorkflow", ControllerInput(**fields), id=workflow_id, task_queue=task_queue
        )
        forget_at, signal_at = rng.randint(*forget_every), rng.randint(*signal_every)
        while busy.calls < passes:
            await asyncio.sleep(0.1)
            if busy.calls >= signal_at:
                name, args = rng.choice(BAD_SIGNALS)
                await handle.signal(name, args=args)
                signals, signal_at = signals + 1, busy.calls + rng.randint(*signal_every)
            if busy.calls >= forget_at:
                # The next pass runs on a worker that never sent this controller anything.
                bench.sent, forgotten = SentReasons(), forgotten + 1
                forget_at = busy.calls + rng.randint(*forget_every)
            if progress and busy.calls // 250 != (busy.calls - 1) // 250:
                print(f"   ... {busy.calls} passes", flush=True)
        running = (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        status = await handle.query("status", result_type=ControllerStatus)
        await handle.terminate("bench over")
    runs = await chain(client, workflow_id, handle.result_run_id or "")
    return Figures(
        nodes=cluster.nodes,
        reasons=len(cluster.reasons),
        reasons_bytes=len(json.dumps(cluster.reasons)),
        passes=busy.calls,
        runs=runs,
        forgotten=forgotten,
        signals=signals,
        status=status,
        still_running=running,
        seconds=time.perf_counter() - began,
    )


async def time_skipping_client() -> tuple[WorkflowEnvironment, Client]:
    env = await WorkflowEnvironment.start_time_skipping(test_server_existing_path=temporal_test_server())
    client = with_karpflow_converter(env.client)
    await ensure_search_attributes(client)
    return env, client


def report(figures: Figures) -> None:
    largest = figures.largest
    ended: dict[str, int] = {}
    for run in figures.runs:
        ended[run.ended] = ended.get(run.ended, 0) + 1
    print(
        f"== {figures.nodes} nodes, {figures.passes} passes: {figures.reasons} node reasons "
        f"({figures.reasons_bytes / 1e3:.0f} KB when sent whole)"
    )
    print(f"   runs: {len(figures.runs)} ({', '.join(f'{n} {why}' for why, n in sorted(ended.items()))})")
    print(
        f"   largest run: {largest.bytes / 1e6:.2f} MB, {largest.events} events; "
        f"mean {sum(r.bytes for r in figures.runs) / len(figures.runs) / 1e6:.2f} MB; "
        f"largest by events: {max(r.events for r in figures.runs)}"
    )
    print(
        f"   worker memory lost {figures.forgotten} times, {figures.signals} malformed signals sent; "
        f"failed workflow tasks: {sum(r.failed_tasks for r in figures.runs)}; "
        f"runs that do not replay: {sum(1 for r in figures.runs if r.replay_error)}"
    )
    for cause in sorted({c for r in figures.runs for c in r.task_failures}):
        print(f"   a workflow task failed: {cause}")
    s = figures.status
    print(
        f"   at the end: {'RUNNING' if figures.still_running else 'NOT RUNNING'}, pass {s.passes}, "
        f"{len(s.blocked)} nodes explained, {len(s.bad_signals)} bad signals listed in this run, "
        f"error {s.error!r}"
    )
    print(f"   wall: {figures.seconds:.0f}s ({figures.seconds / max(1, figures.passes) * 1e3:.0f} ms a pass)")


async def main(nodes: int, passes: int) -> None:
    t0 = time.perf_counter()
    cluster = PlannedCluster.generate(nodes)
    print(f"   planned a generated {nodes}-node cluster in {time.perf_counter() - t0:.0f}s", flush=True)
    env, client = await time_skipping_client()
    try:
        report(await measure(client, cluster, passes, progress=True))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--passes", type=int, default=2000)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.nodes, arguments.passes))
    sys.stdout.flush()
