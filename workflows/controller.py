"""ControllerWorkflow: the loop that turns plans into disruptions, one per cluster.

Workflow id `karpflow-controller/<cluster>`; every worker starts it idempotently at start-up. A pass
(every `interval_seconds`, default 10 s) is:

  observe   running Disruption/Termination workflows (visibility, plus describe of those it started)
  plan      on the worker's informer cache; in-flight nodes are no candidates and count against budgets
  validate  consolidation commands wait on a durable timer (default 15 s) and are re-planned on a
            fresh view; forceful ones (Expired, Unhealthy, NodePoolDeleted ...) start at once, no budget
  start     a DisruptionWorkflow per command, id `disruption/<pools>/<reason>/<hash>`: an id already
            started is success, so a replayed or restarted pass never starts one twice

At start-up (once per controller run, not per continue-as-new) nodes carrying `karpenter.sh/disrupted`
that belong to no running workflow are untainted (Karpenter's crash cleanup). A command that fails
backs its NodePool off for that reason: 1 min doubling to 10 min, with jitter from workflow.random().

History: a pass adds about 10 to 20 events (4 to 6 activities at 3 events each, a timer at 2, plus the
validation timer when a consolidation is pending); the workflow continues as new once its history holds
`max_history_events` (default 1,000) events, i.e. every 50 to 100 passes, carrying its state over.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.kubernetes import KubernetesActivities
    from activities.planning import PlanningActivities
    from api.activity_io import UntaintRequest
    from api.controller_io import (
        QUERY_STATUS,
        SIGNAL_OFFERING_UNAVAILABLE,
        ControllerInput,
        ControllerStatus,
        InFlightInput,
        InFlightOutput,
        OfferingUnavailable,
        PassInput,
        PassOutput,
        PlannedCommand,
        PoolBackoff,
        StartedCommand,
        ValidateInput,
    )

_CALL = {
    "start_to_close_timeout": timedelta(minutes=2),
    "retry_policy": RetryPolicy(maximum_interval=timedelta(seconds=10), maximum_attempts=5),
}


@workflow.defn(name="ControllerWorkflow")
class ControllerWorkflow:
    def __init__(self) -> None:
        self.input: ControllerInput | None = None
        self.status_ = ControllerStatus(cluster="")
        self.in_flight_nodes: set[str] = set()

    # -- signals and queries --------------------------------------------------------------------------

    @workflow.signal(name=SIGNAL_OFFERING_UNAVAILABLE)
    def offering_unavailable(self, offering: OfferingUnavailable) -> None:
        assert self.input is not None
        kept = [u for u in self.input.unavailable if u.key != offering.key]
        self.input.unavailable = [*kept, offering]

    @workflow.query(name=QUERY_STATUS)
    def status(self) -> ControllerStatus:
        if self.input is not None:
            now = workflow.now()
            self.status_.backoffs = [b for b in self.input.backoffs.values() if b.until > now]
            self.status_.unavailable = [u for u in self.input.unavailable if u.until > now]
        return self.status_

    # -- the loop -------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, request: ControllerInput) -> None:
        self.input = request
        self.status_ = ControllerStatus(cluster=request.cluster, passes=request.passes)
        while True:
            await self._pass()
            if workflow.info().get_current_history_length() >= request.max_history_events:
                break
            await workflow.sleep(timedelta(seconds=request.interval_seconds))
        request.first_run = False
        request.passes = self.status_.passes
        now = workflow.now()
        request.unavailable = [u for u in request.unavailable if u.until > now]
        workflow.continue_as_new(request)

    async def _observe(self) -> InFlightOutput:
        assert self.input is not None
        observed: InFlightOutput = await workflow.execute_activity_method(
            PlanningActivities.in_flight, InFlightInput(track=sorted(self.input.started)), **_CALL
        )
        for workflow_id in observed.failed:
            command = self.input.started.pop(workflow_id, None)
            if command is not None:
                self._back_off(command)
        for workflow_id in observed.closed:
            command = self.input.started.pop(workflow_id, None)
            if command is not None:
                for pool in command.nodepools:
                    self.input.backoffs.pop(f"{pool}/{command.reason}", None)
        self.in_flight_nodes = {n for wf in observed.running for n in wf.nodes}
        # A command just started may not show its nodes yet: count them from what we started.
        running_ids = {wf.workflow_id for wf in observed.running}
        for workflow_id, command in self.input.started.items():
            if workflow_id in running_ids or workflow_id not in observed.closed:
                self.in_flight_nodes.update(command.nodes)
        self.status_.in_flight = observed.running
        return observed

    def _back_off(self, command: StartedCommand) -> None:
        assert self.input is not None
        now = workflow.now()
        for pool in command.nodepools:
            key = f"{pool}/{command.reason}"
            previous = self.input.backoffs.get(key)
            failures = (previous.failures if previous else 0) + 1
            delay = min(self.input.backoff_min_seconds * 2 ** (failures - 1), self.input.backoff_max_seconds)
            delay *= 0.8 + 0.4 * workflow.random().random()  # jitter: ±20 %
            self.input.backoffs[key] = PoolBackoff(
                pool=pool, reason=command.reason, failures=failures, until=now + timedelta(seconds=delay)
            )
            workflow.logger.warning("nodepool %s backs off %s for %.0fs", pool, command.reason, delay)

    def _backed_off(self, command: PlannedCommand, now: datetime) -> bool:
        assert self.input is not None
        for pool in command.nodepools:
            backoff = self.input.backoffs.get(f"{pool}/{command.reason}")
            if backoff is not None and backoff.until > now:
                return True
        return False

    async def _pass(self) -> None:
        assert self.input is not None
        request = self.input
        started_at = workflow.now()
        observed = await self._observe()
        result: PassOutput = await workflow.execute_activity_method(
            PlanningActivities.plan_pass,
            PassInput(in_flight_nodes=sorted(self.in_flight_nodes), unavailable=request.unavailable),
            **_CALL,
        )
        self.status_.synced = result.synced
        if not result.synced:
            self.status_.quiet = False
            return
        if request.first_run and not self.status_.untainted:
            await self._crash_cleanup(result, observed)
        if result.annotations:
            await workflow.execute_activity_method(PlanningActivities.annotate, result.annotations, **_CALL)
        if result.events:
            await workflow.execute_activity_method(PlanningActivities.record_events, result.events, **_CALL)

        now = workflow.now()
        commands = [c for c in result.commands if c.forceful or not self._backed_off(c, now)]
        commands = [c for c in commands if not set(c.nodes) & self.in_flight_nodes]
        to_validate = [c for c in commands if c.needs_validation]
        started: list[str] = [await self._start(c) for c in commands if not c.needs_validation]
        if to_validate:
            self.status_.validating = [c.workflow_id for c in to_validate]
            await workflow.sleep(timedelta(seconds=request.validation_seconds))
            await self._observe()
            for command in to_validate:
                check = await workflow.execute_activity_method(
                    PlanningActivities.validate,
                    ValidateInput(command=command, in_flight_nodes=sorted(self.in_flight_nodes)),
                    **_CALL,
                )
                if check.valid and check.command is not None:
                    started.append(await self._start(check.command))
                else:
                    workflow.logger.info("command %s dropped: %s", command.workflow_id, check.reason)
            self.status_.validating = []

        self.status_.passes += 1
        self.status_.last_pass_at = started_at
        self.status_.last_pass_seconds = (workflow.now() - started_at).total_seconds()
        self.status_.commands = started
        self.status_.blocked = result.blocked
        self.status_.budgets = result.budgets
        self.status_.problems = result.problems
        self.status_.quiet = (
            not result.commands
            and not started
            and not self.status_.in_flight
            and not request.started
            and result.waiting == 0
        )

    async def _start(self, command: PlannedCommand) -> str:
        assert self.input is not None
        out = await workflow.execute_activity_method(PlanningActivities.start, command, **_CALL)
        self.input.started[out.workflow_id] = StartedCommand(
            workflow_id=out.workflow_id,
            nodepools=command.nodepools,
            reason=command.reason,
            nodes=command.nodes,
            started_at=workflow.now(),
        )
        self.in_flight_nodes.update(command.nodes)
        return out.workflow_id

    async def _crash_cleanup(self, result: PassOutput, observed: InFlightOutput) -> None:
        """Untaint nodes whose disrupted taint belongs to no running workflow (once per start)."""
        owned = {n for wf in observed.running for n in wf.nodes} | self.in_flight_nodes
        orphans = [n for n in result.tainted_nodes if n not in owned]
        if orphans:
            workflow.logger.info("crash cleanup: untainting %s", ", ".join(orphans))
            await workflow.execute_activity_method(
                KubernetesActivities.untaint_disrupted, UntaintRequest(nodes=orphans), **_CALL
            )
        self.status_.untainted = orphans or ["(none)"]
