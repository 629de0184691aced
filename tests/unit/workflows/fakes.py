"""In-memory stand-ins for karpflow's activities, registered under the real activity names.

Unit tests of the workflows fake the Kubernetes/EC2 boundary here (the integration tests use the
real activities against the emulator and moto). Every call is recorded, so a test can assert what
the workflow asked for and in which order.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import errors
from api.activity_io import (
    AmiChoice,
    BeginTerminationRequest,
    CandidateNode,
    DiscardRequest,
    DrainRequest,
    DrainResult,
    HandoverWait,
    InitializationRequest,
    InstanceRequest,
    InstanceState,
    LaunchedInstance,
    LaunchRequest,
    LaunchTemplate,
    NodeClaimDeletion,
    NodeClaimRequest,
    NodeClaimState,
    NodeClaimWait,
    NodeInfo,
    NodeRef,
    RegisteredNode,
    RegistrationRequest,
    ResolveRequest,
    TaintRequest,
    TerminationGate,
    TerminationGateRequest,
    UntaintRequest,
    VolumeRequest,
    WaitingCommandCheck,
    WaitingCommandVerdict,
)
from api.controller_io import (
    ControlsUpkeep,
    PassRequest,
    PassResult,
    PlannedCommand,
    ValidateRequest,
    Verdict,
)
from api.event_reasons import RecordEventRequest
from api.garbage_io import GarbageCollectionRequest, GarbageCollectionResult
from api.notifications import Notification, NotificationResult
from api.rollout_health_io import WaveHealth, WaveHealthRequest
from api.rollout_io import (
    MarkRequest,
    MarkWaveRequest,
    RemainingRequest,
    RolloutNode,
    StateAnswer,
    StateRequest,
    UnmarkRequest,
)
from api.workflow_io import Offering
from tests.unit.workflows.fault_injection import FaultInjector


class FakeCluster:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.termination_taints: list[NodeRef] = []  # what taint_for_termination was asked, as sent
        self.nodes: set[str] = set()
        self.deleting: set[str] = set()
        self.do_not_disrupt: set[str] = set()  # taint refused; untaint finds nothing to take off
        self.ice: set[str] = set()  # offering keys out of capacity
        self.never_registers = False
        self.never_initializes = False
        # Offering keys whose instances end before their node registers (EC2 takes them while they
        # boot): await_node_ready fails at once, as the real one does (`_refuse_if_instance_ended`).
        self.ends_before_registering: set[str] = set()
        self.not_owned: set[str] = set()  # instance ids terminate_instance refuses (their tag is gone)
        # A look again at an initialized replacement (`registered_node`) finds its node gone: EC2
        # reclaimed the new spot node before the drained pods landed on it.
        self.lose_initialized_replacements = False
        self.register_seconds = 0.0  # a replacement that takes this long to register
        self.wait_errors = 0  # await_node_ready attempts that fail on a passing API error (500) first
        self.instances: dict[str, LaunchedInstance] = {}  # live instances by id
        self.commands: dict[str, str] = {}  # instance id -> the command id it was launched for
        self.listing_lags = False  # EC2's tag index has not caught up: listings miss new instances
        self.fail_launch_of: set[int] = set()  # replacement indexes whose launch fails for good
        self.launch_seconds: dict[int, float] = {}  # a slow launch, per replacement index
        self.untaint_seconds = 0.0  # a slow untaint call, to cancel during the rollback
        self.terminate_seconds = 0.0  # a slow terminate_instance call, to cancel during the rollback
        self.terminated: list[str] = []
        self.termination_deadlines: dict[str, datetime | None] = {}  # node -> the deadline it was given
        self.node_ready = True
        self.instance_found = True
        self.owned = True
        self.refused_terminations: set[str] = set()  # instance ids whose terminate is refused (not owned)
        self.tgp: timedelta | None = None
        self.drain_blocks = False
        self.taint_seconds = 0.0  # a slow taint call, to cancel during it
        self.resolve_bug = False  # resolve_replacement raises an unexpected error on every attempt
        self.drain_failures = 0  # drain attempts that fail (retryable) before one succeeds
        self.planned: list[PlannedCommand] = []  # what the controller's next pass plans (once)
        self.pass_requests: list[PassRequest] = []
        self.visible: list[list[str]] = []  # what visibility lists as in flight, one entry per pass
        self.events: list[RecordEventRequest] = []  # what workflows recorded through record_event
        self.notifications: list[Notification] = []  # what workflows sent through send_notification
        self.pods_on: dict[str, int] = {}  # node -> pods its drain waits for (begin_termination says)
        self.requests: dict[str, list[Any]] = {}  # activity name -> the requests it got, in order
        # Beside Karpenter (--karpenter-coexistence): replacements are NodeClaims, terminations are
        # handed to Karpenter.
        self.karpenter_coexistence = False
        self.nodeclaims: dict[str, NodeClaimRequest] = {}  # created, by name
        self.deleted_nodeclaims: list[str] = []
        self.karpenter_gives_up = False  # Karpenter deletes the NodeClaim (no capacity)
        self.karpenter_never_initializes = False
        self.gate_waits = 0  # termination_gate answers "wait" this many times before "go"
        # check_waiting_command answers these in turn (the last one again); None: the check fails.
        # Empty: the plan holds and approval is still asked for.
        self.waiting_verdicts: list[WaitingCommandVerdict | None] = []
        self._ids = itertools.count(1)
        self.faults = FaultInjector()
        # What the activities leave in the cluster, for the fault matrix's "nothing left behind":
        self.taints: dict[str, str] = {}  # node -> the holder of its disrupted taint
        self.finalized: set[str] = set()  # nodes deleting, held by karpflow's finalizer
        self.removed: set[str] = set()  # nodes the API server removed once their finalizer went
        self.claims: dict[str, set[str]] = {}  # node -> holders of its NodeDisruptionBudget claims
        self.ready: set[str] = set()  # replacement instances (and NodeClaims) that initialized
        self.released: set[str] = set()  # replacement instances whose node was released
        self.clock: Callable[[], Awaitable[datetime]] | None = None  # the test server's time, if set
        self.deletion_times: dict[str, datetime] = {}  # node -> its deletionTimestamp
        self.deadline_annotations: dict[str, datetime] = {}  # node -> its termination deadline annotation
        self.drains: list[tuple[DrainRequest, datetime]] = []  # each drain's request, and when it began
        self.pass_extras: dict[str, Any] = {}  # what every controller pass finds besides its commands
        self.planned_every_pass: list[PlannedCommand] = []  # planned again by every pass
        self.commands_valid = True  # validate_commands' verdict
        self.volumes_attached_once = False  # the first look at a node's volumes finds one attached
        self.rollout_marks: dict[str, list[str | None]] = {}  # uid -> [name, the rollout marking it]
        self.rollout_replaces = False  # each poll finds one more marked node gone (replaced)
        # Waves (workflows/rollout_waves.py). The pool's nodes created after the request (the
        # replacements): in rollout_marks too, so a mark on them shows, but never the rollout's to list.
        self.rollout_new: set[str] = set()
        self.gate_fails = False  # check_wave_health answers Failed (the halted path); else Healthy
        self.rollout_target_moved = ""  # sync_rollout_state: the pool's new target (superseded)
        self.rollout_states: list[StateRequest] = []  # what sync_rollout_state was asked to write

    async def now(self) -> datetime:
        """The time as the workflows see it: on the time-skipping server, its clock (set `clock`)."""
        return await self.clock() if self.clock is not None else datetime.now(UTC)

    def leftovers(self, nodes: Iterable[str]) -> dict[str, list[str]]:
        """What these candidate nodes, and every replacement, still hold: kind -> what. A taint, a
        finalizer (the node deleting, its termination unfinished), a budget claim, an instance that
        nothing will terminate (a candidate's whose node is gone, a replacement that never became a
        node) or a NodeClaim that never initialized."""
        found: dict[str, list[str]] = {}
        for node in sorted(nodes):
            if node in self.taints:
                found.setdefault("taint", []).append(f"{node} (held by {self.taints[node]})")
            if node in self.finalized and node not in self.removed:
                found.setdefault("finalizer", []).append(node)
            if self.claims.get(node):
                found.setdefault("claim", []).append(f"{node} by {sorted(self.claims[node])}")
            if node in self.removed and f"i-{node}" not in self.terminated:
                found.setdefault("instance", []).append(f"i-{node} of removed node {node}")
        for instance_id in sorted(self.instances):
            if instance_id not in self.ready:
                found.setdefault("instance", []).append(f"replacement {instance_id} never initialized")
        for name in sorted(self.nodeclaims):
            if name not in self.deleted_nodeclaims and name not in self.ready:
                found.setdefault("nodeclaim", []).append(name)
        for name, mark in sorted(self.rollout_marks.values(), key=lambda entry: str(entry[0])):
            if mark is not None:
                found.setdefault("mark", []).append(f"{name} (by {mark})")
        last = self.rollout_states[-1] if self.rollout_states else None
        if last is not None and last.target and last.phase not in ROLLOUT_STATE_FINAL:
            # The NodePool's karpflow.dev/rollout-state still says the rollout runs: the planner holds
            # the pool's drift toward that target for it (planner/rollout_holds.py).
            found.setdefault("state", []).append(f"{last.nodepool}: {last.phase} (wave {last.wave})")
        return found

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def activities(self) -> list[Any]:
        return [
            self.taint_disrupted,
            self.untaint_disrupted,
            self.resolve_replacement,
            self.launch_instance,
            self.find_command_instances,
            self.await_node_registered,
            self.await_node_initialized,
            self.await_node_ready,
            self.release_node,
            self.begin_termination,
            self.termination_gate,
            self.taint_for_termination,
            self.drain_node,
            self.await_volumes_detached,
            self.describe_instance,
            self.terminate_instance,
            self.remove_finalizer,
            self.create_nodeclaim,
            self.await_nodeclaim,
            self.delete_nodeclaims,
            self.await_karpenter_termination,
            self.plan_pass,
            self.validate_commands,
            self.untaint_orphans,
            self.apply_annotations,
            self.collect_garbage,
            self.sync_nodepool_finalizers,
            self.sync_operator_controls,
            self.apply_taints,
            self.record_event,
            self.check_waiting_command,
            self.mark_rollout_nodes,
            self.rollout_remaining,
            self.unmark_rollout_nodes,
            self.mark_rollout_wave,
            self.check_wave_health,
            self.sync_rollout_state,
            self.send_notification,
        ]

    @activity.defn(name="send_notification")
    async def send_notification(self, notification: Notification) -> NotificationResult:
        await self.faults.enter("send_notification")
        self.notifications.append(notification)  # a message, not a change to the cluster
        return NotificationResult(sent=True, status=200)

    @activity.defn(name="record_event")
    async def record_event(self, request: RecordEventRequest) -> str:
        await self.faults.enter("record_event")
        self.calls.append(("record_event", request))
        self.events.append(request)
        return "created"

    # -- the controller -------------------------------------------------------------------------------

    @activity.defn(name="plan_pass")
    async def plan_pass(self, request: PassRequest) -> PassResult:
        await self.faults.enter("plan_pass")
        self.calls.append(("plan_pass", None))
        self.pass_requests.append(request)
        commands, self.planned = self.planned or list(self.planned_every_pass), []
        in_flight = self.visible.pop(0) if self.visible else []
        return PassResult(
            at=datetime.now(UTC),
            commands=commands,
            nodes=len(self.nodes),
            in_flight=in_flight,
            **self.pass_extras,
        )

    @activity.defn(name="validate_commands")
    async def validate_commands(self, request: ValidateRequest) -> list[Verdict]:
        await self.faults.enter("validate_commands")
        self.calls.append(("validate_commands", [c.workflow_id for c in request.commands]))
        return [
            Verdict(workflow_id=c.workflow_id, valid=True, command=c)
            if self.commands_valid
            else Verdict(workflow_id=c.workflow_id, valid=False, reason="no longer valid")
            for c in request.commands
        ]

    @activity.defn(name="sync_nodepool_finalizers")
    async def sync_nodepool_finalizers(self, changes: dict[str, bool]) -> int:
        await self.faults.enter("sync_nodepool_finalizers")
        self.calls.append(("sync_nodepool_finalizers", changes))
        return len(changes)

    @activity.defn(name="sync_operator_controls")
    async def sync_operator_controls(self, upkeep: ControlsUpkeep) -> int:
        await self.faults.enter("sync_operator_controls")
        self.calls.append(("sync_operator_controls", upkeep))
        return upkeep.stale_claims

    @activity.defn(name="apply_taints")
    async def apply_taints(self, changes: list[dict[str, Any]]) -> int:
        await self.faults.enter("apply_taints")
        self.calls.append(("apply_taints", changes))
        return len(changes)

    # -- `karpflow rollout` -----------------------------------------------------------------------

    @activity.defn(name="mark_rollout_nodes")
    async def mark_rollout_nodes(self, request: MarkRequest) -> list[RolloutNode]:
        await self.faults.enter("mark_rollout_nodes")
        self.calls.append(("mark_rollout_nodes", request.rollout_id))
        chosen = {u: entry for u, entry in self.rollout_marks.items() if u not in self.rollout_new}
        if request.mark:  # waves only list them: each wave marks its own (mark_rollout_wave)
            for entry in chosen.values():
                entry[1] = entry[1] or request.rollout_id
        return [RolloutNode(name=str(n), uid=u) for u, (n, _) in sorted(chosen.items())]

    @activity.defn(name="rollout_remaining")
    async def rollout_remaining(self, request: RemainingRequest) -> list[RolloutNode]:
        await self.faults.enter("rollout_remaining")
        self.calls.append(("rollout_remaining", len(request.nodes)))
        marks = self.rollout_marks.items()
        marked = sorted(u for u, (_, mark) in marks if mark and u not in self.rollout_new)
        if self.rollout_replaces and marked:
            # The planner replaced one marked node: it went, and its replacement came (unmarked).
            name, _ = self.rollout_marks.pop(marked[0])
            self.rollout_marks[f"uid-new-{name}"] = [f"new-{name}", None]
            self.rollout_new.add(f"uid-new-{name}")
        return [n for n in request.nodes if n.uid in self.rollout_marks]

    @activity.defn(name="unmark_rollout_nodes")
    async def unmark_rollout_nodes(self, request: UnmarkRequest) -> int:
        await self.faults.enter("unmark_rollout_nodes")
        self.calls.append(("unmark_rollout_nodes", request.rollout_id))
        changed = 0
        only = None if request.nodes is None else {n.uid for n in request.nodes}
        for uid, entry in self.rollout_marks.items():
            if entry[1] == request.rollout_id and (only is None or uid in only):
                entry[1], changed = None, changed + 1
        return changed

    @activity.defn(name="mark_rollout_wave")
    async def mark_rollout_wave(self, request: MarkWaveRequest) -> list[RolloutNode]:
        await self.faults.enter("mark_rollout_wave")
        self.calls.append(("mark_rollout_wave", [n.name for n in request.nodes]))
        present = []
        for node in request.nodes:
            entry = self.rollout_marks.get(node.uid)
            if entry is None:
                continue  # gone: nothing to mark, as the real one finds
            entry[1] = entry[1] or request.rollout_id
            present.append(node)
            activity.heartbeat(node.name)
        return present

    @activity.defn(name="check_wave_health")
    async def check_wave_health(self, request: WaveHealthRequest) -> WaveHealth:
        await self.faults.enter("check_wave_health")
        self.calls.append(("check_wave_health", request.soak_started))
        judged = [
            RolloutNode(name=str(name), uid=uid)
            for uid, (name, _) in sorted(self.rollout_marks.items())
            if uid in self.rollout_new
        ]
        if self.gate_fails:
            reasons = [f"node {n.name}: Ready False (KubeletNotReady)" for n in judged] or ["the gate failed"]
            return WaveHealth(verdict="Failed", reasons=reasons, nodes=judged)
        return WaveHealth(verdict="Healthy", nodes=judged, ready_nodes=len(judged))

    @activity.defn(name="sync_rollout_state")
    async def sync_rollout_state(self, request: StateRequest) -> StateAnswer:
        await self.faults.enter("sync_rollout_state")
        self.calls.append(("sync_rollout_state", request.phase))
        if self.rollout_target_moved and request.target and self.rollout_target_moved != request.target:
            return StateAnswer(target=self.rollout_target_moved, superseded=True)
        self.rollout_states.append(request)
        return StateAnswer(target=request.target, written=bool(request.target))

    @activity.defn(name="untaint_orphans")
    async def untaint_orphans(self, nodes: list[str]) -> list[str]:
        await self.faults.enter("untaint_orphans")
        self.calls.append(("untaint_orphans", nodes))
        return nodes

    @activity.defn(name="apply_annotations")
    async def apply_annotations(self, changes: list[dict[str, Any]]) -> int:
        await self.faults.enter("apply_annotations")
        self.calls.append(("apply_annotations", changes))
        return len(changes)

    @activity.defn(name="collect_garbage")
    async def collect_garbage(self, request: GarbageCollectionRequest) -> GarbageCollectionResult:
        self.calls.append(("collect_garbage", None))
        await self.faults.enter("collect_garbage")
        return GarbageCollectionResult(at=datetime.now(UTC))

    @staticmethod
    async def _wait_forever(details: Any) -> None:
        while True:
            activity.heartbeat(details)
            await asyncio.sleep(0.05)

    # -- disruption ---------------------------------------------------------------------------------

    @activity.defn(name="taint_disrupted")
    async def taint_disrupted(self, request: TaintRequest) -> list[CandidateNode]:
        await self.faults.enter("taint_disrupted")
        self.calls.append(("taint_disrupted", request.nodes))
        await asyncio.sleep(self.taint_seconds)
        results = [
            CandidateNode(
                node=n,
                ok=True,
                uid=self.uid(n),
                provider_id=f"aws:///zone-a/i-{n}",
                nodepool="default",
                termination_id=f"termination/fake/{n}/{self.uid(n)}",
            )
            if n in self.nodes
            and n not in self.deleting
            and n not in self.do_not_disrupt
            and request.uids.get(n, self.uid(n)) == self.uid(n)
            else CandidateNode(
                node=n,
                ok=False,
                message="has karpenter.sh/do-not-disrupt" if n in self.do_not_disrupt else "node not found",
            )
            for n in request.nodes
        ]
        for result in results:
            if result.ok:
                self.taints[result.node] = request.command_id
                if request.reason in CLAIMING_REASONS:
                    self.claims.setdefault(result.node, set()).add(request.command_id)
        return results

    @staticmethod
    def uid(node: str) -> str:
        return f"uid-{node}"

    @activity.defn(name="untaint_disrupted")
    async def untaint_disrupted(self, request: UntaintRequest) -> list[str]:
        await self.faults.enter("untaint_disrupted")
        self.calls.append(("untaint_disrupted", request.nodes))
        self.requests.setdefault("untaint_disrupted", []).append(request)
        await asyncio.sleep(self.untaint_seconds)
        released = []
        for n in request.nodes:
            if n not in self.nodes or n in self.finalized:
                continue  # gone, or deleting: its termination owns it
            if self.taints.get(n, request.command_id) != request.command_id:
                continue  # another command's
            self.taints.pop(n, None)
            self.claims.get(n, set()).discard(request.command_id)
            released.append(n)
        return released

    @activity.defn(name="resolve_replacement")
    async def resolve_replacement(self, request: ResolveRequest) -> LaunchTemplate:
        await self.faults.enter("resolve_replacement")
        self.calls.append(("resolve_replacement", request.index))
        if self.resolve_bug:
            raise KeyError("amiSelectorTerms")  # a bug, not a classified error: retryable by default
        return LaunchTemplate(
            nodepool=request.spec.nodepool,
            nodeclass="default",
            subnets={"zone-a": "subnet-a", "zone-b": "subnet-b"},
            security_group_ids=["sg-1"],
            amis=[AmiChoice(id="ami-1")],
            via_nodeclaim=self.karpenter_coexistence,
        )

    @activity.defn(name="launch_instance")
    async def launch_instance(self, request: LaunchRequest) -> LaunchedInstance:
        await self.faults.enter("launch_instance")
        self.calls.append(("launch_instance", request.offering.key))
        self.requests.setdefault("launch_instance", []).append(request)
        await asyncio.sleep(self.launch_seconds.get(request.index, 0.0))
        for earlier in self._of_command(request.command_id):
            # As the real activity, before anything else: an instance tagged with this command and index
            # is adopted. A local activity runs again when its workflow task times out (a killed
            # worker), after its launch went through.
            if earlier.index == request.index:
                return earlier.model_copy(update={"adopted": True})
        if request.index in self.fail_launch_of:
            raise ApplicationError("launch refused", type=errors.INVALID, non_retryable=True)
        if request.offering.key in self.ice:
            raise ApplicationError("out of capacity", type=errors.INSUFFICIENT_CAPACITY, non_retryable=True)
        instance_id = f"i-new{next(self._ids)}"
        launched = LaunchedInstance(
            instance_id=instance_id,
            index=request.index,
            provider_id=f"aws:///{request.offering.zone}/{instance_id}",
            private_dns_name=f"node-{instance_id}",
            offering=request.offering,
        )
        self.instances[instance_id] = launched
        self.commands[instance_id] = request.command_id
        return launched

    @activity.defn(name="find_command_instances")
    async def find_command_instances(self, command_id: str) -> list[LaunchedInstance]:
        await self.faults.enter("find_command_instances")
        self.calls.append(("find_command_instances", command_id))
        return [] if self.listing_lags else self._of_command(command_id)

    def _of_command(self, command_id: str) -> list[LaunchedInstance]:
        """The replacements launched for this command and not yet gone (what its tag would find)."""
        return [instance for iid, instance in self.instances.items() if self.commands[iid] == command_id]

    @activity.defn(name="await_node_registered")
    async def await_node_registered(self, request: RegistrationRequest) -> RegisteredNode:
        await self.faults.enter("await_node_registered")
        return await self._registered(request)

    async def _registered(self, request: RegistrationRequest) -> RegisteredNode:
        self.calls.append(("await_node_registered", request.instance.instance_id))
        self.requests.setdefault("await_node_registered", []).append(request)
        if request.instance.offering.key in self.ends_before_registering:
            self.instances.pop(request.instance.instance_id, None)
            raise ApplicationError(
                f"replacement instance {request.instance.instance_id} is terminated: "
                "its node will never register",
                type=errors.NOT_FOUND,
                non_retryable=True,
            )
        for _ in range(int(self.register_seconds * 20)):
            activity.heartbeat({"waiting_for": "registration"})
            await asyncio.sleep(0.05)
        if self.never_registers:
            await self._wait_forever(
                {"waiting_for": f"a Node with providerID {request.instance.provider_id}"}
            )
        return RegisteredNode(node=request.instance.private_dns_name)

    @activity.defn(name="await_node_initialized")
    async def await_node_initialized(self, request: InitializationRequest) -> None:
        await self.faults.enter("await_node_initialized")
        await self._initialized(request)

    async def _initialized(self, request: InitializationRequest) -> None:
        self.calls.append(("await_node_initialized", request.node))
        self.requests.setdefault("await_node_initialized", []).append(request)
        if self.never_initializes:
            await self._wait_forever({"node": request.node, "waiting_for": ["not Ready"]})

    @activity.defn(name="await_node_ready")
    async def await_node_ready(self, request: RegistrationRequest) -> RegisteredNode:
        await self.faults.enter("await_node_ready")
        if request.registered_node is not None:
            self.calls.append(("look_again", request.registered_node))
            if self.lose_initialized_replacements:
                self.instances.pop(request.instance.instance_id, None)
                raise ApplicationError(
                    f"node {request.registered_node} of replacement instance {request.instance.instance_id} "
                    "disappeared after it registered",
                    {"node": request.registered_node},
                    type=errors.NOT_FOUND,
                    non_retryable=True,
                )
            return RegisteredNode(node=request.registered_node)
        if self.wait_errors > 0:
            self.wait_errors -= 1
            self.calls.append(("await_node_ready", "ServerError"))
            raise ApplicationError("Kubernetes API 500: etcd timeout", type=errors.SERVER_ERROR)
        # The two steps it joins, recorded under their own names as the real activity runs them.
        registered = await self._registered(request)
        await self._initialized(
            InitializationRequest(
                node=registered.node,
                startup_taints=request.template.startup_taints,
                candidates=request.candidates,
            )
        )
        self.ready.add(request.instance.instance_id)
        return registered

    @activity.defn(name="release_node")
    async def release_node(self, request: DiscardRequest) -> None:
        await self.faults.enter("release_node")
        self.calls.append(("release_node", request.instance_id))
        self.released.add(request.instance_id)

    # -- termination --------------------------------------------------------------------------------

    @activity.defn(name="begin_termination")
    async def begin_termination(self, request: BeginTerminationRequest) -> NodeInfo:
        await self.faults.enter("begin_termination")
        self.calls.append(("begin_termination", request.node))
        self.termination_deadlines[request.node] = request.deadline
        if request.node not in self.nodes:
            instance = request.provider_id.rsplit("/", 1)[-1] if request.provider_id else None
            return NodeInfo(
                node=request.node, found=False, provider_id=request.provider_id, instance_id=instance
            )
        now = await self.now()
        self.finalized.add(request.node)
        deletion = self.deletion_times.setdefault(request.node, now)
        deadline = self.deadline_annotations.get(request.node)
        if not getattr(request, "defer_deadline", False) and deadline is None:
            # The older contract: the deadline counts from the deletion, stamped here.
            grace = self._grace(request.termination_grace_period)
            deadline = _earliest(deletion + grace if grace is not None else None, request.deadline)
            if deadline is not None:
                self.deadline_annotations[request.node] = deadline
        return NodeInfo(
            pods=self.pods_on.get(request.node),
            node=request.node,
            found=True,
            uid=request.uid or self.uid(request.node),
            ready=self.node_ready,
            provider_id=f"aws:///zone-a/i-{request.node}",
            instance_id=f"i-{request.node}",
            nodepool="default",
            deletion_timestamp=deletion,
            deadline=deadline,
            handed_over=self.karpenter_coexistence,
            nodeclaim=f"claim-{request.node}" if self.karpenter_coexistence else None,
        )

    @activity.defn(name="termination_gate")
    async def termination_gate(self, request: TerminationGateRequest) -> TerminationGate:
        await self.faults.enter("termination_gate")
        self.calls.append(("termination_gate", request.node))
        self.requests.setdefault("termination_gate", []).append(request)
        held = request.node in self.taints  # a command's (or this termination's) own: checked already
        if not held and request.reason in CLAIMING_REASONS:
            self.claims.setdefault(request.node, set()).add(request.holder)
        if self.gate_waits > 0 and not held:
            self.gate_waits -= 1
            return TerminationGate(
                go=False,
                waiting_for="NodeDisruptionBudget ingress",
                message="NodeDisruptionBudget ingress allows 1 unavailable",
            )
        deadline = None
        if getattr(request, "stamp_deadline", False):
            # The drain may begin now: its clock starts here (an annotation already there stays).
            deadline = self.deadline_annotations.get(request.node)
            if deadline is None:
                grace = self._grace(request.termination_grace_period)
                now = await self.now()
                deadline = _earliest(now + grace if grace is not None else None, request.deadline)
                if deadline is not None:
                    self.deadline_annotations[request.node] = deadline
        return TerminationGate(go=True, deadline=deadline)

    def _grace(self, requested: timedelta | None) -> timedelta | None:
        return requested if requested is not None else self.tgp

    @activity.defn(name="check_waiting_command")
    async def check_waiting_command(self, request: WaitingCommandCheck) -> WaitingCommandVerdict:
        self.calls.append(("check_waiting_command", list(request.nodes)))
        await self.faults.enter("check_waiting_command")
        self.requests.setdefault("check_waiting_command", []).append(request)
        if not self.waiting_verdicts:
            return WaitingCommandVerdict(valid=True, nodes=list(request.nodes), approval_required=True)
        verdict = self.waiting_verdicts.pop(0) if len(self.waiting_verdicts) > 1 else self.waiting_verdicts[0]
        if verdict is None:
            raise ApplicationError("the cluster cache is stale", type="StaleView", non_retryable=True)
        return verdict

    @activity.defn(name="taint_for_termination")
    async def taint_for_termination(self, node: str | NodeRef) -> None:
        await self.faults.enter("taint_for_termination")
        self.calls.append(("taint_for_termination", node.node if isinstance(node, NodeRef) else node))
        ref = node if isinstance(node, NodeRef) else NodeRef(node=node)
        self.termination_taints.append(ref)
        self.taints.setdefault(ref.node, ref.holder or "")

    @activity.defn(name="drain_node")
    async def drain_node(self, request: DrainRequest) -> DrainResult:
        await self.faults.enter("drain_node")
        self.calls.append(("drain_node", request.node))
        self.drains.append((request, await self.now()))
        if self.drain_failures > 0:
            self.drain_failures -= 1
            raise ApplicationError("eviction refused: too many requests", type=errors.THROTTLED)
        if self.drain_blocks:
            await self._wait_forever({"pods_left": 3})
        return DrainResult(evicted=3)

    @activity.defn(name="await_volumes_detached")
    async def await_volumes_detached(self, request: VolumeRequest) -> bool:
        await self.faults.enter("await_volumes_detached")
        self.calls.append(("await_volumes_detached", request.node))
        # Something still attached at the first look (wait False): the termination waits for it.
        return request.wait or not self.volumes_attached_once

    @activity.defn(name="describe_instance")
    async def describe_instance(self, request: InstanceRequest) -> InstanceState:
        await self.faults.enter("describe_instance")
        self.calls.append(("describe_instance", request.instance_id))
        return InstanceState(
            instance_id=request.instance_id,
            found=self.instance_found,
            state="running" if self.instance_found else None,
            owned=self.owned,
        )

    @activity.defn(name="terminate_instance")
    async def terminate_instance(self, request: InstanceRequest) -> InstanceState:
        await self.faults.enter("terminate_instance")
        self.calls.append(("terminate_instance", request.instance_id))
        await asyncio.sleep(self.terminate_seconds)
        if not self.owned or request.instance_id in self.refused_terminations | self.not_owned:
            raise ApplicationError(
                f"refusing to terminate instance {request.instance_id}: not owned",
                type=errors.NOT_OWNED,
                non_retryable=True,
            )
        self.terminated.append(request.instance_id)
        self.instances.pop(request.instance_id, None)
        return InstanceState(instance_id=request.instance_id, found=True, state="terminated", owned=True)

    @activity.defn(name="remove_finalizer")
    async def remove_finalizer(self, node: str | NodeRef) -> None:
        await self.faults.enter("remove_finalizer")
        name = node.node if isinstance(node, NodeRef) else node
        self.calls.append(("remove_finalizer", name))
        if name in self.finalized:
            self.removed.add(name)
        self.taints.pop(name, None)
        self.claims.pop(name, None)

    # -- beside Karpenter -----------------------------------------------------------------------------

    @activity.defn(name="create_nodeclaim")
    async def create_nodeclaim(self, request: NodeClaimRequest) -> NodeClaimState:
        await self.faults.enter("create_nodeclaim")
        self.calls.append(("create_nodeclaim", request.name))
        self.nodeclaims[request.name] = request
        return NodeClaimState(name=request.name, uid=f"uid-{request.name}")

    @activity.defn(name="await_nodeclaim")
    async def await_nodeclaim(self, request: NodeClaimWait) -> NodeClaimState:
        await self.faults.enter("await_nodeclaim")
        self.calls.append(("await_nodeclaim", f"{request.name}:{request.until}"))
        if self.karpenter_gives_up:
            raise ApplicationError(
                f"NodeClaim {request.name} was deleted before it was {request.until}",
                type=errors.NOT_FOUND,
                non_retryable=True,
            )
        if self.karpenter_never_initializes and request.until == "Initialized":
            await self._wait_forever({"nodeclaim": request.name, "waiting_for": "Initialized=Unknown"})
        spec = self.nodeclaims[request.name].spec
        if request.until == "Initialized":
            self.ready.add(request.name)
        return NodeClaimState(
            name=request.name,
            uid=request.uid,
            provider_id=f"aws:///zone-a/i-{request.name}",
            instance_id=f"i-{request.name}",
            node=f"node-{request.name}" if request.until != "Launched" else None,
            offering=Offering(instance_type=spec.instance_types[0], zone="zone-a", capacity_type="on-demand"),
            conditions={"Launched": "True"},
        )

    @activity.defn(name="delete_nodeclaims")
    async def delete_nodeclaims(self, request: NodeClaimDeletion) -> list[str]:
        await self.faults.enter("delete_nodeclaims")
        self.calls.append(("delete_nodeclaims", request.names))
        deleted = [name for name in request.names if name in self.nodeclaims]
        self.deleted_nodeclaims += deleted
        return deleted

    @activity.defn(name="await_karpenter_termination")
    async def await_karpenter_termination(self, request: HandoverWait) -> str:
        await self.faults.enter("await_karpenter_termination")
        self.calls.append(("await_karpenter_termination", request.nodeclaim))
        self.removed.add(request.node)  # Karpenter drained it and removed its finalizer
        if request.nodeclaim:
            self.terminated.append(f"i-{request.node}")  # and ended the instance of its NodeClaim
        self.taints.pop(request.node, None)
        self.claims.pop(request.node, None)
        return f"Karpenter drained and terminated node {request.node}"


# The rollout states after which nothing waits for the rollout that wrote them (a newer target's
# rollout owns a Superseded pool's state).
ROLLOUT_STATE_FINAL = frozenset({"Succeeded", "Aborted", "Superseded"})
# Reasons whose terminations and taints claim NodeDisruptionBudgets (activities/guards.py `claims_budgets`).
CLAIMING_REASONS = frozenset({"Underutilized", "Empty", "Drifted", "Unhealthy", "Manual"})


def _earliest(*deadlines: datetime | None) -> datetime | None:
    given = [d for d in deadlines if d is not None]
    return min(given) if given else None
