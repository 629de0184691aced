"""One chaos run: the world, the faults, then convergence and the verdict (sim/chaos/__init__.py).

    report = asyncio.run(run_chaos(ChaosConfig(seed=7, minutes=2)))
    print("\\n".join(report.lines())); assert report.ok

The Temporal dev server and the karpflow workers are processes of their own (they are killed); the
simulated cluster (emulator, EC2 and SQS in moto, the invariant checker) runs in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from api import search_attributes as sa
from api.controller_io import ControllerStatus
from api.workflow_ids import controller_workflow_id
from sim.chaos import actions
from sim.chaos.actions import Effects
from sim.chaos.faults import ContinuousFaults
from sim.chaos.permanent import FAULTS as PERMANENT_FAULTS
from sim.chaos.permanent import EvictionsDenied, PermanentFault
from sim.chaos.processes import TemporalServer, Workers
from sim.chaos.report import INVARIANTS, PERMANENT_INVARIANT, ChaosReport, CommandCounts
from sim.chaos.schedule import ChaosEvent, ScheduleSpec, build_schedule
from sim.chaos.world import World, build_world
from sim.interruption_queue import MOTO_KEYS, ensure_interruption_queue
from sim.invariants import InvariantBounds, nodes_in_flight
from sim.stack import SimStack
from workflows.options import INSTANCE_TERMINATE_HEARTBEAT

log = logging.getLogger(__name__)
PRIMARY, SECOND = "a", "b"


class ChaosConfig(BaseModel):
    seed: int = 1
    minutes: float = Field(default=2.0, gt=0, description="the fault phase")
    nodes: int = Field(default=16, ge=8)
    time_scale: float = Field(default=0.05, gt=0)
    converge_within: float = Field(default=300.0, gt=0, description="seconds after the faults stop")
    api_error_rate: float = Field(default=0.10, ge=0, le=1)
    ec2_throttle: float = Field(default=0.10, ge=0, le=1)
    state_dir: Path | None = None
    keep_state: bool = False
    permanent_faults: bool = Field(
        default=True, description="evictions denied, a tag removed, a NodeClaim held"
    )
    karpenter: bool = Field(
        default=False,
        description="coexistence: karpflow beside the simulated Karpenter (sim/controllers/karpenter/)",
    )


def chaos_bounds(scale: float) -> InvariantBounds:
    """The checker's bounds for a run with workers killed every few seconds: a transient may last a few
    recoveries (a lost activity comes back after its 30 s heartbeat timeout), in wall seconds turned
    into the simulated seconds the checker counts. What lasts past them, or to the end, is a finding.
    A Node outlives its instance while the termination waits for EC2 to say terminated, an activity
    with a longer heartbeat timeout (INSTANCE_TERMINATE_HEARTBEAT, 60 s): two kills during that wait
    cost two minutes (seed 4242 took 124 s), so the orphan bound is three of its recoveries."""
    orphan = max(120.0, 3 * INSTANCE_TERMINATE_HEARTBEAT.total_seconds())
    return InvariantBounds(
        replacement=120 / scale,
        registration=120 / scale,
        node_gone=60 / scale,
        orphan_node=orphan / scale,
        disrupted_taint=60 / scale,
    )


def worker_env(
    stack: SimStack, temporal: TemporalServer, queue_url: str, scale: float, karpenter: bool = False
) -> dict[str, str]:
    """A worker configured only through its environment, at the simulator's pace; beside Karpenter in
    its coexistence mode (docs/running-beside-karpenter.md)."""
    env = stack.client_env()
    env.pop("KUBECONFIG", None)
    return {
        **({"KARPFLOW_KARPENTER_COEXISTENCE": "true"} if karpenter else {}),
        **env,
        "KARPFLOW_TEMPORAL_ADDRESS": temporal.address,
        "KARPFLOW_KUBE_API_SERVER": stack.kube_url,
        "KARPFLOW_AWS_ENDPOINT_URL": stack.ec2_endpoint,
        "KARPFLOW_AWS_REGION": stack.region,
        "KARPFLOW_INTERRUPTION_QUEUE": queue_url,
        "KARPFLOW_INTERRUPTION_WAIT": "1",
        "KARPFLOW_CONTROLLER": "true",
        "KARPFLOW_CONTROLLER_INTERVAL": f"{max(0.3, 10.0 * scale):g}",
        "KARPFLOW_CONTROLLER_VALIDATION": f"{max(0.5, 15.0 * scale):g}",
        "KARPFLOW_CONTROLLER_SUPERVISE_INTERVAL": "2",
        "KARPFLOW_POLL_INTERVAL": f"{max(0.1, 1.0 * scale):g}",
        "KARPFLOW_EC2_POLL_INTERVAL": f"{max(0.2, 5.0 * scale):g}",
        "KARPFLOW_STICKY_QUEUE_TIMEOUT": "1",
        "KARPFLOW_GRACEFUL_SHUTDOWN": "0",
        "KARPFLOW_HEALTH": "false",
        "KARPFLOW_REGISTER_SEARCH_ATTRIBUTES": "false",
        "KARPFLOW_LOG_FORMAT": "text",
    }


class InFlight:
    """The nodes of open karpflow workflows, refreshed from visibility: the checker's in-flight source.
    While Temporal is down the last answer stands."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.nodes: set[str] | None = None

    async def refresh(self) -> set[str] | None:
        with contextlib.suppress(Exception):
            self.nodes = await nodes_in_flight(self.client)
        return self.nodes

    async def run(self, every: float = 1.0) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(every)


