"""Inputs, results and query views of karpflow's workflows.

These are the JSON documents a person types into `temporal workflow start --input` and reads back
from `temporal workflow query` / the Web UI, so field names are plain snake_case, durations are Go
strings ("10m", "90s") or numbers of seconds, and unknown fields are refused (a typo must not be
silently ignored). A minimal disruption, by hand:

    {"reason": "Drifted", "nodes": ["ip-10-0-1-7.us-west-2.compute.internal"],
     "replacements": [{"nodepool": "default", "instance_types": ["m5.large", "m5.xlarge"],
                       "zones": ["us-west-2a"]}]}

The workflows receive the raw JSON and validate it themselves (see `parse_input`), so a bad input
fails the workflow at once with a message naming the field instead of failing workflow tasks forever.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from api import workflow_ids
from api.duration import format_duration, parse_duration
from api.karpflow_overrides import read_overrides

Reason = Literal[
    "Underutilized", "Empty", "Drifted", "Expired", "Interrupted", "Unhealthy", "NodePoolDeleted", "Manual"
]
# Voluntary reasons: budgets, do-not-disrupt and validation apply, and a command that cannot provide its
# replacements rolls back. Every other reason is forceful: the candidates go whatever happens, and the
# replacements are capacity bought ahead for their pods (karpenter-behavior.md §7).
VOLUNTARY_REASONS: frozenset[str] = frozenset({"Underutilized", "Empty", "Drifted"})
CapacityType = Literal["on-demand", "spot", "reserved"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


def _to_timedelta(value: Any) -> Any:
    if isinstance(value, str | int | float | timedelta):
        return parse_duration(value)
    return value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError(f"must be longer than 0s, got {format_duration(value)}")
    return value


def _not_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError(f"must not be negative, got {format_duration(value)}")
    return value


# "10m", "1h30m", 600 (seconds) on input; always the Go text on output, so query results read well.
# Negative durations are refused (the server would reject them as timeouts, leaving the workflow
# stuck); timeouts must also be longer than zero.
GoDuration = Annotated[
    timedelta,
    BeforeValidator(_to_timedelta),
    AfterValidator(_not_negative),
    PlainSerializer(format_duration),
]
Timeout = Annotated[GoDuration, AfterValidator(_positive)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaintSpec(Strict):
    key: str = Field(min_length=1)
    value: str | None = None
    effect: TaintEffect

    def kubelet(self) -> str:
        """`key=value:Effect` (or `key:Effect`), the syntax of kubelet's --register-with-taints."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


class Offering(Strict):
    """One place a replacement can be launched: an instance type in a zone with a capacity type."""

    instance_type: str = Field(min_length=1)
    zone: str = Field(min_length=1)
    capacity_type: CapacityType = "on-demand"
    # A reserved offering's capacity reservation (planner/reservations.py): launched into it only.
    reservation_id: str | None = Field(default=None, pattern=r"^cr-[0-9a-z]+$")
    reservation_type: Literal["default", "capacity-block"] = "default"
    interruptible: bool = False

    @model_validator(mode="after")
    def _reservation_when_reserved(self) -> Offering:
        if (self.capacity_type == "reserved") != (self.reservation_id is not None):
            raise ValueError("a reserved offering names its reservation_id, and only a reserved one does")
        return self

    @property
    def key(self) -> str:
        base = f"{self.instance_type}/{self.zone}/{self.capacity_type}"
        return f"{base}/{self.reservation_id}" if self.reservation_id else base


_ON_DEMAND: list[CapacityType] = ["on-demand"]


