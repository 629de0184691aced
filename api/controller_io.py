"""What other parts of karpflow tell the ControllerWorkflow (signals) and read from it (queries).

Kept apart from the controller's code so that the interruption handler, the CLI and the tests speak
to it without importing it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.garbage_io import GarbageCollectionResult
from api.maintenance_window import WINDOW_ACTIONS, WindowAction
from api.node_reasons import ReasonsUpdate
from api.rollout_io import RolloutInput

# Signal names of the ControllerWorkflow (workflows/controller.py). A signal whose input does not
# validate is dropped and listed in the status query's `bad_signals`; it never fails the workflow.
SIGNAL_OFFERING_UNAVAILABLE = "offering_unavailable"
SIGNAL_STOP = "stop"  # `karpflow controller stop`: finish, and close as completed (workers leave it so)
# Updates (validated: a bad request is rejected to the caller and never reaches the history).
UPDATE_PAUSE = "pause"
UPDATE_RESUME = "resume"
# Queries: `status` (ControllerStatus), and `pauses` (Pauses), what every voluntary path outside the
# controller's own passes reads before it takes a node (activities/controls_gate.py).
QUERY_STATUS = "status"
QUERY_PAUSES = "pauses"


class OfferingUnavailable(BaseModel):
    """An offering the planner must not choose for replacements until `until` (e.g. the spot pool of an
    instance that just received an interruption warning; Karpenter: 3 minutes)."""

    instance_type: str
    zone: str
    capacity_type: str = "spot"
    until: datetime
    reason: str = Field(
        default="", description="why, for the status query (e.g. 'spot interruption of i-0abc')"
    )

    @property
    def key(self) -> str:
        return f"{self.instance_type}/{self.zone}/{self.capacity_type}"


# -- The ControllerWorkflow's input, its activities' documents, and its status ----------------------

SIGNAL_WAKE = "wake"  # run a pass now instead of at the end of the interval


class Backoff(BaseModel):
    """A NodePool whose commands for `reason` failed: no new voluntary command for it until `until`."""

    nodepool: str
    reason: str
    failures: int
    until: datetime
    last_failure: str = Field(default="", description="the failed workflow and its message")


class StopRequest(BaseModel):
    """The `stop` signal's input (optional): who stops the controller, and why."""

    reason: str = ""
    by: str = ""


class ControllerStopped(BaseModel):
    """The result of a ControllerWorkflow: it only completes when an operator stopped it, so a
    completed controller is one the workers' supervision leaves alone (runtime/controller_start.py)."""

    reason: str = ""
    by: str = ""
    at: datetime
    passes: int = 0
    state: ControllerState | None = Field(
        default=None,
        description="what the next run carries over when an operator starts it again (pauses, backoffs)",
    )


class HeldCommand(BaseModel):
    """A command this controller started that Temporal visibility may not list yet (it is eventually
    consistent): its nodes stay out of planning until a pass sees the workflow in flight."""

    nodes: list[str]
    since: datetime


PauseScope = Literal["global", "nodepool", "action"]


class PauseRequest(BaseModel):
    """The `pause` and `resume` updates' input: `{"scope": "global"}`, `{"scope": "nodepool",
    "nodepool": "gpu"}` or `{"scope": "action", "action": "Drift"}`; `reason` and `by` are shown."""

    model_config = ConfigDict(extra="forbid")

    scope: PauseScope = "global"
    nodepool: str | None = Field(default=None, min_length=1)
    action: WindowAction | None = None
    reason: str = Field(default="", max_length=500)
    by: str = Field(default="", max_length=200)

    @model_validator(mode="after")
    def _target_matches_scope(self) -> PauseRequest:
        if (self.scope == "nodepool") != (self.nodepool is not None):
            raise ValueError('a "nodepool" pause names the NodePool in "nodepool", and only that scope does')
        if (self.scope == "action") != (self.action is not None):
            raise ValueError(
                f'an "action" pause names one of {", ".join(WINDOW_ACTIONS)} in "action", '
                "and only that scope does"
            )
        return self

    @property
    def key(self) -> str:
        """One pause per target: pausing it again replaces the reason."""
        if self.scope == "nodepool":
            return f"nodepool/{self.nodepool}"
        if self.scope == "action":
            return f"action/{self.action}"
        return "global"


class Pause(PauseRequest):
    """A pause in force: new commands it covers are not started; commands in flight finish."""

    since: datetime

    def describe(self) -> str:
        what = {"global": "everything", "nodepool": f"NodePool {self.nodepool}", "action": f"{self.action}"}
        who = f" by {self.by}" if self.by else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{what[self.scope]}{who}{why}"


class Pauses(BaseModel):
    """What `pause` and `resume` return: the pauses in force afterwards."""

    pauses: list[Pause] = Field(default_factory=list)


