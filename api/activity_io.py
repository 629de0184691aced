"""Arguments and results of karpflow's activities.

They are recorded in workflow history, so they say what was decided (the resolved launch template,
the offering tried, the deadline) in a form a person can read in the Web UI.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.workflow_io import GoDuration, Offering, ReplacementSpec, TaintSpec

# -- Candidates ----------------------------------------------------------------------------------


class NodeRef(BaseModel):
    """A node by name, pinned to its metadata.uid when known: an activity given a UID acts only on
    the node with that UID, never on a later one that reuses the name."""

    node: str
    uid: str | None = None
    holder: str | None = Field(
        default=None,
        description="taint_for_termination: the termination's `<workflow id>@<run>`, recorded as the "
        "taint's holder when no command holds the node (kubectl delete node, interruption)",
    )
    reason: str | None = Field(default=None, description="taint_for_termination: the termination's reason")


class WaitingCommandCheck(BaseModel):
    """A command that waits (for approval): is its plan still good, and is approval still asked for?"""

    workflow_id: str = Field(
        description="the command's workflow id: its own nodes and starts are not another's"
    )
    reason: str
    nodes: list[str]
    node_uids: dict[str, str] = Field(default_factory=dict)
    planned: dict[str, Any] | None = Field(
        default=None, description="the planner's CommandOut (JSON); a command started by hand has none"
    )


class WaitingCommandVerdict(BaseModel):
    valid: bool
    reason: str = Field(default="", description="why the plan no longer holds")
    nodes: list[str] = Field(
        default_factory=list, description="the nodes still to take (a subset when narrowed)"
    )
    approval_required: bool = Field(description="a NodePool of the nodes still asks for approval")


class TerminationGateRequest(BaseModel):
    """May this termination take its node down now? (MaintenanceWindows, NodeDisruptionBudgets)"""

    node: str
    uid: str | None = None
    reason: str
    holder: str = Field(description="the termination's `<workflow id>@<first run id>`: the claim's holder")
    command_id: str | None = Field(default=None, description="the disruption that started it, if any")
    # When the gate opens the drain may begin, and its clock starts: the deadline is stamped then
    # (docs/workflow-changes.md, "When the drain's clock starts"). A termination of older code sends
    # neither; its begin_termination stamped the deadline.
    stamp_deadline: bool = Field(
        default=False, description="on go: stamp the drain deadline (now + terminationGracePeriod)"
    )
    termination_grace_period: GoDuration | None = Field(
        default=None, description="overrides the NodePool's terminationGracePeriod"
    )
    deadline: datetime | None = Field(
        default=None, description="a hard deadline (a spot interruption's): never postponed"
    )


class TerminationGate(BaseModel):
    go: bool
    waiting_for: str = Field(default="", description="'MaintenanceWindow X' or 'NodeDisruptionBudget Y'")
    message: str = ""
    deadline: datetime | None = Field(
        default=None, description="on go with stamp_deadline: the drain deadline now on the node"
    )


class TaintRequest(BaseModel):
    nodes: list[str]
    command_id: str
    reason: str = Field(
        default="", description="the command's reason: voluntary ones re-check do-not-disrupt"
    )
    uids: dict[str, str] = Field(default_factory=dict, description="node -> the UID it is pinned to")
    deadline: datetime | None = Field(
        default=None,
        description="forceful: every pod must be gone by then (a spot interruption's time); stamped on "
        "the node as its termination deadline, or moved earlier, never later",
    )
    capacity_buffers: dict[str, int] | None = Field(
        default=None,
        description="Empty: the ready CapacityBuffers the planner accounted for (namespace/name -> "
        "replicas); a new or bigger one leaves every candidate out. None: not checked",
    )


class CandidateNode(BaseModel):
    """Outcome of tainting one candidate; `ok` False says why in `message` (the workflow decides)."""

    node: str
    ok: bool
    uid: str | None = Field(default=None, description="the node's metadata.uid: what it is pinned to now")
    provider_id: str | None = None
    nodepool: str | None = None
    termination_id: str | None = Field(
        default=None, description="the workflow id of this node's termination (api.workflow_ids)"
    )
    message: str = ""


class UntaintRequest(BaseModel):
    nodes: list[str]
    command_id: str = Field(default="", description="only taints this command holds are removed")
    uids: dict[str, str] = Field(default_factory=dict, description="node -> the UID it is pinned to")
    rolled_back: str = Field(
        default="",
        description="set by a rollback (why): each node released gets a DisruptionRolledBack Event",
    )


# -- Replacements --------------------------------------------------------------------------------


class ResolveRequest(BaseModel):
    index: int
    spec: ReplacementSpec


class AmiChoice(BaseModel):
    id: str
    architectures: list[str] = Field(default_factory=list, description="empty: any architecture")


class LaunchTemplate(BaseModel):
    """Everything needed to launch and register one replacement, from the NodePool and EC2NodeClass."""

    nodepool: str
    nodeclass: str
    subnets: dict[str, str] = Field(description="zone -> subnet id")
    security_group_ids: list[str]
    amis: list[AmiChoice]
    instance_profile: str | None = None
    role: str | None = Field(default=None, description="for an instance profile when none is named")
    ami_family: str = "AL2023"
    user_data: str | None = Field(default=None, description="the EC2NodeClass userData, merged at launch")
    kubelet: dict[str, Any] | None = None
    associate_public_ip_address: bool | None = None
    detailed_monitoring: bool | None = None
    # Karpenter's shape, as the EC2NodeClass says it (launch/ec2_params.py makes RunInstances' of it).
    block_device_mappings: list[dict[str, Any]] = Field(default_factory=list)
    metadata_options: dict[str, Any] | None = None
    instance_store_policy: str | None = None
    ip_prefix_count: int | None = None
    enclave_options: dict[str, Any] | None = None
    zone_ids: dict[str, str] = Field(default_factory=dict, description="zone -> zone id (status.subnets)")
    instance_tags: dict[str, str] = Field(default_factory=dict, description="EC2NodeClass spec.tags")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    startup_taints: list[TaintSpec] = Field(default_factory=list)
    via_nodeclaim: bool = Field(
        default=False,
        description="beside Karpenter (--karpenter-coexistence): Karpenter launches the replacement from "
        "a NodeClaim karpflow creates, instead of karpflow launching an instance",
    )

    @property
    def zones(self) -> list[str]:
        return sorted(self.subnets)


class LaunchRequest(BaseModel):
    command_id: str
    index: int
    offering: Offering
    template: LaunchTemplate
    candidates: list[NodeRef] = Field(
        default_factory=list, description="the nodes it replaces: each gets a DisruptionLaunching Event"
    )
    reason: str = Field(default="", description="the command's reason, for that Event")
    attempt: int = Field(
        default=0,
        ge=0,
        description="launches of this replacement that failed and were terminated before (a new ClientToken)",
    )


class LaunchedInstance(BaseModel):
    instance_id: str
    index: int | None = Field(default=None, description="replacement index, from the instance's tag")
    provider_id: str
    private_dns_name: str
    offering: Offering
    adopted: bool = Field(default=False, description="found already launched by an earlier attempt")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Karpenter's labels of the instance (type, zone, zone id, capacity), for registration",
    )


_WAITING = "the nodes it replaces: each gets a DisruptionWaitingReadiness Event"


class RegistrationRequest(BaseModel):
    instance: LaunchedInstance
    template: LaunchTemplate
    poll_interval_seconds: float | None = None
    candidates: list[NodeRef] = Field(default_factory=list, description=_WAITING)
    registered_node: str | None = Field(
        default=None,
        description="a look again at a replacement that registered as this node: gone is NotFound at once",
    )


class RegisteredNode(BaseModel):
    node: str


class InitializationRequest(BaseModel):
    node: str
    startup_taints: list[TaintSpec] = Field(default_factory=list)
    poll_interval_seconds: float | None = None
    candidates: list[NodeRef] = Field(default_factory=list, description=_WAITING)


# -- Replacements beside Karpenter (activities/nodeclaims.py) ---------------------------------------

NodeClaimCondition = Literal["Launched", "Registered", "Initialized"]


class NodeClaimRequest(BaseModel):
    """Create the NodeClaim of one replacement (idempotent by its name)."""

    name: str
    command_id: str
    index: int
    spec: ReplacementSpec
    template: LaunchTemplate
    candidates: list[NodeRef] = Field(
        default_factory=list, description="the nodes it replaces: each gets a DisruptionLaunching Event"
    )
    reason: str = Field(default="", description="the command's reason, for that Event")


class NodeClaimWait(BaseModel):
    """Wait until Karpenter reports `until` True on the NodeClaim (pinned to `uid` when given)."""

    name: str
    uid: str | None = None
    until: NodeClaimCondition
    poll_interval_seconds: float | None = None
    candidates: list[NodeRef] = Field(default_factory=list, description=_WAITING)


class NodeClaimState(BaseModel):
    """A NodeClaim as Karpenter filled it in so far."""

    name: str
    uid: str | None = None
    provider_id: str | None = None
    instance_id: str | None = None
    node: str | None = Field(default=None, description="status.nodeName, once Registered")
    offering: Offering | None = Field(default=None, description="what Karpenter launched (its labels)")
    conditions: dict[str, str] = Field(default_factory=dict, description="condition type -> status")


class NodeClaimDeletion(BaseModel):
    """Delete the NodeClaims this command created (a rollback): Karpenter then terminates their
    instances and deletes their Nodes."""

    names: list[str]
    command_id: str


class HandoverWait(BaseModel):
    """Wait until Karpenter has drained and terminated a node handed to it."""

    node: str
    uid: str | None = None
    nodeclaim: str | None = None
    poll_interval_seconds: float | None = None


class DiscardRequest(BaseModel):
    """Undo one replacement that never initialized: release its node (if any), terminate its instance."""

    instance_id: str
    node: str | None = None


# -- Termination ---------------------------------------------------------------------------------


class BeginTerminationRequest(BaseModel):
    node: str
    uid: str | None = Field(
        default=None, description="pinned: a node of that name with another UID is not it"
    )
    reason: str
    provider_id: str | None = None
    termination_grace_period: GoDuration | None = None
    deadline: datetime | None = Field(default=None, description="a hard deadline, e.g. a spot interruption's")
    defer_deadline: bool = Field(
        default=False,
        description="stamp no deadline here: the termination's gate stamps it when the drain may begin "
        "(an annotation already on the node is still read)",
    )


class NodeInfo(BaseModel):
    node: str
    found: bool
    uid: str | None = Field(default=None, description="the UID the termination is pinned to from here on")
    ready: bool = False
    provider_id: str | None = None
    instance_id: str | None = None
    nodepool: str | None = None
    deletion_timestamp: datetime | None = None
    deadline: datetime | None = Field(default=None, description="deletion time + terminationGracePeriod")
    message: str = Field(default="", description="why the node counts as gone, when it does")
    pods: int | None = Field(default=None, description="pods the drain must see gone, when it began")
    handed_over: bool = Field(
        default=False,
        description="beside Karpenter: Karpenter's termination drains the node and ends its instance",
    )
    nodeclaim: str | None = Field(default=None, description="the NodeClaim deleted to hand it over")


class DrainRequest(BaseModel):
    node: str
    uid: str | None = None
    reason: str
    deadline: datetime | None = None
    poll_interval_seconds: float | None = None


class DrainResult(BaseModel):
    evicted: int = 0
    deleted: int = Field(default=0, description="pods deleted past PDBs because the deadline was near")
    seconds: float = 0.0
    message: str = Field(default="", description="why the drain stopped early, if it did")


class VolumeRequest(BaseModel):
    node: str
    uid: str | None = None
    deadline: datetime | None = None
    poll_interval_seconds: float | None = None
    # False: look once and say whether they are detached (a local activity: the termination waits,
    # in a regular heartbeating one, only when something is still attached).
    wait: bool = True


class InstanceRequest(BaseModel):
    instance_id: str
    node: str | None = None


class InstanceState(BaseModel):
    instance_id: str
    found: bool
    state: str | None = None
    owned: bool = Field(default=False, description="tagged for this cluster and for a NodePool")
    cluster_owned: bool = Field(default=False, description="kubernetes.io/cluster/<name>: owned")
    nodepool: str | None = Field(default=None, description="its karpenter.sh/nodepool tag")