class ReplacementSpec(Strict):
    """A node to launch before the candidates go.

    `instance_types` is in price order (cheapest first). The offerings tried are, in order: each
    capacity type, then each instance type, then each zone; `zones` empty means every zone the
    EC2NodeClass has a subnet in. `offerings`, when given, is the exact order instead. Labels,
    annotations and taints here are added to the NodePool template's own.
    """

    nodepool: str = Field(min_length=1)
    nodeclass: str | None = Field(
        default=None, description="EC2NodeClass; default: the NodePool's nodeClassRef"
    )
    instance_types: list[str] = Field(default_factory=list)
    zones: list[str] = Field(default_factory=list)
    capacity_type: list[CapacityType] = Field(default_factory=lambda: _ON_DEMAND.copy())
    offerings: list[Offering] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    startup_taints: list[TaintSpec] = Field(default_factory=list)
    min_values: dict[str, int] = Field(
        default_factory=dict,
        description="the minValues the replacement's requirements carry per label key (lowered under "
        "MinValuesPolicy BestEffort); written on a NodeClaim made for it",
    )
    image_id: str | None = Field(
        default=None, description="AMI override; default: from the EC2NodeClass status"
    )

    @field_validator("capacity_type", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("capacity_type")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one capacity type is needed")
        return value

    @model_validator(mode="after")
    def _something_to_launch(self) -> ReplacementSpec:
        if not self.instance_types and not self.offerings:
            raise ValueError("give instance_types (cheapest first) or an explicit offerings list")
        if "reserved" in self.capacity_type and not self.offerings:
            raise ValueError("a reserved replacement names its reservations: give the offerings list")
        return self

    def offering_order(self, known_zones: list[str]) -> list[Offering]:
        """The offerings to try, in order, given the zones the EC2NodeClass can launch into."""
        if self.offerings:
            return list(self.offerings)
        zones = self.zones or known_zones
        return [
            Offering(instance_type=instance_type, zone=zone, capacity_type=capacity_type)
            for capacity_type in self.capacity_type
            for instance_type in self.instance_types
            for zone in zones
        ]


class DisruptionTimeouts(Strict):
    replacement_ready: Timeout = Field(
        default=timedelta(minutes=10), description="launch to initialized, per replacement"
    )
    heartbeat: Timeout = Field(
        default=timedelta(seconds=30),
        description="how soon a dead worker's long activity is retried elsewhere",
    )
    unavailable_offering_ttl: GoDuration = Field(
        default=timedelta(minutes=3),
        description="how long an offering that hit InsufficientInstanceCapacity is skipped",
    )


class TerminationTimeouts(Strict):
    heartbeat: Timeout = timedelta(seconds=30)
    drain_attempt: Timeout = Field(
        default=timedelta(hours=1),
        description="one drain activity attempt; a longer drain is retried and resumes",
    )
    volume_detach: Timeout = timedelta(minutes=10)
    instance_terminate: Timeout = timedelta(minutes=10)
    drain_stuck: timedelta | None = Field(
        default=timedelta(minutes=30),
        gt=timedelta(0),
        description="a drain still going after this long is reported to the operator's webhook once "
        "(null: never)",
    )


class TerminationInput(Strict):
    """Terminate one node: `{"node": "ip-10-0-1-7.us-west-2.compute.internal"}` is enough; with `uid`
    (its metadata.uid) the workflow is pinned to that node, and a node that reuses the name later is
    never touched. Without it, the node found at the start is the one pinned."""

    node: str = Field(min_length=1)
    uid: str | None = Field(default=None, description="the node's metadata.uid: which node of that name")
    reason: Reason = "Manual"
    provider_id: str | None = Field(default=None, description="aws:///<zone>/<instance-id>, when known")
    command_id: str | None = Field(default=None, description="the disruption workflow that asked for it")
    termination_grace_period: GoDuration | None = Field(
        default=None, description="overrides the NodePool's terminationGracePeriod; 0s drains forcefully"
    )
    deadline: datetime | None = Field(
        default=None,
        description="when every pod must be gone (e.g. a spot interruption's time): the drain deadline is "
        "the earlier of this and deletion + terminationGracePeriod",
    )
    timeouts: TerminationTimeouts = Field(default_factory=TerminationTimeouts)
    notify: bool = Field(
        default=False,
        description="tell the operator's webhook when the drain is stuck or the termination fails "
        "(set by a worker with --notify-webhook-secret)",
    )


class Approval(Strict):
    """The NodePool asks an operator to approve the command before it takes any node (annotation
    `karpflow.dev/require-approval`): the workflow waits in phase AwaitingApproval for the `approve`
    or `reject` update; no decision within `timeout` rejects it. Rejected: nothing changed."""

    timeout: timedelta = Field(default=timedelta(hours=24), gt=timedelta(0))
    savings_per_hour: float = Field(default=0.0, description="the planner's estimate, shown while waiting")
    planned: dict[str, Any] | None = Field(
        default=None,
        description="the planner's form of the command (CommandOut JSON): judged again on a fresh view "
        "when the wait ends, before any node is taken (planner/waiting_validation.py)",
    )
    recheck_every: timedelta = Field(
        default=timedelta(minutes=5),
        gt=timedelta(0),
        description="while it waits, the command is judged again this often (--approval-recheck-interval)",
    )


class ApprovalDecision(Strict):
    """The `approve` and `reject` updates' input (optional): who decided, and why."""

    by: str = Field(default="", max_length=200)
    reason: str = Field(default="", max_length=500)


class DisruptionInput(Strict):
    """A command. Voluntary reasons (Underutilized, Empty, Drifted) roll back when a replacement fails;
    forceful ones (Expired, Interrupted, Unhealthy, NodePoolDeleted, Manual) wait for their replacements
    at most `timeouts.replacement_ready` and then terminate the candidates anyway, or, with
    `termination_deadline`, start terminating at once and launch the replacements alongside."""

    reason: Reason
    nodes: list[str] = Field(min_length=1, description="candidate node names")
    node_uids: dict[str, str] = Field(
        default_factory=dict,
        description="node name -> the metadata.uid the command was decided for; a node of that name "
        "with another UID (the name was reused) is not taken. Nodes not listed are pinned when tainted",
    )
    replacements: list[ReplacementSpec] = Field(default_factory=list)
    termination_deadline: datetime | None = Field(
        default=None,
        description="forceful only: every pod must be gone by then (e.g. a spot interruption's time); the "
        "candidates are drained at once instead of after their replacements",
    )
    timeouts: DisruptionTimeouts = Field(default_factory=DisruptionTimeouts)
    termination: TerminationTimeouts = Field(default_factory=TerminationTimeouts)
    approval: Approval | None = Field(default=None, description="voluntary only: wait for an operator first")
    capacity_buffers: dict[str, int] | None = Field(
        default=None,
        description="Empty: the ready CapacityBuffers the planner accounted for (namespace/name -> "
        "replicas); the taint refuses the nodes if one is new or bigger. Unset: not checked",
    )
    notify: bool = Field(
        default=False,
        description="tell the operator's webhook when it awaits approval or fails, and its terminations "
        "when a drain is stuck (set by the controller of a worker with --notify-webhook-secret)",
    )

    @field_validator("nodes")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("candidate node names must be distinct")
        if any(not name for name in value):
            raise ValueError("node names must not be empty")
        return value

    @model_validator(mode="after")
    def _uids_of_candidates(self) -> DisruptionInput:
        # A command narrowed to a subset of its nodes (emptiness validation keeps the nodes still
        # valid) may carry the UIDs of the ones it dropped: they pin nothing.
        self.node_uids = {node: uid for node, uid in self.node_uids.items() if node in self.nodes}
        return self

    @model_validator(mode="after")
    def _deadline_is_forceful(self) -> DisruptionInput:
        if self.approval is not None and not self.voluntary:
            raise ValueError(
                "approval: only a voluntary command waits for an operator (forceful work never waits)"
            )
        if self.termination_deadline is not None and self.voluntary:
            raise ValueError(f"termination_deadline is for forceful reasons, not {self.reason}")
        return self

    @property
    def voluntary(self) -> bool:
        return self.reason in VOLUNTARY_REASONS


# -- What the workflows report (query results and return values) ---------------------------------

DisruptionPhase = Literal[
    "Validating",
    "AwaitingApproval",
    "Rejected",
    "Invalidated",
    "Tainting",
    "Launching",
    "WaitingForReplacements",
    "Terminating",
    "Succeeded",
    "RollingBack",
    "RolledBack",
    "Failed",
    "Canceled",
]
ReplacementState = Literal[
    "Pending", "Launching", "Launched", "Registered", "Initialized", "Failed", "Discarded"
]
TerminationState = Literal["NotStarted", "Running", "AlreadyRunning", "Succeeded", "Failed"]


class UnavailableOffering(BaseModel):
    offering: str
    until: datetime
    error: str


class ReplacementStatus(BaseModel):
    index: int
    nodepool: str
    state: ReplacementState = "Pending"
    offering: Offering | None = None
    instance_id: str | None = None
    node: str | None = None
    nodeclaim: str | None = Field(
        default=None, description="beside Karpenter: the NodeClaim Karpenter launches it from"
    )
    message: str = ""


class CandidateStatus(BaseModel):
    node: str
    uid: str | None = None
    tainted: bool = False
    provider_id: str | None = None
    termination_id: str | None = Field(default=None, description="its TerminationWorkflow's id")
    termination: TerminationState = "NotStarted"
    message: str = ""


class DisruptionStatus(BaseModel):
    command_id: str = ""
    reason: str = ""
    forceful: bool = False
    phase: DisruptionPhase = "Validating"
    candidates: list[CandidateStatus] = Field(default_factory=list)
    replacements: list[ReplacementStatus] = Field(default_factory=list)
    unavailable_offerings: list[UnavailableOffering] = Field(default_factory=list)
    message: str = ""


TerminationPhase = Literal[
    "Starting",
    "Waiting",
    "Tainting",
    "Draining",
    "WaitingForKarpenter",
    "WaitingForVolumes",
    "TerminatingInstance",
    "RemovingFinalizer",
    "Succeeded",
    "Failed",
    "Canceled",
]


class TerminationStatus(BaseModel):
    node: str = ""
    uid: str | None = None
    reason: str = ""
    phase: TerminationPhase = "Starting"
    instance_id: str | None = None
    deadline: datetime | None = None
    pods_evicted: int = 0
    pods_deleted: int = 0
    waiting_for: str = Field(
        default="", description="while Waiting: the MaintenanceWindow or NodeDisruptionBudget it waits for"
    )
    message: str = ""


# -- Validation inside the workflow ----------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


class InvalidInput(ValueError):
    """The workflow input does not validate; the message names each bad field."""


def describe_validation_error(err: ValidationError) -> str:
    parts = []
    for problem in err.errors(include_url=False):
        location = ".".join(str(p) for p in problem["loc"]) or "(input)"
        parts.append(f"{location}: {problem['msg']}")
    return "; ".join(parts)


def parse_input(model: type[M], raw: Any) -> M:
    """Validate a workflow input that arrived as raw JSON (or as the model itself)."""
    if isinstance(raw, model):
        return raw
    if raw is None:
        raise InvalidInput(f"invalid {model.__name__}: no input given (expected a JSON object)")
    if not isinstance(raw, dict):
        raise InvalidInput(f"invalid {model.__name__}: expected a JSON object, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise InvalidInput(f"invalid {model.__name__}: {describe_validation_error(err)}") from None


# -- From the planner ------------------------------------------------------------------------------


def disruption_input(
    command: Any,
    *,
    planned: dict[str, Any] | None = None,
    recheck_every: timedelta | None = None,
    **overrides: Any,
) -> DisruptionInput:
    """The DisruptionWorkflow input for a planner `Command` (planner/model.py; duck-typed so this
    module stays free of the planner): its reason, candidates (names, pinned to the UIDs the planner
    saw) and replacements, instance types cheapest first. `planned`: the planner's form of the
    command (CommandOut JSON), kept in the approval of a command that waits for one, so the wait's end
    judges it again."""
    uids = {c.name: c.node.uid for c in getattr(command, "candidates", ()) if getattr(c.node, "uid", "")}
    if "approval" not in overrides and (approval := approval_for(command)) is not None:
        update: dict[str, Any] = {"planned": planned}
        if recheck_every is not None:
            update["recheck_every"] = recheck_every
        overrides["approval"] = approval.model_copy(update=update)
    return DisruptionInput(
        reason=command.reason,
        nodes=list(command.nodes),
        node_uids=uids,
        replacements=[
            ReplacementSpec(
                nodepool=replacement.nodepool,
                instance_types=list(replacement.instance_type_names),
                zones=list(replacement.zones),
                capacity_type=[replacement.capacity_type],
                offerings=reserved_offerings(replacement),
                annotations=dict(getattr(replacement, "annotations", None) or {}),
                min_values=dict(getattr(replacement, "min_values", None) or {}),
            )
            for replacement in command.replacements
        ],
        capacity_buffers=getattr(command, "capacity_buffers", None),
        **overrides,
    )


def reserved_offerings(replacement: Any) -> list[Offering]:
    """A reserved replacement's launch offerings: the reservations the plan took for it
    (`Replacement.reserved`: (instance type, catalog offering) pairs), in its type order; none for
    any other replacement."""
    out = []
    for instance_type, offering in getattr(replacement, "reserved", None) or ():
        reservation = offering.reservation
        out.append(
            Offering(
                instance_type=instance_type,
                zone=offering.zone,
                capacity_type="reserved",
                reservation_id=reservation.id,
                reservation_type=reservation.reservation_type,
                interruptible=reservation.interruptible,
            )
        )
    return out


def approval_for(command: Any) -> Approval | None:
    """An Approval when a NodePool of the command's candidates requires one for its reason
    (`karpflow.dev/require-approval`), with the shortest `karpflow.dev/approval-timeout` of those
    pools (24h where none sets one); forceful commands never wait."""
    if command.reason not in VOLUNTARY_REASONS:
        return None
    timeouts: list[timedelta] = []
    required_somewhere = False
    for candidate in getattr(command, "candidates", ()):
        pool = getattr(candidate, "nodepool", None)
        annotations = getattr(getattr(pool, "metadata", None), "annotations", None) or {}
        overrides = read_overrides(annotations)[0]
        if command.reason in (overrides.require_approval or []):
            required_somewhere = True
            if overrides.approval_timeout is not None:
                timeouts.append(overrides.approval_timeout)
    if not required_somewhere:
        return None
    savings = round(getattr(command, "savings_per_hour", 0.0) or 0.0, 4)
    if timeouts:
        return Approval(savings_per_hour=savings, timeout=min(timeouts))
    return Approval(savings_per_hour=savings)


def disruption_workflow_id(command: Any, cluster: str) -> str:
    """The workflow id of a planner `Command` in `cluster` (see api.workflow_ids)."""
    return workflow_ids.disruption_workflow_id(cluster, command.nodepools, command.reason, command.id)
