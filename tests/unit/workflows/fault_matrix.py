"""The fault matrix (issue 30): every workflow, every activity and child it calls, every fault.

The cells are generated from the workflows' own lists (`ACTIVITIES`, `CHILDREN` on each workflow
class, checked against their code by test_fault_matrix.py): a new activity gets its cells, and fails
them until a path below reaches it and its outcomes are written down. Each cell runs one path of one
workflow on the time-skipping server with FakeCluster's activities (fakes.py), does one fault
(fault_injection.py) to one activity or child, and is checked against its expected `Outcome`:

- the run closes as expected, or waits where expected (its status query and the Phase search
  attribute, which the Web UI lists, name the wait), and then closes once the fault is over;
- what the fakes find left in the cluster is exactly what the outcome says (taints, finalizers,
  budget claims, instances, NodeClaims, rollout marks), each with who takes it over;
- no workflow task failed, and every history of the cell replays on the current code.

`python -m tests.unit.workflows.fault_matrix` prints the table that docs/fault-matrix.md holds
(test_fault_matrix.py checks the two are the same).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import ModuleType

from tests.unit.workflows.fault_injection import Fault
from worker import WORKFLOWS
from workflows.controller import ControllerWorkflow
from workflows.disruption import DisruptionWorkflow
from workflows.notify import NotificationWorkflow
from workflows.rollout import RolloutWorkflow
from workflows.termination import TerminationWorkflow

# -- what a cell expects ------------------------------------------------------------------------------

COMPLETED, FAILED, CANCELED, RUNNING = "COMPLETED", "FAILED", "CANCELED", "RUNNING"
# Leftover kinds (FakeCluster.leftovers) and who takes each over; the table's notes say which applies.
TAINT, FINALIZER, CLAIM, INSTANCE, NODECLAIM, MARK, STATE = (
    "taint",
    "finalizer",
    "claim",
    "instance",
    "nodeclaim",
    "mark",
    "state",
)


NOTIFIED = (
    "a notification is a child left to run on its own: the command never waits for it, nor fails with it"
)


@dataclass(frozen=True)
class Outcome:
    status: str  # how the run closes (RUNNING: the controller, which goes on)
    phase: str  # what its status query and the KarpflowPhase search attribute say then
    left: frozenset[str] = frozenset()
    waits: str = ""  # first a documented wait in this phase; the cell checks it, then ends the fault
    note: str = ""  # who takes over what is left; what only the real stack shows, and where it is tested

    def cell(self) -> str:
        text = self.status if not self.phase else f"{self.status} {self.phase}"
        if self.waits:
            text = f"waits in {self.waits}, then {text}"
        if self.left:
            text += f"; left: {', '.join(sorted(self.left))}"
        return text


def left(*kinds: str) -> frozenset[str]:
    return frozenset(kinds)


# Who takes over what a closed run leaves (the notes the table repeats).
WATCHER = (
    "the node stays deleting with its finalizer, as Karpenter leaves it: the node-deletion watcher starts "
    "its termination again (30 s doubling to 10 min: cluster/node_deletions.py; tests/unit/"
    "test_node_deletion_retries.py, tests/integration/workflows/test_guards.py), and its claim goes with it"
)
CANCELLED_BEGIN = (
    "the cancel interrupts the call before it changed anything here; one that had deleted the node "
    "leaves it deleting, which the node-deletion watcher takes over"
)
CRASH_CLEANUP = (
    "the compensation problem is in the run's message; the controller's crash cleanup untaints a node no "
    "running workflow holds (untaint_orphans: tests/integration/activities/test_claims.py) and its budget "
    "sweep then drops the claim (tests/integration/activities/test_budget_claims.py)"
)


# -- the paths -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Path:
    """One way through one workflow, and the activities and children it reaches (each gets cells here).
    An activity name with `#n` means its n-th call (the regular volume wait after the first look)."""

    key: str
    workflow: type
    title: str
    reaches: tuple[str, ...]
    fails: Outcome  # an activity failing permanently or exhausting its retries
    recovers: Outcome  # a timeout, then a retry; the worker killed, then another one
    cancelled: Outcome  # the workflow cancelled while the activity runs
    child: Outcome | None = None  # a child that fails, or is terminated or cancelled from outside
    overrides: dict[tuple[str, Fault], Outcome] = field(default_factory=dict)
    primary: tuple[str, Fault] | None = None  # what takes the run onto this path

    def outcome(self, target: str, fault: Fault) -> Outcome:
        if (target, fault) in self.overrides:
            return self.overrides[(target, fault)]
        if fault in (Fault.PERMANENT, Fault.EXHAUSTED):
            return self.fails
        if fault == Fault.CANCELLED:
            return self.cancelled
        if fault in CHILD_FAULTS:
            assert self.child is not None
            return self.child
        return self.recovers


CHILD_FAULTS = (Fault.CHILD_FAILS, Fault.CHILD_TERMINATED, Fault.CHILD_CANCELLED)
ACTIVITY_FAULTS = (
    Fault.PERMANENT,
    Fault.EXHAUSTED,
    Fault.START_TO_CLOSE,
    Fault.HEARTBEAT,
    Fault.CANCELLED,
    Fault.WORKER_KILLED,
)
# The activities that heartbeat (a heartbeat timeout at the call site): only they get a heartbeat cell.
# Every cell checks what the activity was called with against this, so the set cannot go stale.
HEARTBEATS = frozenset(
    {
        ("ControllerWorkflow", "plan_pass"),
        ("ControllerWorkflow", "validate_commands"),
        ("ControllerWorkflow", "collect_garbage"),
        ("DisruptionWorkflow", "check_waiting_command"),
        ("DisruptionWorkflow", "await_node_ready"),
        ("DisruptionWorkflow", "await_nodeclaim"),
        ("DisruptionWorkflow", "terminate_instance"),
        ("TerminationWorkflow", "drain_node"),
        ("TerminationWorkflow", "await_volumes_detached#2"),
        ("TerminationWorkflow", "terminate_instance"),
        ("TerminationWorkflow", "await_karpenter_termination"),
        ("RolloutWorkflow", "mark_rollout_nodes"),
        ("RolloutWorkflow", "unmark_rollout_nodes"),
        ("RolloutWorkflow", "mark_rollout_wave"),
        ("RolloutWorkflow", "unmark_rollout_nodes#2"),
        ("RolloutWorkflow", "mark_rollout_wave#2"),
    }
)
# Activities only runs started before a patch still call: the recorded histories replay them
# (test_replay.py); no new run reaches them, so they get no cells.
LEGACY = {
    ("DisruptionWorkflow", "await_node_registered"): "runs started before disruption-lean-history",
    ("DisruptionWorkflow", "await_node_initialized"): "runs started before disruption-lean-history",
}

CONTROLLER_PASS = Path(
    "controller",
    ControllerWorkflow,
    "a pass that plans, cleans up, annotates, tidies the controls, validates and starts a command",
    reaches=ControllerWorkflow.ACTIVITIES + ControllerWorkflow.CHILDREN,
    fails=Outcome(
        RUNNING, "", note="the pass records `<step> failed: <cause>` in status.error; the next pass runs"
    ),
    recovers=Outcome(RUNNING, "", note="the pass completes on the retry (or on the new worker)"),
    cancelled=Outcome(CANCELED, "", note="an operator's cancel: the workers' supervision leaves it stopped"),
    child=Outcome(
        RUNNING,
        "",
        note="commands are children with parent-close ABANDON: a later pass reads the failure from "
        "visibility and backs the NodePool off (test_controller_workflow.py)",
    ),
    overrides={
        (step, fault): Outcome(RUNNING, "", note="a hint to the scheduler: the failure is logged only")
        for step in ("apply_taints",)
        for fault in (Fault.PERMANENT, Fault.EXHAUSTED)
    },
)

REPLACE = Path(
    "disruption/replace",
    DisruptionWorkflow,
    "a voluntary replace (Underutilized, one replacement)",
    reaches=(
        "taint_disrupted",
        "resolve_replacement",
        "launch_instance",
        "await_node_ready",
        "TerminationWorkflow",
    ),
    fails=Outcome(FAILED, "RolledBack", note="untainted; a launched replacement terminated and released"),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", note="rolled back"),
    child=Outcome(FAILED, "Failed", left(FINALIZER, TAINT, CLAIM), note=WATCHER),
    overrides={
        ("await_node_ready", Fault.START_TO_CLOSE): Outcome(
            FAILED, "RolledBack", note="its bound is the replacement's deadline (schedule-to-close)"
        ),
    },
)

ROLLBACK = Path(
    "disruption/rollback",
    DisruptionWorkflow,
    "the same replace rolled back (its replacement never becomes ready): the compensation",
    reaches=(
        "untaint_disrupted",
        "find_command_instances",
        "terminate_instance",
        "release_node",
        "NotificationWorkflow",
    ),
    primary=("await_node_ready", Fault.PERMANENT),
    child=Outcome(FAILED, "RolledBack", note=NOTIFIED),
    fails=Outcome(FAILED, "RolledBack", note="reported as a compensation problem in the message"),
    recovers=Outcome(FAILED, "RolledBack"),
    cancelled=Outcome(FAILED, "RolledBack", note="a compensation runs to its end through a cancel"),
    overrides={
        **{
            ("release_node", fault): Outcome(
                FAILED,
                "RolledBack",
                note="reported as a compensation problem; here the replacement never registered, so no Node "
                "is left: one that did would stay NotReady without its instance, which the simulator's "
                "invariant checker reports as an orphan node (tests/integration/sim/test_stack.py)",
            )
            for fault in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        **{
            ("untaint_disrupted", fault): Outcome(
                FAILED, "RolledBack", left(TAINT, CLAIM), note=CRASH_CLEANUP
            )
            for fault in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        **{
            ("terminate_instance", fault): Outcome(
                FAILED,
                "RolledBack",
                left(INSTANCE),
                note="EC2 refused the terminate, or was down past the retries: reported as a compensation "
                "problem; the instance stays until a person acts (the simulator's invariant checker calls it "
                "a leaked instance: tests/integration/sim/test_stack.py)",
            )
            for fault in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
    },
)

APPROVAL = Path(
    "disruption/approval",
    DisruptionWorkflow,
    "a command that waits for approval (its DisruptionAwaitingApproval Events), then approved and "
    "judged again before its taint",
    reaches=("record_event", "check_waiting_command", "NotificationWorkflow"),
    fails=Outcome(COMPLETED, "Succeeded", note="an Event is best effort: the failure is logged"),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", note="nothing was changed"),
    child=Outcome(COMPLETED, "Succeeded", note=NOTIFIED),
    overrides={
        ("check_waiting_command", fault): Outcome(
            COMPLETED,
            "Invalidated",
            note="approved, but it could not be judged again: it takes no node and says why",
        )
        for fault in (Fault.PERMANENT, Fault.EXHAUSTED)
    },
)

BESIDE_KARPENTER = Path(
    "disruption/nodeclaim",
    DisruptionWorkflow,
    "beside Karpenter: the replacement is a NodeClaim",
    reaches=("create_nodeclaim", "await_nodeclaim"),
    fails=Outcome(FAILED, "RolledBack", note="the NodeClaim deleted (Karpenter ends its instance)"),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", note="rolled back"),
    overrides={
        ("await_nodeclaim", Fault.START_TO_CLOSE): Outcome(
            FAILED, "RolledBack", note="its bound is the replacement's deadline (schedule-to-close)"
        ),
    },
)

NODECLAIM_ROLLBACK = Path(
    "disruption/nodeclaim-rollback",
    DisruptionWorkflow,
    "beside Karpenter, rolled back (Karpenter gave the NodeClaim up)",
    reaches=("delete_nodeclaims",),
    primary=("await_nodeclaim", Fault.PERMANENT),
    fails=Outcome(
        FAILED,
        "RolledBack",
        left(NODECLAIM),
        note="reported as a compensation problem; Karpenter's own registration timeout deletes a NodeClaim "
        "that never registers (tests/integration/coexistence)",
    ),
    recovers=Outcome(FAILED, "RolledBack"),
    cancelled=Outcome(FAILED, "RolledBack", note="a compensation runs to its end through a cancel"),
)

FORCEFUL = Path(
    "disruption/forceful",
    DisruptionWorkflow,
    "a forceful command (Expired, one replacement): the candidate goes whatever its replacement does",
    reaches=(
        "taint_disrupted",
        "resolve_replacement",
        "launch_instance",
        "await_node_ready",
        "TerminationWorkflow",
    ),
    fails=Outcome(COMPLETED, "Succeeded", note="without its replacement (discarded); the message says why"),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", note="rolled back: nothing was handed over yet"),
    child=Outcome(FAILED, "Failed", left(FINALIZER, TAINT), note=WATCHER),
    overrides={
        **{
            ("taint_disrupted", fault): Outcome(FAILED, "RolledBack")
            for fault in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        ("await_node_ready", Fault.START_TO_CLOSE): Outcome(
            COMPLETED, "Succeeded", note="without its replacement: not ready by its deadline"
        ),
    },
)

SPOT = Path(
    "disruption/spot",
    DisruptionWorkflow,
    "a spot interruption (a termination deadline): the candidate drains at once, its replacement launches",
    reaches=(
        "taint_disrupted",
        "resolve_replacement",
        "launch_instance",
        "await_node_ready",
        "TerminationWorkflow",
    ),
    fails=Outcome(COMPLETED, "Succeeded", note="without its replacement (discarded); the message says why"),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(
        CANCELED, "Canceled", note="handed over: the termination goes on; the replacement discarded"
    ),
    child=Outcome(FAILED, "Failed", left(FINALIZER, TAINT), note=WATCHER),
    overrides={
        **{
            ("taint_disrupted", fault): Outcome(FAILED, "RolledBack")
            for fault in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        ("taint_disrupted", Fault.CANCELLED): Outcome(CANCELED, "Canceled", note="rolled back"),
        ("await_node_ready", Fault.START_TO_CLOSE): Outcome(
            COMPLETED, "Succeeded", note="without its replacement: not ready by its deadline"
        ),
    },
)

TERMINATION_STEPS = (
    "begin_termination",
    "termination_gate",
    "taint_for_termination",
    "drain_node",
    "await_volumes_detached",
    "await_volumes_detached#2",
    "terminate_instance",
    "remove_finalizer",
)


def before_the_drain(claims: bool) -> dict[tuple[str, Fault], Outcome]:
    """A termination that fails or is cancelled before its drain: what is left is what the steps
    before that one did (the fault comes before the step's own effect)."""
    done_before = {
        "begin_termination": left(),
        "termination_gate": left(FINALIZER),
        "taint_for_termination": left(FINALIZER, CLAIM) if claims else left(FINALIZER),
    }
    outcomes: dict[tuple[str, Fault], Outcome] = {}
    for step, what in done_before.items():
        for fault in (Fault.PERMANENT, Fault.EXHAUSTED):
            outcomes[(step, fault)] = Outcome(
                FAILED, "Failed", what, note=WATCHER if what else "nothing was changed"
            )
        outcomes[(step, Fault.CANCELLED)] = Outcome(
            CANCELED, "Canceled", what, note=WATCHER if what else CANCELLED_BEGIN
        )
    outcomes[("drain_node", Fault.EXHAUSTED)] = Outcome(
        COMPLETED,
        "Succeeded",
        waits="Draining",
        note="a drain retries until its deadline, as Karpenter's does",
    )
    return outcomes


MANUAL = Path(
    "termination/manual",
    TerminationWorkflow,
    "`kubectl delete node` (Manual, through the gate), a volume still attached at the first look",
    reaches=TERMINATION_STEPS,
    fails=Outcome(FAILED, "Failed", left(FINALIZER, TAINT, CLAIM), note=WATCHER),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", left(FINALIZER, TAINT, CLAIM), note=WATCHER),
    overrides={
        **before_the_drain(claims=True),
        ("await_volumes_detached#2", Fault.START_TO_CLOSE): Outcome(
            COMPLETED,
            "Succeeded",
            note="volumes that never detach: the instance is terminated anyway at volume_detach",
        ),
    },
)

NOT_READY = Path(
    "termination/not-ready",
    TerminationWorkflow,
    "a NotReady node: is its instance still there?",
    reaches=("describe_instance",),
    fails=Outcome(FAILED, "Failed", left(FINALIZER), note=WATCHER),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", left(FINALIZER), note=WATCHER),
)
FAILING = Path(
    "termination/failing",
    TerminationWorkflow,
    "a termination whose drain is refused: its FailedTermination Event",
    reaches=("record_event",),
    primary=("drain_node", Fault.PERMANENT),
    fails=Outcome(
        FAILED, "Failed", left(FINALIZER, TAINT, CLAIM), note="the Event is best effort; " + WATCHER
    ),
    recovers=Outcome(FAILED, "Failed", left(FINALIZER, TAINT, CLAIM), note=WATCHER),
    cancelled=Outcome(FAILED, "Failed", left(FINALIZER, TAINT, CLAIM), note=WATCHER),
)
HANDOVER = Path(
    "termination/handover",
    TerminationWorkflow,
    "beside Karpenter: the node handed to Karpenter's termination, then its instance checked",
    reaches=("await_karpenter_termination", "terminate_instance"),
    fails=Outcome(
        FAILED, "Failed", note="Karpenter's termination owns the node (tests/integration/coexistence)"
    ),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", note="Karpenter's termination owns the node"),
    overrides={
        **{
            ("await_karpenter_termination", f): Outcome(
                FAILED,
                "Failed",
                left(FINALIZER),
                note="Karpenter's termination owns the node (tests/integration/coexistence)",
            )
            for f in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        ("await_karpenter_termination", Fault.CANCELLED): Outcome(
            CANCELED, "Canceled", left(FINALIZER), note="Karpenter's termination owns the node"
        ),
        ("await_karpenter_termination", Fault.EXHAUSTED): Outcome(
            COMPLETED,
            "Succeeded",
            waits="WaitingForKarpenter",
            note="it waits as long as Karpenter's termination takes, retrying as a drain does",
        ),
    },
)
INTERRUPTED = Path(
    "termination/interrupted",
    TerminationWorkflow,
    "an instance stopping (interruption StateChange: Interrupted, a deadline of now): never gated",
    reaches=("begin_termination", "termination_gate", "drain_node", "terminate_instance", "remove_finalizer"),
    fails=Outcome(FAILED, "Failed", left(FINALIZER, TAINT), note=WATCHER),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", left(FINALIZER, TAINT), note=WATCHER),
    overrides=before_the_drain(claims=False),
)

ROLLS = Path(
    "rollout/rolls",
    RolloutWorkflow,
    "a rollout of three nodes, one replaced each poll",
    reaches=("mark_rollout_nodes", "rollout_remaining", "NotificationWorkflow"),
    child=Outcome(COMPLETED, "Succeeded", note=NOTIFIED),
    fails=Outcome(
        COMPLETED,
        "Succeeded",
        waits="Rolling",
        note="a failed poll keeps the last answer; the next asks again",
    ),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", note="the marks taken off"),
    overrides={
        (step, f): Outcome(
            COMPLETED, "Succeeded", waits="Marking", note="marking is tried again every poll interval"
        )
        for step in ("mark_rollout_nodes",)
        for f in (Fault.PERMANENT, Fault.EXHAUSTED)
    },
)
ROLLOUT_CANCEL = Path(
    "rollout/cancelled",
    RolloutWorkflow,
    "a rollout cancelled while it rolls: its marks taken off",
    reaches=("unmark_rollout_nodes",),
    primary=("rollout_remaining", Fault.CANCELLED),
    fails=Outcome(
        CANCELED,
        "Canceled",
        left(MARK),
        note="the message says the marks could not be taken off: the planner still replaces those nodes "
        "(`kubectl annotate node ... karpflow.dev/rollout-requested-`)",
    ),
    recovers=Outcome(CANCELED, "Canceled"),
    cancelled=Outcome(CANCELED, "Canceled", note="a second cancel changes nothing"),
)

ROLLOUT_CANCELLED = (
    "the marks taken off; a drift rollout's NodePool state says Aborted (before, it went on saying "
    "Rolling or Halted, and the planner held the pool's drift for a rollout that no longer ran)"
)
ROLLED_BACK = (
    "the mark left is the rollback's, on the node the rollout launched: the planner replaces it from the "
    "pool's spec as it is now (revert the change first)"
)
WAVES = Path(
    "rollout/waves",
    RolloutWorkflow,
    "a drift rollout of three nodes in waves (canary 1, growth 2, a soak of 1 s, polls of 200 ms): "
    "each gate Healthy after the soak, then RolloutFinished",
    reaches=("mark_rollout_wave", "check_wave_health", "sync_rollout_state", "NotificationWorkflow"),
    child=Outcome(COMPLETED, "Succeeded", note=NOTIFIED),
    fails=Outcome(COMPLETED, "Succeeded"),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(CANCELED, "Canceled", note=ROLLOUT_CANCELLED),
    overrides={
        **{
            ("mark_rollout_wave", f): Outcome(
                COMPLETED,
                "Succeeded",
                waits="Rolling",
                note="marking a wave is tried again every poll; nothing is marked meanwhile",
            )
            for f in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        **{
            ("check_wave_health", f): Outcome(
                COMPLETED,
                "Succeeded",
                waits="Soaking",
                note="a gate that cannot be asked passes no wave: the wave soaks until it answers Healthy "
                "(the message says why)",
            )
            for f in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        **{
            ("sync_rollout_state", f): Outcome(
                COMPLETED,
                "Succeeded",
                note="the NodePool's state is written at each phase, a failure only shown: here none "
                "landed, so the pool has no state for the target (the planner would ask for its rollout "
                "again; no drifted node is left). A write lost after one landed leaves it stale: "
                "rollout/halted",
            )
            for f in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
    },
)
HALTED = Path(
    "rollout/halted",
    RolloutWorkflow,
    "the same rollout, its canary's replacement NotReady: the gate fails wave 1, the run waits Halted, "
    "then the operator aborts it with `rollback` (marks off, the node it launched marked)",
    reaches=(
        "unmark_rollout_nodes",
        "sync_rollout_state#2",
        "NotificationWorkflow",
        "unmark_rollout_nodes#2",
        "mark_rollout_wave#2",
    ),
    child=Outcome(COMPLETED, "Aborted", left(MARK), waits="Halted", note=NOTIFIED),
    fails=Outcome(COMPLETED, "Aborted", left(MARK), waits="Halted", note=ROLLED_BACK),
    recovers=Outcome(COMPLETED, "Aborted", left(MARK), waits="Halted", note=ROLLED_BACK),
    cancelled=Outcome(CANCELED, "Canceled", note=ROLLOUT_CANCELLED),
    overrides={
        **{
            ("unmark_rollout_nodes", f): Outcome(
                COMPLETED,
                "Aborted",
                left(MARK),
                waits="Halted",
                note="the halt could not take the canary's mark off (the message says so): the planner "
                "goes on replacing it while halted; here the abort's unmark fails too, so it keeps it",
            )
            for f in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        **{
            ("sync_rollout_state#2", f): Outcome(
                COMPLETED,
                "Aborted",
                left(MARK, STATE),
                waits="Halted",
                note="every write from the halt on fails: the NodePool's state still says Rolling, and "
                "the planner holds the pool's drift toward the target for a wave that never comes (a write "
                "that fails only at the halt is written again by the next halted poll)",
            )
            for f in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        **{
            ("mark_rollout_wave#2", f): Outcome(
                COMPLETED,
                "Aborted",
                waits="Halted",
                note="the rollback is lost: the message says the launched nodes could not be marked, and "
                "nothing tries again (`kubectl annotate node ... karpflow.dev/rollout-requested=...`)",
            )
            for f in (Fault.PERMANENT, Fault.EXHAUSTED)
        },
        **{
            (step, Fault.CANCELLED): Outcome(CANCELED, "Canceled", waits="Halted", note=ROLLOUT_CANCELLED)
            for step in ("unmark_rollout_nodes#2", "mark_rollout_wave#2")  # cancelled while it aborts
        },
    },
)

DRAIN_STUCK = Path(
    "termination/drain-stuck",
    TerminationWorkflow,
    "a drain that goes on past drain_stuck: the operator's webhook is told, the drain goes on",
    reaches=("NotificationWorkflow",),
    primary=("drain_node", Fault.START_TO_CLOSE),
    fails=Outcome(COMPLETED, "Succeeded"),
    recovers=Outcome(COMPLETED, "Succeeded"),
    cancelled=Outcome(COMPLETED, "Succeeded"),
    child=Outcome(COMPLETED, "Succeeded", note=NOTIFIED),
)
NOTIFY = Path(
    "notification",
    NotificationWorkflow,
    "one message to the operator's webhook (started by the paths above, here on its own)",
    reaches=("send_notification",),
    fails=Outcome(
        FAILED,
        "",
        note="the webhook refused it, or it was down for NOTIFY_FOR: the message is lost, the run says why",
    ),
    recovers=Outcome(COMPLETED, ""),
    cancelled=Outcome(CANCELED, ""),
)

PATHS: tuple[Path, ...] = (
    CONTROLLER_PASS,
    REPLACE,
    ROLLBACK,
    APPROVAL,
    BESIDE_KARPENTER,
    NODECLAIM_ROLLBACK,
    FORCEFUL,
    SPOT,
    MANUAL,
    NOT_READY,
    FAILING,
    HANDOVER,
    INTERRUPTED,
    ROLLS,
    ROLLOUT_CANCEL,
    WAVES,
    HALTED,
    DRAIN_STUCK,
    NOTIFY,
)


@dataclass(frozen=True)
class Cell:
    path: Path
    target: str  # an activity (`name` or `name#n`) or a child workflow type
    fault: Fault

    @property
    def id(self) -> str:
        return f"{self.path.key}:{self.target}:{self.fault.name.lower()}"

    @property
    def activity(self) -> str:
        return self.target.partition("#")[0]

    @property
    def call(self) -> int:
        return int(self.target.partition("#")[2] or 1)

    @property
    def is_child(self) -> bool:
        return self.fault in CHILD_FAULTS

    @property
    def expected(self) -> Outcome:
        return self.path.outcome(self.target, self.fault)


def faults_for(path: Path, target: str) -> tuple[Fault, ...]:
    name = path.workflow.__temporal_workflow_definition.name  # type: ignore[attr-defined]
    if target in path.workflow.CHILDREN:
        return CHILD_FAULTS if name != "ControllerWorkflow" else (Fault.CHILD_FAILS, Fault.CHILD_TERMINATED)
    return tuple(f for f in ACTIVITY_FAULTS if f != Fault.HEARTBEAT or (name, target) in HEARTBEATS)


def cells() -> list[Cell]:
    return [
        Cell(path, target, fault)
        for path in PATHS
        for target in path.reaches
        for fault in faults_for(path, target)
    ]


def workflow_name(workflow: type) -> str:
    return str(workflow.__temporal_workflow_definition.name)  # type: ignore[attr-defined]


def workflow_modules(workflow: type) -> list[ModuleType]:
    """The modules a workflow's code is in: its class's, and those of the parts it inherits from
    workflows/ (DisruptionWorkflow's mixins: disruption_approval.py, disruption_replacements.py, ...)."""
    modules = []
    for cls in workflow.__mro__:
        module = inspect.getmodule(cls)
        if module is not None and module.__name__.startswith("workflows.") and module not in modules:
            modules.append(module)
    return modules


def unreached() -> list[str]:
    """Activities and children some workflow calls that no path gives cells (nor LEGACY explains)."""
    missing = []
    for workflow in WORKFLOWS:
        reached = {t.partition("#")[0] for p in PATHS if p.workflow is workflow for t in p.reaches}
        for name in (*workflow.ACTIVITIES, *workflow.CHILDREN):
            if name not in reached and (workflow_name(workflow), name) not in LEGACY:
                missing.append(f"{workflow_name(workflow)}: {name}")
    return missing


# -- the table -------------------------------------------------------------------------------------------

FAULT_COLUMNS = (*ACTIVITY_FAULTS, *CHILD_FAULTS)


def markdown() -> str:
    """The outcome of every cell, one row per (path, activity or child); the notes below the table."""
    notes: dict[str, int] = {}
    lines = [
        "| path | activity or child | " + " | ".join(str(f) for f in FAULT_COLUMNS) + " |",
        "|" + "---|" * (2 + len(FAULT_COLUMNS)),
    ]
    for path in PATHS:
        for target in path.reaches:
            row = [f"`{path.key}`", f"`{target}`"]
            applicable = faults_for(path, target)
            for fault in FAULT_COLUMNS:
                if fault not in applicable:
                    row.append("")
                    continue
                outcome = path.outcome(target, fault)
                text = outcome.cell()
                if outcome.note:
                    number = notes.setdefault(outcome.note, len(notes) + 1)
                    text += f" [{number}]"
                row.append(text)
            lines.append("| " + " | ".join(row) + " |")
    count = len(cells())
    lines += ["", f"{count} cells. Notes:", ""]
    lines += [f"{number}. {note}" for note, number in notes.items()]
    lines += ["", "Paths:", ""]
    lines += [
        f"- `{p.key}`: {p.title}" + (f" (reached by: {p.primary[0]} {p.primary[1]})" if p.primary else "")
        for p in PATHS
    ]
    lines += [
        "",
        "No cells (only runs started before a patch call them; the recorded histories replay them):",
        "",
    ]
    lines += [f"- {workflow} `{activity}`: {why}" for (workflow, activity), why in LEGACY.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