class ChaosRun:
    def __init__(self, config: ChaosConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        self.state_dir = config.state_dir or Path(tempfile.mkdtemp(prefix="karpflow-chaos-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.cluster = f"chaos-{config.seed}-{uuid.uuid4().hex[:4]}"
        self.world: World = build_world(config.seed, config.nodes)
        self.temporal = TemporalServer(self.state_dir)
        self.stack: SimStack | None = None
        self.workers: Workers | None = None
        self.client: Client | None = None
        self.effects = Effects()
        self.faults: ContinuousFaults | None = None
        self.permanent: list[PermanentFault] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.restarts: dict[str, asyncio.Task[Any]] = {}
        self.second_wanted = False
        self.report = ChaosReport(
            seed=config.seed,
            minutes=config.minutes,
            time_scale=config.time_scale,
            nodes=config.nodes,
            karpenter=config.karpenter,
            cluster_nodes=len(self.world.nodes),
            cluster=self.cluster,
            state_dir=str(self.state_dir),
        )

    # -- the stack -----------------------------------------------------------------------------------

    async def start(self) -> None:
        c = self.config
        self.say(f"state in {self.state_dir}; starting the Temporal dev server, the simulator and a worker")
        await asyncio.to_thread(self.temporal.start)
        await asyncio.to_thread(self.temporal.register_search_attributes)
        self.stack = SimStack(
            time_scale=c.time_scale,
            cluster_name=self.cluster,
            scenario=self.world.scenario,
            invariant_bounds=chaos_bounds(c.time_scale),
            karpenter=c.karpenter,
        )
        await asyncio.to_thread(self.stack.start)
        stack = self.stack
        self.queue_url = await asyncio.to_thread(
            ensure_interruption_queue, stack.ec2_endpoint, stack.region, f"{self.cluster}-interruption"
        )
        self.sqs = boto3.client("sqs", endpoint_url=stack.ec2_endpoint, region_name=stack.region, **MOTO_KEYS)
        self.client = await Client.connect(self.temporal.address, data_converter=pydantic_data_converter)
        self.in_flight = InFlight(self.client)
        await self.in_flight.refresh()
        stack.invariants.set_in_flight_source(lambda: self.in_flight.nodes)
        self.tasks.append(asyncio.create_task(self.in_flight.run(), name="in-flight"))
        logs = self.state_dir / "logs"
        logs.mkdir(exist_ok=True)
        self.workers = Workers(
            worker_env(stack, self.temporal, self.queue_url, c.time_scale, karpenter=c.karpenter), logs
        )
        self.workers.start(PRIMARY)
        status = await self._until(self._first_pass, 90, "the controller's first pass")
        self.say(f"controller running: first pass saw {status.last_pass_nodes} nodes")

    async def _first_pass(self) -> ControllerStatus | None:
        status = await self.controller_status()
        return status if status is not None and status.passes > 0 else None

    async def controller_status(self) -> ControllerStatus | None:
        assert self.client is not None
        handle = self.client.get_workflow_handle(controller_workflow_id(self.cluster))
        try:
            return await handle.query("status", result_type=ControllerStatus)
        except Exception:
            return None

    async def _until(self, check: Callable[[], Any], within: float, what: str) -> Any:
        deadline = time.monotonic() + within
        while True:
            value = await check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not happen within {within:.0f}s")
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        for task in [*self.tasks, *self.restarts.values(), *self.effects.pending]:
            task.cancel()
        for task in [*self.tasks, *self.restarts.values(), *self.effects.pending]:
            with contextlib.suppress(BaseException):
                await task
        if self.workers is not None:
            await asyncio.to_thread(self.workers.stop_all)
        if self.stack is not None:
            await asyncio.to_thread(self.stack.stop)
        await asyncio.to_thread(self.temporal.stop)

    # -- the fault phase -------------------------------------------------------------------------------

    async def fault_phase(self) -> None:
        c = self.config
        assert self.stack is not None and self.workers is not None
        seconds = c.minutes * 60
        schedule = build_schedule(
            c.seed, ScheduleSpec(seconds=seconds, permanent=c.permanent_faults, karpenter=c.karpenter)
        )
        self.faults = ContinuousFaults(
            self.stack, c.seed, api_error_rate=c.api_error_rate, ec2_throttle=c.ec2_throttle
        )
        self.faults.on()
        self.say(
            f"fault phase: {seconds:.0f}s, {len(schedule)} events "
            f"({_pairs(Counter(e.kind for e in schedule))}); ICE on {self.faults.ice_pools}"
        )
        began = time.monotonic()
        for event in schedule:
            delay = began + event.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._check_workers()
            try:
                await self._run(event)
            except Exception as err:  # a fault that could not be injected is logged, not fatal
                log.exception("chaos event %s failed", event)
                self.effects.note("skipped", f"{event.kind} at {event.at:.1f}s failed: {err!r}")
        remaining = began + seconds - time.monotonic()
        if remaining > 0:
            await asyncio.sleep(remaining)
        self.report.fault_phase_seconds = round(time.monotonic() - began, 1)

    def _check_workers(self) -> None:
        assert self.workers is not None
        before = len(self.workers.exits)
        self.workers.check()
        for exit_line in self.workers.exits[before:]:
            self.say(f"!! {exit_line}")
            self.report.worker_exits.append(exit_line)
        if PRIMARY not in self.workers.running and PRIMARY not in self.restarts:
            self.workers.start(PRIMARY)

    async def _run(self, event: ChaosEvent) -> None:
        assert self.stack is not None and self.workers is not None
        rng = event.rng()
        if event.kind == "kill-worker":
            # A kill that finds every worker down waits for one to come back: each run kills its share.
            alive = self.workers.alive()
            for _ in range(40):
                if alive:
                    break
                await asyncio.sleep(0.25)
                alive = self.workers.alive()
            if not alive:
                self.effects.note("skipped", "kill: no worker alive")
                return
            name = rng.choice(alive)
            self.workers.kill(name)
            self.effects.note("worker-killed", f"SIGKILL worker {name} at {event.at:.1f}s")
            if name == PRIMARY or self.second_wanted:
                self.restarts[name] = asyncio.create_task(self._restart(name, rng.uniform(0.5, 3.0)))
        elif event.kind == "second-worker-up":
            self.second_wanted = True
            self.workers.start(SECOND)
            self.effects.note("second-worker", f"second worker started at {event.at:.1f}s")
        elif event.kind == "second-worker-down":
            self.second_wanted = False
            await asyncio.to_thread(self.workers.stop, SECOND)
            self.effects.note("second-worker-stopped", f"second worker stopped at {event.at:.1f}s")
        elif event.kind == "restart-temporal":
            down_for = rng.uniform(1.0, 4.0)
            self.effects.note(
                "temporal-restart", f"Temporal dev server restarted at {event.at:.1f}s, down {down_for:.1f}s"
            )
            self.tasks.append(asyncio.create_task(asyncio.to_thread(self.temporal.restart, down_for)))
        elif event.kind == "vanish-instance":
            await asyncio.to_thread(actions.vanish_instance, self.stack, rng, self.effects)
        elif event.kind == "spot-interruption":
            await actions.spot_interruption(
                self.stack, self.sqs, self.queue_url, rng, self.effects, actions.SPOT_RECLAIM_AFTER
            )
        elif event.kind == "churn":
            actions.churn(self.stack, rng, self.effects)
        elif event.kind == "drift-nodepool":
            actions.drift_nodepool(self.stack, rng, self.effects)
        elif event.kind in PERMANENT_FAULTS:
            fault = PERMANENT_FAULTS[event.kind](self.stack, self.effects)
            self.permanent.append(fault)
            # Started and held in a task of its own: finding its target may take a while.
            self.effects.pending.append(asyncio.create_task(self._hold(fault, rng), name=event.kind))

    async def _hold(self, fault: PermanentFault, rng: random.Random) -> None:
        """A permanent fault for its hold (wall seconds from its generator), unless the phase ends first."""
        hold = rng.uniform(15.0, 35.0) if isinstance(fault, EvictionsDenied) else rng.uniform(25.0, 45.0)
        if await fault.start(rng):
            await asyncio.sleep(hold)
            fault.lift()

    async def _restart(self, name: str, after: float) -> None:
        await asyncio.sleep(after)
        assert self.workers is not None
        if name == PRIMARY or self.second_wanted:
            self.workers.start(name)
        self.restarts.pop(name, None)

    def faults_off(self) -> None:
        assert self.faults is not None and self.workers is not None
        for fault in self.permanent:  # before the API faults are cleared: a rule counts what it fired
            fault.lift()
        self.faults.off()
        for task in self.restarts.values():
            task.cancel()
        self.restarts.clear()
        self.second_wanted = False
        self.workers.stop(SECOND)
        self._check_workers()
        self.workers.start(PRIMARY)

    # -- convergence ---------------------------------------------------------------------------------

    async def unsettled(self) -> list[str]:
        """What keeps the cluster from having converged now (empty: converged)."""
        assert self.stack is not None and self.client is not None
        problems: list[str] = []
        status = await self.controller_status()
        if status is None:
            problems.append("the controller does not answer")
        elif not status.quiet:
            problems.append(
                "the controller is not quiet: "
                + "; ".join(
                    part
                    for part in (
                        f"started {status.started}" if status.started else "",
                        f"in flight {status.in_flight}" if status.in_flight else "",
                        f"validating {status.validating}" if status.validating else "",
                        f"waiting {len(status.waiting)}" if status.waiting else "",
                        f"error {status.error}" if status.error else "",
                        f"cleaned {status.cleaned_taints}" if status.cleaned_taints else "",
                    )
                    if part
                )
            )
        try:
            running = [
                e.id
                async for e in self.client.list_workflows(
                    "ExecutionStatus = 'Running' AND WorkflowType != 'ControllerWorkflow'"
                )
            ]
        except Exception as err:
            running = [f"(visibility: {err})"]
        if running:
            problems.append(f"{len(running)} workflow(s) running: {', '.join(running[:5])}")
        nodes = self.stack.store.list("nodes").items
        tainted = [n["metadata"]["name"] for n in nodes if actions._tainted(n)]
        if tainted:
            problems.append(f"disrupted taint on {', '.join(tainted)}")
        referenced = {actions._instance_of(n) for n in nodes}
        instances = await asyncio.to_thread(actions._instances, self.stack)
        leaked = sorted(i["InstanceId"] for i in instances if i["InstanceId"] not in referenced)
        if leaked:
            problems.append(f"instances without a node: {', '.join(leaked)}")
        live = {i["InstanceId"] for i in instances}
        orphans = [n["metadata"]["name"] for n in nodes if actions._instance_of(n) not in live]
        if orphans:
            problems.append(f"nodes without an instance: {', '.join(orphans)}")
        if self.config.karpenter:
            # Beside Karpenter a NodeClaim is its node's record: none may be left deleting or nodeless.
            claims = self.stack.store.list("nodeclaims").items
            named = {n["metadata"]["name"] for n in nodes}
            stuck = sorted(
                c["metadata"]["name"]
                for c in claims
                if c["metadata"].get("deletionTimestamp")
                or (c.get("status") or {}).get("nodeName") not in named
            )
            if stuck:
                problems.append(f"NodeClaims deleting or without their node: {', '.join(stuck)}")
        return problems

    async def converge(self) -> None:
        c = self.config
        began = time.monotonic()
        calm, problems, shown = 0, ["not checked yet"], began
        while time.monotonic() - began < c.converge_within:
            problems = await self.unsettled()
            calm = 0 if problems else calm + 1
            if problems and time.monotonic() - shown >= 10:
                shown = time.monotonic()
                self.say(f"  {shown - began:4.0f}s not converged: {'; '.join(problems)}")
            if calm >= 3:
                self.report.converged = True
                self.report.converge_seconds = round(time.monotonic() - began, 1)
                return
            self._check_workers()
            await asyncio.sleep(1.0)
        self.report.not_converged = problems

    # -- the verdict -----------------------------------------------------------------------------------

    async def judge(self) -> None:
        assert self.stack is not None and self.faults is not None
        in_flight = await self.in_flight.refresh()
        report = await asyncio.to_thread(
            self.stack.check_invariants, sorted(in_flight or ()), end_of_window=self.report.converged
        )
        counts = dict.fromkeys(INVARIANTS, 0)
        for violation in report.violations:
            counts[violation.invariant] += 1
        self.report.violations = [f"{v.invariant}: {v.subject}: {v.message}" for v in report.violations]
        self.report.observed = dict(report.observed)
        self.report.commands = await self.commands()
        for fault in self.permanent:
            findings = fault.findings(self.report.commands.failures)
            self.report.violations += findings
            self.report.permanent_faults += [*fault.notes(), *findings]
            counts[PERMANENT_INVARIANT] += len(findings)
        self.report.invariants = counts
        faults = Counter(self.faults.counts())
        faults.update(self.effects.counts)
        self.report.faults = {kind: n for kind, n in faults.items() if n}
        status = await self.controller_status()
        self.report.controller_passes = status.passes if status is not None else 0
        assert self.client is not None
        self.report.controller_runs = len(
            [
                e
                async for e in self.client.list_workflows(
                    f"WorkflowId = '{controller_workflow_id(self.cluster)}'"
                )
            ]
        )

    async def commands(self) -> CommandCounts:
        assert self.client is not None
        counts = CommandCounts()
        reasons: Counter[str] = Counter()
        terminations: Counter[str] = Counter()
        async for execution in self.client.list_workflows("WorkflowType = 'TerminationWorkflow'"):
            terminations[_status_name(execution.status)] += 1
            if execution.status == WorkflowExecutionStatus.FAILED:
                counts.failures.append(f"{execution.id}: {await self._cause(execution)}")
        async for execution in self.client.list_workflows("WorkflowType = 'DisruptionWorkflow'"):
            counts.started += 1
            reasons[execution.typed_search_attributes.get(sa.REASON) or "?"] += 1
            if execution.id.startswith("interruption/"):
                counts.interruptions += 1
            status = execution.status
            if status == WorkflowExecutionStatus.COMPLETED:
                counts.completed += 1
            elif status == WorkflowExecutionStatus.FAILED:
                cause = await self._cause(execution)
                if "rolled back" in cause:
                    counts.rolled_back += 1
                else:
                    counts.failed += 1
                    counts.failures.append(f"{execution.id}: {cause}")
            elif status == WorkflowExecutionStatus.CANCELED:
                counts.canceled += 1
            elif status == WorkflowExecutionStatus.TERMINATED:
                counts.terminated += 1
            elif status == WorkflowExecutionStatus.RUNNING:
                counts.running += 1
        counts.by_reason = dict(reasons)
        counts.terminations = dict(terminations)
        return counts

    async def _cause(self, execution: Any) -> str:
        assert self.client is not None
        handle = self.client.get_workflow_handle(execution.id, run_id=execution.run_id)
        try:
            await handle.result()
        except Exception as err:
            while getattr(err, "cause", None) is not None:
                err = err.cause  # type: ignore[assignment]
            return " ".join(str(err).split())[:300]
        return "completed"


async def run_chaos(config: ChaosConfig, say: Callable[[str], None] = print) -> ChaosReport:
    run = ChaosRun(config, say)
    failed = True
    # What the harness and the simulator (its controllers, the simulated Karpenter) log, beside the
    # workers' logs: a failed run is read from these.
    (run.state_dir / "logs").mkdir(exist_ok=True)
    sim_log = logging.FileHandler(run.state_dir / "logs" / "sim.log")
    sim_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    sim_logger = logging.getLogger("sim")
    sim_logger.addHandler(sim_log)
    if sim_logger.getEffectiveLevel() > logging.INFO:
        sim_logger.setLevel(logging.INFO)
    try:
        await run.start()
        await run.fault_phase()
        say(f"faults off after {run.report.fault_phase_seconds:.0f}s; waiting for the cluster to converge")
        run.faults_off()
        await run.converge()
        await run.judge()
        failed = not run.report.ok
    finally:
        await run.stop()
        sim_logger.removeHandler(sim_log)
        sim_log.close()
        if not failed and not config.keep_state and config.state_dir is None:
            shutil.rmtree(run.state_dir, ignore_errors=True)
    for line in run.report.lines():
        say(line)
    return run.report


def _status_name(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower() if status is not None else "unknown"


def _pairs(counts: Counter[str]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