class ControllerState(BaseModel):
    """What a ControllerWorkflow carries over continue-as-new."""

    backoffs: dict[str, Backoff] = Field(default_factory=dict, description="'<pool>/<reason>' -> backoff")
    unavailable: dict[str, OfferingUnavailable] = Field(default_factory=dict)
    failures_seen_until: datetime | None = Field(
        default=None, description="failed commands that closed before this were already counted"
    )
    passes: int = 0
    holding: dict[str, HeldCommand] = Field(
        default_factory=dict, description="workflow id -> a started command not yet seen in flight"
    )
    counted_failures: dict[str, datetime] = Field(
        default_factory=dict,
        description="failed commands already counted ('<workflow id>@<run id>' -> when they closed), "
        "for as long as a pass's look-back can still list them",
    )
    pauses: dict[str, Pause] = Field(default_factory=dict, description="pause key -> the pause in force")
    garbage_collected_at: datetime | None = Field(
        default=None,
        description="when the last garbage collection was asked (activities/garbage_collection.py)",
    )
    garbage: GarbageCollectionResult | None = Field(default=None, description="the last collection's result")


class ControllerInput(BaseModel):
    """`{"cluster": "dev"}` is enough; the other fields are the defaults of Karpenter's loop."""

    cluster: str = Field(min_length=1)
    task_queue: str = "karpflow"
    interval_seconds: float = Field(default=10.0, gt=0, description="between passes that started nothing")
    validation_seconds: float = Field(
        default=15.0, ge=0, description="consolidation commands wait this long, then are re-checked"
    )
    passes_per_run: int = Field(
        default=100, ge=1, description="passes before continue-as-new (each pass adds about 10-30 events)"
    )
    backoff_initial_seconds: float = Field(default=60.0, gt=0)
    backoff_max_seconds: float = Field(default=600.0, gt=0)
    # Temporal fails a workflow at 50 MB or 51,200 events of history; a run continues as new well
    # before, at whichever comes first of these, Temporal's own suggestion, and `passes_per_run`.
    max_history_bytes: int = Field(default=4 * 1024 * 1024, gt=0, description="continue as new past this")
    max_history_events: int = Field(default=10_000, gt=0, description="continue as new past this")
    # Temporal refuses a run more than 2,000 children still open (limit.numPendingChildExecutions):
    # a run that started this many still running continues as new (its children run on, abandoned).
    max_open_children: int = Field(default=1000, gt=0, description="continue as new past this")
    # The garbage collection of karpflow's own launches (docs/garbage-collection.md).
    gc_interval_seconds: float = Field(
        default=120.0, ge=0, description="between garbage collections (Karpenter's: 2 min); 0: none"
    )
    gc_grace_seconds: float = Field(
        default=30.0, ge=0, description="a closed command's instance with no Node is collected past this age"
    )
    gc_registration_ttl_seconds: float = Field(
        default=900.0,
        ge=0,
        description="a closed command's instance whose Node never initialized is collected past this age",
    )
    state: ControllerState = Field(default_factory=ControllerState)


class PlannedCommand(BaseModel):
    """One command of a pass, ready to start: its workflow id and input, and the planner's own form
    (kept to re-validate it on a fresh view)."""

    workflow_id: str
    method: str
    reason: str
    nodes: list[str]
    nodepools: list[str]
    forceful: bool
    needs_validation: bool
    savings_per_hour: float = 0.0
    input: dict[str, Any] = Field(description="the DisruptionInput, as JSON")
    planned: dict[str, Any] = Field(description="the planner's CommandOut, as JSON")
    # For the Web UI and the metrics (absent in results of older workers: the controller falls back).
    decision: str = Field(default="", description="delete or replace")
    consolidation_type: str = Field(default="", description="empty, multi, single, optimal or '' (drift)")
    summary: str = Field(default="", description="the workflow's one-line static summary")
    details: str = Field(default="", description="the workflow's static details (Markdown)")
    memo: dict[str, Any] = Field(
        default_factory=dict, description="the workflow's memo: what started it, why, estimated savings"
    )


class FailedCommand(BaseModel):
    workflow_id: str
    run_id: str = ""
    nodepools: list[str]
    reason: str
    closed_at: datetime
    message: str = Field(default="", description="why it failed: its innermost cause, quoted")

    @property
    def key(self) -> str:
        """One failed run (ids are reused by a command planned again once its run closed)."""
        return f"{self.workflow_id}@{self.run_id or self.closed_at.isoformat()}"


class PassRequest(BaseModel):
    holding: list[str] = Field(
        default_factory=list, description="nodes of commands started that visibility may not list yet"
    )
    unavailable: list[OfferingUnavailable] = Field(default_factory=list)
    failures_since: datetime | None = None
    counted_failures: list[str] = Field(
        default_factory=list, description="failed commands (workflow id@run id) the controller counted"
    )
    backoffs: list[Backoff] = Field(
        default_factory=list,
        description="NodePools backing off a reason: the planner gives their budget to the other pools",
    )
    reasons_base: str = Field(
        default="",
        description="fingerprint of the per-node reasons the controller holds: the result sends only "
        "changes to them ('' : send every reason)",
    )
    pauses: list[Pause] = Field(
        default_factory=list, description="operator pauses: windows of the pass that block what they cover"
    )


