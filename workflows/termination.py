"""TerminationWorkflow: take one node out of the cluster gracefully, then end its instance.

Workflow id `termination/<cluster>/<node>/<uid>` (api/workflow_ids.py). Started by a disruption (as
a child), by interruption, and by a person (`kubectl delete node`, through the node-deletion
watcher), all with that id. It is pinned to one node: the UID given, else the one found at the
start; every step acts on that node only, so a node that reuses the name later (EKS names nodes by
their private IP) is never drained, tainted or released by it. The runbook (karpenter-behavior.md §5):

0. Begin: make sure the node is deleting, with the `karpenter.sh/termination` finalizer on it. If
   the node is NotReady and its instance is already gone, just release the finalizer.
0b. Wait for the operator's controls (behind the `termination-waits-for-controls` patch): a node
   its command does not already hold (`kubectl delete node`, a termination started by hand) waits
   while a MaintenanceWindow blocks its action, and until its NodeDisruptionBudgets have room, which
   it claims (activity `termination_gate`; the node gets an Event saying why it waits). A durable
   timer loop, 5 s doubling to 1 min; after `GATE_WAITS_PER_RUN` waits the run continues as new,
   so a wait of days keeps its history small. Interruption and NodePool deletion never wait.
   When the gate opens the drain may begin, and the gate stamps the deadline: now +
   terminationGracePeriod, or an earlier annotation or hard deadline (issue 30: Karpenter counts
   from the deletion, but karpflow's gate is its own, and a wait must not spend the drain's grace
   period). Runs of the older code, and older histories, stamped it in step 0 (deletion time +
   terminationGracePeriod).
1. Taint `karpenter.sh/disrupted:NoSchedule`, label exclude-from-external-load-balancers; a node no
   command holds records this termination as its holder, with its reason.
2. Drain in four tiers through the Eviction API (one heartbeating activity; PDBs respected until
   the deadline, then pods are deleted so their own grace ends by it).
3. Wait for the volumes of drained pods to detach (skipped once the deadline has passed).
4. Terminate the instance, only if this cluster owns it.
5. Remove the finalizer: the API server then deletes the node.

History (issue 21, behind `termination-lean-history`): the short steps (0, 0b's question, 1, the
first look at the volumes, 5, and the NotReady instance check) are local activities, a marker each
in the workflow task that runs them; the drain, a volume wait, the instance and Karpenter's drain
are regular activities (long, heartbeating). Phase goes to visibility only when the workflow is about
to wait in it, or ends; the status query shows every phase. A plain termination is 27 events
(32 when started by hand without a UID: its begin_termination stays regular, see run()).

Beside Karpenter (--karpenter-coexistence), a node that Karpenter's own termination controller acts
on (it carries Karpenter's NodeClass label) is handed to Karpenter in step 0 instead: its NodeClaim is
deleted with karpflow's deadline stamped on it, and the workflow waits while Karpenter drains the node
(Eviction API, PDBs) and terminates its instance; then it checks the instance is gone. Exactly one
controller drains each node (activities/nodeclaims.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.ec2 import GONE_STATES, EC2Activities
    from activities.kubernetes import KubernetesActivities
    from activities.nodeclaims import NodeClaimActivities
    from api import search_attributes as sa
    from api.activity_io import (
        BeginTerminationRequest,
        DrainRequest,
        HandoverWait,
        InstanceRequest,
        NodeInfo,
        NodeRef,
        TerminationGateRequest,
        VolumeRequest,
    )
    from api.event_reasons import Reason
    from api.notifications import Notification
    from api.workflow_io import (
        InvalidInput,
        TerminationInput,
        TerminationPhase,
        TerminationStatus,
        TerminationTimeouts,
        parse_input,
    )
    from api.workflow_summaries import short_node
    from workflows.events import record_event
    from workflows.failures import WORKFLOW_BUGS, describe, is_bad_deploy
    from workflows.options import API_CALL, API_RETRY, DRAIN_RETRY, INSTANCE_TERMINATE_HEARTBEAT
    from workflows.workflow_metrics import record_phase

from workflows.notify import notify

# workflow.patched ids (docs/workflow-changes.md): keep each until no workflow started before it runs.
PATCH_FAILURE_EVENT = "termination-failure-event"
PATCH_KARPENTER_HANDOVER = "karpenter-coexistence-handover"
PATCH_CONTROLS_GATE = "termination-waits-for-controls"
# Short steps as local activities (a marker each, no workflow task of their own), Phase upserted only
# before a wait, the NodePool folded into that upsert. Taken at the start of a run: a run begun on the
# older code keeps its command sequence to the end.
PATCH_LEAN_HISTORY = "termination-lean-history"
# Issue 30: a cancel that comes while a failure's Event is recorded leaves the run Failed (asked then).
PATCH_FAILED_THROUGH_CANCEL = "termination-failure-through-cancel"
# Issue 35: a drain still going after TerminationTimeouts.drain_stuck is reported to the operator's
# webhook (a timer beside the drain; asked once the drain started).
PATCH_NOTIFY_DRAIN_STUCK = "termination-notify-drain-stuck"
Result = TypeVar("Result")
GATE_FIRST_WAIT = timedelta(seconds=5)
GATE_LONGEST_WAIT = timedelta(minutes=1)
# About 8 history events a wait: a run continues as new after this many (some 16 h at a minute each).
GATE_WAITS_PER_RUN = 1000


# A bug in this code fails the run, as a failed step does (with its FailedTermination Event, once its
# first step ran): the node-deletion watcher starts a failed termination again while its node is
# deleting (30 s doubling to 10 min), so a deploy of fixed code takes it over. A NondeterminismError
# only fails the workflow task (docs/workflow-changes.md, "When a workflow fails").
@workflow.defn(name="TerminationWorkflow", failure_exception_types=WORKFLOW_BUGS)
class TerminationWorkflow:
    # Every activity it calls and every child it starts, in runbook order: the fault matrix's cells
    # (tests/unit/workflows/test_fault_matrix.py checks the lists against this module's code).
    ACTIVITIES: ClassVar[tuple[str, ...]] = (
        "begin_termination",
        "await_karpenter_termination",
        "describe_instance",
        "termination_gate",
        "taint_for_termination",
        "drain_node",
        "await_volumes_detached",
        "terminate_instance",
        "remove_finalizer",
        "record_event",
    )
    CHILDREN: ClassVar[tuple[str, ...]] = ("NotificationWorkflow",)

    def __init__(self) -> None:
        self._status = TerminationStatus()
        self._phase_started: datetime | None = None  # for the phase durations (workflow_metrics)
        self._lean = False  # PATCH_LEAN_HISTORY, decided at the start of the run
        # Lean: search attributes that wait for the next Phase upsert (one event for all of them).
        self._unsent: list[SearchAttributeUpdate[Any]] = []

    @workflow.query
    def status(self) -> TerminationStatus:
        return self._status

    @workflow.query
    def phase(self) -> str:
        return self._status.phase

    @workflow.run
    async def run(self, raw: Any = None) -> TerminationStatus:
        # None by default: a start without --input fails the workflow with a message (see
        # DisruptionWorkflow.run) instead of failing its workflow task forever.
        request = self._validate(raw)
        timeouts = request.timeouts
        self._status.node, self._status.reason = request.node, request.reason
        self._phase_started = workflow.now()
        short = short_node(request.node)
        started_with: list[SearchAttributeUpdate[Any]] = [
            sa.NODES.value_set([request.node]),
            sa.REASON.value_set(request.reason),
        ]
        self._lean = workflow.patched(PATCH_LEAN_HISTORY)
        if self._lean:
            # Its starter set Nodes and Reason already (api/search_attributes.py `at_start`); they are
            # upserted again with the first wait's Phase, for a run started by hand without them.
            self._unsent = started_with
        else:
            workflow.upsert_search_attributes([*started_with, sa.PHASE.value_set("Starting")])
        try:
            # 0. The node is deleting, holds the finalizer, and its deadline is written down.
            # Unpinned (a start by hand with a name), it stays a regular activity: it tells a wrong
            # name from a node its own earlier attempt deleted by its attempt number, and a local
            # activity run again after a workflow task timeout starts again from attempt 1.
            node = await self._short_step(
                KubernetesActivities.begin_termination,
                BeginTerminationRequest(
                    node=request.node,
                    uid=request.uid,
                    reason=request.reason,
                    provider_id=request.provider_id,
                    termination_grace_period=request.termination_grace_period,
                    deadline=request.deadline,
                    # The lean path asks the gate, which stamps the deadline once the drain may begin.
                    defer_deadline=self._lean,
                ),
                summary=f"delete {short} ({request.reason})"
                + ("" if self._lean else " and stamp its deadline"),
                local=bool(request.uid),
            )
            self._record(node)
            # From here every step names the node with the UID it is pinned to.
            target = NodeRef(node=request.node, uid=node.uid)
            if not node.found:
                return await self._node_already_gone(node, timeouts.instance_terminate)
            if node.handed_over and (self._lean or workflow.patched(PATCH_KARPENTER_HANDOVER)):
                return await self._handed_to_karpenter(target, node, timeouts)
            if await self._instance_already_gone(node):
                await self._remove_finalizer(target)
                return self._finish("instance already gone; finalizer released without draining")

            # 0b. MaintenanceWindows and NodeDisruptionBudgets, for what no command checked already.
            # (The lean path includes the older patches' steps without paying their markers.)
            if self._lean or workflow.patched(PATCH_CONTROLS_GATE):
                opened = await self._wait_for_controls(request, target)
                if opened is not None:  # the clock started when the gate opened (issue 30)
                    node = node.model_copy(update={"deadline": opened})
                    self._status.deadline = opened

            # 1. Nothing new lands here; load balancers let go.
            self._set_phase("Tainting")
            await self._short_step(
                KubernetesActivities.taint_for_termination,
                target.model_copy(update={"holder": self._holder(), "reason": request.reason}),
                summary=f"taint {short}, exclude it from load balancers",
            )

            # 2. Drain: one long activity that heartbeats, so the history stays small however long it takes.
            self._set_phase("Draining", waits=True)
            drain = workflow.start_activity_method(
                KubernetesActivities.drain_node,
                DrainRequest(node=request.node, uid=node.uid, reason=request.reason, deadline=node.deadline),
                start_to_close_timeout=timeouts.drain_attempt,
                heartbeat_timeout=timeouts.heartbeat,
                retry_policy=DRAIN_RETRY,
                summary=f"drain {short}" + (f": {_pods(node.pods)} left" if node.pods is not None else ""),
            )
            if (
                request.notify
                and timeouts.drain_stuck is not None
                and workflow.patched(PATCH_NOTIFY_DRAIN_STUCK)
            ):
                await self._notify_if_stuck(drain, timeouts.drain_stuck, request)
            drained = await drain
            self._status.pods_evicted, self._status.pods_deleted = drained.evicted, drained.deleted

            # 3. Volumes of drained pods detach before the instance goes, unless the deadline is past.
            if node.deadline is None or workflow.now() < node.deadline:
                await self._await_volumes(target, node, timeouts)

            # 4. The instance, if this cluster owns it (checked in the activity; refusal is final).
            if node.instance_id:
                await self._terminate_instance(node, timeouts.instance_terminate)

            # 5. Let the API server delete the node.
            await self._remove_finalizer(target)
        except BaseException as err:
            if isinstance(err, workflow.ContinueAsNewError | GeneratorExit) or is_bad_deploy(err):
                # A long wait for the operator controls goes on in a new run; a run evicted from the
                # worker's cache is not over; a bad deploy retries its workflow task until fixed.
                raise
            failure = self._fail(err)
            if failure is None:
                raise  # cancelled
            if self._lean or workflow.patched(PATCH_FAILURE_EVENT):
                try:
                    await record_event(
                        "Node",
                        request.node,
                        Reason.FAILED_TERMINATION,
                        self._status.message,
                        uid=self._status.uid or request.uid,
                    )
                except BaseException as cancel:
                    # A cancel while the failure is recorded changes nothing: the termination had failed,
                    # and closes Failed, as its status says (the older code closed it Canceled).
                    if not (is_cancelled_exception(cancel) and workflow.patched(PATCH_FAILED_THROUGH_CANCEL)):
                        raise
                # The failure quotes its cause: "Activity task failed" alone says nothing.
                raise failure from err
            raise
        summary = f"drained ({drained.evicted} evicted, {drained.deleted} deleted at the deadline)"
        return self._finish(f"{summary}; {drained.message}" if drained.message else summary)

    # -- steps ------------------------------------------------------------------------------------

    async def _notify_if_stuck(
        self, drain: workflow.ActivityHandle[Any], after: timedelta, request: TerminationInput
    ) -> None:
        """Once the drain has gone on for `after`, tell the operator's webhook (once; the drain goes on)."""
        try:
            await workflow.wait_condition(drain.done, timeout=after, timeout_summary="drain stuck?")
        except TimeoutError:
            minutes = int(after.total_seconds() // 60)
            await notify(
                Notification(
                    event="DrainStuck",
                    workflow_id=workflow.info().workflow_id,
                    text=(
                        f"the drain of {request.node} ({request.reason}) has gone on for {minutes} min: "
                        f"{self._status.message or 'pods are still on it'} (`karpflow status`)"
                    ),
                    nodes=[request.node],
                    details={"reason": request.reason, "command": request.command_id or ""},
                )
            )

    @staticmethod
    def _holder() -> str:
        info = workflow.info()
        return f"{info.workflow_id}@{info.first_execution_run_id}"

    async def _wait_for_controls(self, request: TerminationInput, target: NodeRef) -> datetime | None:
        """Wait until the gate lets the node go; the drain deadline it stamped then (None: none, or a
        run of the older activity, whose begin_termination stamped it). The drain's clock starts when
        the gate opens, not at the deletion: a wait for a window or a budget is not drain time, and a
        deadline it pushed into the past would delete every pod at once (docs/workflow-changes.md,
        "When the drain's clock starts"). A hard deadline (the input's) is never postponed."""
        gate_request = TerminationGateRequest(
            node=target.node,
            uid=target.uid,
            reason=request.reason,
            holder=self._holder(),
            command_id=request.command_id,
            stamp_deadline=self._lean,
            termination_grace_period=request.termination_grace_period,
            deadline=request.deadline,
        )
        delay = GATE_FIRST_WAIT
        for _ in range(GATE_WAITS_PER_RUN):
            gate = await self._short_step(
                KubernetesActivities.termination_gate,
                gate_request,
                summary=f"may {short_node(target.node)} go? (maintenance windows, disruption budgets)",
            )
            if gate.go:
                self._status.waiting_for = ""
                return gate.deadline
            if self._status.phase != "Waiting" or self._status.waiting_for != gate.waiting_for:
                workflow.logger.info("node %s waits: %s", target.node, gate.message)
            self._status.waiting_for, self._status.message = gate.waiting_for, gate.message
            if self._status.phase != "Waiting":
                self._set_phase("Waiting", waits=True)
            await workflow.sleep(delay)
            delay = min(delay * 2, GATE_LONGEST_WAIT)
        # Still waiting: the same termination, pinned to the same node, in a fresh history.
        workflow.continue_as_new(request.model_copy(update={"uid": target.uid}))

    async def _node_already_gone(self, node: NodeInfo, limit: timedelta) -> TerminationStatus:
        gone = f"node already gone ({node.message})" if node.message else "node already gone"
        if node.instance_id:
            await self._terminate_instance(node, limit)
            return self._finish(f"{gone}; its instance is terminated")
        return self._finish(gone)

    async def _handed_to_karpenter(
        self, target: NodeRef, node: NodeInfo, timeouts: TerminationTimeouts
    ) -> TerminationStatus:
        """Karpenter drains the node and terminates its instance; wait for it, then make sure the
        instance is gone (it is, when Karpenter had a NodeClaim for it; a node without one is
        drained by Karpenter but its instance is left, and ended here)."""
        self._set_phase("WaitingForKarpenter", waits=True)
        done = await workflow.execute_activity_method(
            NodeClaimActivities.await_karpenter_termination,
            HandoverWait(node=target.node, uid=target.uid, nodeclaim=node.nodeclaim),
            start_to_close_timeout=timeouts.drain_attempt,
            heartbeat_timeout=timeouts.heartbeat,
            retry_policy=DRAIN_RETRY,
        )
        if node.instance_id:
            await self._terminate_instance(node, timeouts.instance_terminate)
        return self._finish(f"handed to Karpenter: {done}")

    async def _instance_already_gone(self, node: NodeInfo) -> bool:
        """Step 0 (Karpenter): a NotReady node whose instance EC2 no longer has needs no drain. While the
        node is Ready its kubelet is alive, so EC2 saying "not found" is not trusted."""
        if node.ready or not node.instance_id:
            return False
        state = await self._short_step(
            EC2Activities.describe_instance,
            InstanceRequest(instance_id=node.instance_id, node=node.node),
            summary=f"is {node.instance_id} of NotReady {short_node(node.node)} still there?",
        )
        return not state.found or state.state in GONE_STATES

    async def _await_volumes(self, target: NodeRef, node: NodeInfo, timeouts: TerminationTimeouts) -> None:
        name = target.node
        self._set_phase("WaitingForVolumes")
        request = VolumeRequest(node=name, uid=target.uid, deadline=node.deadline)
        if self._lean:
            # Most nodes have nothing attached by now: one look, and a wait only when something is.
            look = request.model_copy(update={"wait": False})
            summary = f"are the volumes of {short_node(name)} detached?"
            if await self._short_step(KubernetesActivities.await_volumes_detached, look, summary=summary):
                return
            self._set_phase("WaitingForVolumes", waits=True)
        try:
            await workflow.execute_activity_method(
                KubernetesActivities.await_volumes_detached,
                request,
                schedule_to_close_timeout=timeouts.volume_detach,
                heartbeat_timeout=timeouts.heartbeat,
                retry_policy=API_RETRY,
                summary=f"wait for the volumes of {short_node(name)} to detach",
            )
        except ActivityError as err:
            # Volumes that never detach must not keep an instance (and its bill) forever.
            if not isinstance(err.cause, TemporalTimeoutError):
                raise
            workflow.logger.warning(
                "node %s: volumes still attached after %s; terminating anyway", name, timeouts.volume_detach
            )

    async def _terminate_instance(self, node: NodeInfo, limit: timedelta) -> None:
        self._set_phase("TerminatingInstance", waits=True)
        await workflow.execute_activity_method(
            EC2Activities.terminate_instance,
            InstanceRequest(instance_id=node.instance_id or "", node=node.node),
            start_to_close_timeout=limit,
            heartbeat_timeout=INSTANCE_TERMINATE_HEARTBEAT,
            retry_policy=API_RETRY,
            summary=f"terminate instance {node.instance_id} of {short_node(node.node)}",
        )

    async def _remove_finalizer(self, node: NodeRef) -> None:
        self._set_phase("RemovingFinalizer")
        await self._short_step(
            KubernetesActivities.remove_finalizer,
            node,
            summary=f"remove the finalizer of {short_node(node.node)}",
        )

    async def _short_step(
        self, step: Callable[[Any, Any], Awaitable[Result]], arg: Any, summary: str, local: bool = True
    ) -> Result:
        """A short Kubernetes or EC2 call (seconds): on the lean path a local activity, which costs one
        marker and no workflow task of its own; before it, a regular activity (the older histories)."""
        if self._lean and local:
            return await workflow.execute_local_activity_method(
                step, arg, start_to_close_timeout=API_CALL, retry_policy=API_RETRY, summary=summary
            )
        return await workflow.execute_activity_method(
            step, arg, start_to_close_timeout=API_CALL, retry_policy=API_RETRY, summary=summary
        )

    # -- bookkeeping ------------------------------------------------------------------------------

    def _validate(self, raw: Any) -> TerminationInput:
        try:
            return parse_input(TerminationInput, raw)
        except InvalidInput as err:
            raise ApplicationError(str(err), type="InvalidInput", non_retryable=True) from None

    def _record(self, node: NodeInfo) -> None:
        self._status.uid = node.uid
        self._status.instance_id = node.instance_id
        self._status.deadline = node.deadline
        if node.nodepool:
            if self._lean:
                self._unsent.append(sa.NODEPOOL.value_set(node.nodepool))
            else:
                workflow.upsert_search_attributes([sa.NODEPOOL.value_set(node.nodepool)])

    def _set_phase(self, phase: TerminationPhase, *, waits: bool = False) -> None:
        """The status query shows every phase. Visibility (operators list workflows by Phase) gets it
        when the workflow is about to wait in it, or ends in it (lean path: one event, with what else
        is unsent); the older path upserts every phase."""
        if not (self._lean and phase == self._status.phase):  # lean: a look, then a wait, is one phase
            # The phase that ends now, timed (metrics only: nothing in the history).
            now = workflow.now()
            if self._phase_started is not None:
                record_phase(self._status.phase, now - self._phase_started)
            self._phase_started = now
            self._status.phase = phase
        if not self._lean:
            workflow.upsert_search_attributes([sa.PHASE.value_set(phase)])
        elif waits or phase in ("Succeeded", "Failed", "Canceled"):
            workflow.upsert_search_attributes([*self._unsent, sa.PHASE.value_set(phase)])
            self._unsent = []

    def _finish(self, message: str) -> TerminationStatus:
        self._status.message = message
        self._set_phase("Succeeded")
        workflow.logger.info("node %s terminated: %s", self._status.node, message)
        return self._status

    def _fail(self, err: BaseException) -> ApplicationError | None:
        """Record the end in the status; the failure to raise (None for a cancellation)."""
        if is_cancelled_exception(err):
            self._status.message = (
                f"canceled while {self._status.phase}; the node stays deleting with its finalizer"
            )
            self._set_phase("Canceled")
            return None
        self._status.message = f"{self._status.phase}: {describe(err)}"
        self._set_phase("Failed")
        return ApplicationError(self._status.message, type="TerminationFailed", non_retryable=True)


def _pods(count: int) -> str:
    return f"{count} pod{'' if count == 1 else 's'}"