class ControlCondition(BaseModel):
    """The Valid condition a MaintenanceWindow or NodeDisruptionBudget should have (written only when
    it differs from what the object has)."""

    kind: Literal["MaintenanceWindow", "NodeDisruptionBudget"]
    name: str
    valid: bool
    message: str = ""


class ControlsUpkeep(BaseModel):
    """What a pass found to tidy on the operator's controls: conditions to write, stale claims."""

    conditions: list[ControlCondition] = Field(default_factory=list)
    stale_claims: int = Field(default=0, description="claims whose node is gone or whose holder stopped")
    running: list[str] = Field(
        default_factory=list, description="workflow ids in flight (claims they hold stay)"
    )

    @property
    def empty(self) -> bool:
        return not self.conditions and not self.stale_claims


class PassResult(BaseModel):
    at: datetime
    commands: list[PlannedCommand]
    reasons: ReasonsUpdate | None = Field(
        default=None, description="node -> why it was left alone, as changes (api/node_reasons.py)"
    )
    # Before `reasons` a result carried every node's reason in `blocked` and the waiting nodes in
    # `waiting` (recorded histories and a worker of the previous version still do).
    blocked: dict[str, str] = Field(default_factory=dict, description="node -> why it was left alone")
    waiting: list[str] = Field(
        default_factory=list, description="nodes that are only waiting (consolidateAfter, a timer)"
    )
    budgets: dict[str, dict[str, int]] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)
    breaker: str = Field(default="", description="why the cluster-health breaker is open (empty: closed)")
    in_flight: list[str] = Field(default_factory=list, description="running disruption/termination workflows")
    orphan_taints: list[str] = Field(
        default_factory=list, description="nodes tainted karpenter.sh/disrupted that no workflow holds"
    )
    annotations: list[dict[str, Any]] = Field(default_factory=list, description="planner AnnotationChanges")
    taints: list[dict[str, Any]] = Field(
        default_factory=list, description="planner TaintChanges: karpflow.io/leaving (Optimal consolidation)"
    )
    nodepool_finalizers: dict[str, bool] = Field(
        default_factory=dict,
        description="NodePool -> add (true) or remove (false) karpflow's finalizer (NODEPOOL_FINALIZER)",
    )
    failed: list[FailedCommand] = Field(default_factory=list)
    rollouts: list[RolloutInput] = Field(
        default_factory=list, description="drift rollouts to start (pools with a rollout policy)"
    )
    upkeep: ControlsUpkeep | None = Field(default=None, description="for sync_operator_controls")
    nodes: int = 0
    pods: int = 0
    seconds: float = 0.0


class ValidateRequest(BaseModel):
    commands: list[PlannedCommand]
    holding: list[str] = Field(
        default_factory=list, description="nodes of commands started that visibility may not list yet"
    )
    pauses: list[Pause] = Field(default_factory=list)


class Verdict(BaseModel):
    workflow_id: str
    valid: bool
    reason: str = ""
    command: PlannedCommand | None = Field(default=None, description="what to start (may be a subset)")


class ControllerStatus(BaseModel):
    """The `status` query: what the last pass saw and did, and what is in flight."""

    cluster: str = ""
    passes: int = 0
    last_pass_at: datetime | None = None
    last_pass_seconds: float = 0.0
    last_pass_nodes: int = 0
    started: list[str] = Field(default_factory=list, description="workflow ids the last pass started")
    rejected: dict[str, str] = Field(default_factory=dict, description="workflow id -> why it was refused")
    blocked: dict[str, str] = Field(default_factory=dict)
    budgets: dict[str, dict[str, int]] = Field(default_factory=dict)
    in_flight: list[str] = Field(default_factory=list)
    validating: list[str] = Field(default_factory=list)
    backoffs: list[Backoff] = Field(default_factory=list)
    unavailable: list[OfferingUnavailable] = Field(default_factory=list)
    cleaned_taints: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    waiting: list[str] = Field(default_factory=list)
    quiet: bool = Field(
        default=False,
        description="the last pass found nothing to do, nothing is in flight or validating, and no node "
        "is only waiting for consolidateAfter: the cluster has converged under the current rules",
    )
    error: str = Field(
        default="", description="what failed in the last pass (planning, clean-up, validation), if anything"
    )
    bad_signals: list[str] = Field(
        default_factory=list, description="signals this run dropped because their input did not validate"
    )
    stopping: str = Field(default="", description="set when an operator asked the controller to stop")
    pauses: list[Pause] = Field(default_factory=list, description="operator pauses in force")
    breaker: str = Field(
        default="", description="the cluster-health breaker: why voluntary disruption waits (empty: closed)"
    )
    history_events: int = Field(default=0, description="events in this run's history so far")
    history_bytes: int = Field(default=0, description="size of this run's history so far")
    garbage: GarbageCollectionResult | None = Field(
        default=None, description="the last garbage collection of karpflow's own launches"
    )
