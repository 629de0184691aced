"""NodePool (karpenter.sh/v1) and EC2NodeClass (karpenter.k8s.aws/v1) as pydantic models.

Field names follow Karpenter v1 exactly (camelCase on the wire), so existing YAML loads unchanged.
Unknown fields are ignored rather than refused: newer Karpenter fields must not break loading.
Only the shape is validated here; the meaning (budget windows, drift, limits) lives in planner/.

`NodePool.model_validate` refuses an invalid duration; `api.nodepool_reader.read_nodepool` is how
karpflow reads a NodePool from a cluster (each invalid setting read as the value that disrupts
nothing, and reported).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from api.constants import BUDGET_REASONS
from api.duration import KarpenterDuration, KarpenterDurationOrNever, parse_optional_duration


class KubeModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ObjectMeta(KubeModel):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)


class Taint(KubeModel):
    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeSelectorRequirement(KubeModel):
    """A NodePool requirement: `In`/`NotIn`/`Exists`/`DoesNotExist`/`Gt`/`Lt`, Karpenter's inclusive
    `Gte`/`Lte` (v1.9), plus minValues."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]
    values: list[str] = Field(default_factory=list)
    min_values: int | None = None

    @model_validator(mode="after")
    def _values_match_operator(self) -> NodeSelectorRequirement:
        if self.operator in ("In",) and not self.values:
            raise ValueError(f"requirement {self.key}: operator In needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"requirement {self.key}: operator {self.operator} takes no values")
        # Karpenter's CEL rule (pkg/apis/v1/nodepool.go): one non-negative integer for all four.
        if self.operator in ("Gt", "Lt", "Gte", "Lte") and (
            len(self.values) != 1 or not self.values[0].isdigit()
        ):
            raise ValueError(
                f"requirement {self.key}: operator {self.operator} needs one non-negative integer value"
            )
        return self


class NodeClassRef(KubeModel):
    group: str = "karpenter.k8s.aws"
    kind: str = "EC2NodeClass"
    name: str


class TemplateMeta(KubeModel):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class NodeClaimTemplateSpec(KubeModel):
    node_class_ref: NodeClassRef | None = None
    requirements: list[NodeSelectorRequirement] = Field(default_factory=list)
    taints: list[Taint] = Field(default_factory=list)
    startup_taints: list[Taint] = Field(default_factory=list)
    expire_after: KarpenterDurationOrNever = "720h"
    termination_grace_period: KarpenterDuration | None = None

    @property
    def expire_after_delta(self) -> timedelta | None:
        return parse_optional_duration(self.expire_after)

    @property
    def termination_grace_period_delta(self) -> timedelta | None:
        return parse_optional_duration(self.termination_grace_period)


class NodeClaimTemplate(KubeModel):
    metadata: TemplateMeta = Field(default_factory=TemplateMeta)
    spec: NodeClaimTemplateSpec = Field(default_factory=NodeClaimTemplateSpec)


_PERCENT = re.compile(r"^(\d+)%$")


class Budget(KubeModel):
    """At most `nodes` of the pool may be disrupting at once while the budget is active. With `per`
    (karpflow's rate budget, planner/rate_budgets.py) it is a rate instead: at most `nodes` may start
    within any `per`."""

    nodes: str = "10%"
    reasons: list[str] | None = None
    schedule: str | None = None
    duration: KarpenterDuration | None = None
    per: KarpenterDuration | None = None

    @field_validator("per")
    @classmethod
    def _positive_per(cls, value: str | None) -> str | None:
        if value is not None and parse_optional_duration(value) == timedelta(0):
            raise ValueError(f"budget per {value!r}: must be longer than 0s")
        return value

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes_int_or_percent(cls, value: Any) -> str:
        text = str(value).strip()
        if text.isdigit() or (_PERCENT.match(text) and int(text[:-1]) <= 100):
            return text
        raise ValueError(f"budget nodes {value!r}: expected a non-negative integer or a percentage 0-100%")

    @field_validator("reasons")
    @classmethod
    def _known_reasons(cls, value: list[str] | None) -> list[str] | None:
        for reason in value or []:
            if reason not in BUDGET_REASONS:
                raise ValueError(f"budget reason {reason!r}: expected one of {', '.join(BUDGET_REASONS)}")
        return value

    @model_validator(mode="after")
    def _schedule_needs_duration(self) -> Budget:
        if (self.schedule is None) != (self.duration is None):
            raise ValueError("budget schedule and duration must be set together")
        return self


ConsolidationPolicy = Literal["WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"]


class Disruption(KubeModel):
    # Balanced (Karpenter v1.14): WhenEmptyOrUnderutilized plus a score gate per move (planner/balanced.py).
    consolidation_policy: ConsolidationPolicy = "WhenEmptyOrUnderutilized"
    consolidate_after: KarpenterDurationOrNever = "0s"
    budgets: list[Budget] = Field(default_factory=lambda: [Budget()], max_length=50)

    @field_validator("consolidation_policy", mode="before")
    @classmethod
    def _v1beta1_policy_name(cls, value: Any) -> Any:
        # v1beta1 called it WhenUnderutilized; existing manifests keep working.
        return "WhenEmptyOrUnderutilized" if value == "WhenUnderutilized" else value

    @property
    def consolidate_after_delta(self) -> timedelta | None:
        """None means consolidation is disabled for the pool (`Never`)."""
        return parse_optional_duration(self.consolidate_after)


class NodePoolSpec(KubeModel):
    template: NodeClaimTemplate = Field(default_factory=NodeClaimTemplate)
    disruption: Disruption = Field(default_factory=Disruption)
    limits: dict[str, str] = Field(default_factory=dict)
    weight: int | None = None
    # Karpenter v1.8 static NodePool: a fixed node count. Never emptied or consolidated; drift is
    # StaticDrift (planner/static_drift.py). api/nodepool_reader.py reads an invalid value as 0.
    replicas: int | None = Field(default=None, ge=0)

    @field_validator("limits", mode="before")
    @classmethod
    def _limits_as_strings(cls, value: Any) -> Any:
        return {k: str(v) for k, v in value.items()} if isinstance(value, dict) else value

    @property
    def is_static(self) -> bool:
        """Karpenter's IsStatic: `replicas` is set (pkg/utils/nodepool/nodepool.go)."""
        return self.replicas is not None


class NodePool(KubeModel):
    api_version: str = "karpenter.sh/v1"
    kind: Literal["NodePool"] = "NodePool"
    metadata: ObjectMeta
    spec: NodePoolSpec = Field(default_factory=NodePoolSpec)

    @property
    def name(self) -> str:
        return self.metadata.name


def pydantic_message(err: ValidationError) -> str:
    """One line per error, `field.path: what is wrong`."""
    parts = []
    for e in err.errors():
        where = ".".join(str(x) for x in e.get("loc", ()))
        message = e.get("msg", "").removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


class SelectorTerm(KubeModel):
    """One term of an AMI / subnet / security-group selector (any of its fields may be set)."""

    id: str | None = None
    name: str | None = None
    alias: str | None = None
    owner: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)


class CapacityReservationSelectorTerm(KubeModel):
    """One term of `capacityReservationSelectorTerms` (Karpenter's CRD shape). Its rules (id alone;
    otherwise tags or instanceMatchCriteria) are checked where it is read, planner/reservations.py,
    so a bad term selects nothing and is reported instead of refusing the whole EC2NodeClass."""

    id: str | None = None
    owner_id: str | None = Field(default=None, alias="ownerID")
    tags: dict[str, str] = Field(default_factory=dict)
    instance_match_criteria: str | None = None


class ResolvedAMI(KubeModel):
    id: str
    name: str | None = None
    requirements: list[NodeSelectorRequirement] = Field(default_factory=list)


class ResolvedSubnet(KubeModel):
    id: str
    zone: str
    zone_id: str | None = Field(default=None, alias="zoneID")  # Karpenter's spelling


class ResolvedSecurityGroup(KubeModel):
    id: str
    name: str | None = None


# --- EC2NodeClass launch fields (karpenter.k8s.aws/v1, pkg/apis/v1/ec2nodeclass.go) ---------------
# Shapes and limits are Karpenter's CRD schema and CEL rules, so a class the API server would refuse
# is refused here too, with Karpenter's words. The translation into RunInstances parameters is
# launch/ec2_params.py's; these models only say what a user may write.

# volumeSize: whole Gi, G, Ti or T up to EBS's 64 TiB (the bounds of Karpenter's CRD pattern).
VOLUME_SIZE = re.compile(r"^([1-9][0-9]*)(Gi|G|Ti|T)$")
VOLUME_SIZE_MAX = {"Gi": 59000, "G": 64000, "Ti": 58, "T": 64}
VolumeType = Literal["standard", "io1", "io2", "gp2", "sc1", "st1", "gp3"]
# Tag keys Karpenter reserves for itself (the EC2NodeClass CEL rules on spec.tags).
RESTRICTED_TAG_KEYS = (
    "eks:eks-cluster-name",
    "karpenter.sh/nodepool",
    "karpenter.sh/nodeclaim",
    "karpenter.k8s.aws/ec2nodeclass",
)
RESTRICTED_TAG_PREFIX = "kubernetes.io/cluster"


def _wire(model: BaseModel | None) -> dict[str, Any] | None:
    """As the user wrote it (camelCase, unset fields left out): what the drift hash has always seen,
    so typing a field that used to be a plain map does not drift the nodes launched before."""
    return None if model is None else model.model_dump(by_alias=True, exclude_none=True, mode="json")


class BlockDevice(KubeModel):
    """`ebs` of a block device mapping."""

    delete_on_termination: bool | None = None
    encrypted: bool | None = None
    iops: int | None = Field(default=None, ge=0)
    kms_key_id: str | None = Field(default=None, alias="kmsKeyID")
    snapshot_id: str | None = Field(default=None, alias="snapshotID")
    throughput: int | None = Field(default=None, ge=0)
    volume_initialization_rate: int | None = Field(default=None, ge=100, le=300)
    volume_size: str | None = None
    volume_type: VolumeType | None = None

    @field_validator("volume_size", mode="before")
    @classmethod
    def _volume_size_quantity(cls, value: Any) -> Any:
        if value is None:
            return value
        match = VOLUME_SIZE.match(value) if isinstance(value, str) else None
        if match is None or int(match[1]) > VOLUME_SIZE_MAX[match[2]]:
            raise ValueError(
                f"volumeSize {value!r}: expected a size in Gi, G, Ti or T (e.g. 100Gi), "
                "at most 59000Gi / 64000G / 58Ti / 64T"
            )
        return value

    @model_validator(mode="after")
    def _size_or_snapshot(self) -> BlockDevice:
        if self.snapshot_id is None and self.volume_size is None:
            raise ValueError("snapshotID or volumeSize must be defined")
        if self.volume_initialization_rate is not None and not self.snapshot_id:
            raise ValueError("snapshotID must be set when volumeInitializationRate is set")
        return self


class BlockDeviceMapping(KubeModel):
    device_name: str | None = None
    ebs: BlockDevice | None = None
    # The volume the kubelet's root directory lives on (its size is the node's ephemeral storage).
    root_volume: bool | None = None


class MetadataOptions(KubeModel):
    """The instance metadata service as pods see it; unset fields take Karpenter's defaults."""

    http_endpoint: Literal["enabled", "disabled"] | None = None
    http_protocol_ipv6: Literal["enabled", "disabled"] | None = Field(default=None, alias="httpProtocolIPv6")
    http_put_response_hop_limit: int | None = Field(default=None, ge=1, le=64)
    http_tokens: Literal["required", "optional"] | None = None


class EnclaveOptions(KubeModel):
    enabled: bool | None = None


class EC2NodeClassSpec(KubeModel):
    role: str | None = None
    instance_profile: str | None = None
    ami_family: str | None = None
    ami_selector_terms: list[SelectorTerm] = Field(default_factory=list)
    subnet_selector_terms: list[SelectorTerm] = Field(default_factory=list)
    security_group_selector_terms: list[SelectorTerm] = Field(default_factory=list)
    capacity_reservation_selector_terms: list[CapacityReservationSelectorTerm] = Field(default_factory=list)
    user_data: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    block_device_mappings: list[BlockDeviceMapping] = Field(default_factory=list, max_length=50)
    metadata_options: MetadataOptions | None = None
    kubelet: dict[str, Any] | None = None
    # Karpenter spells it with "IP" in capitals, which the camelCase generator would not.
    associate_public_ip_address: bool | None = Field(default=None, alias="associatePublicIPAddress")
    detailed_monitoring: bool | None = None
    instance_store_policy: Literal["RAID0"] | None = None
    ip_prefix_count: int | None = Field(default=None, ge=0)
    enclave_options: EnclaveOptions | None = None
    # Reserved EC2 field for CreateFleet; RunInstances has no such parameter (docs/launch.md).
    context: str | None = None

    @field_validator("tags")
    @classmethod
    def _no_restricted_tags(cls, tags: dict[str, str]) -> dict[str, str]:
        for key in tags:
            if key == "":
                raise ValueError("empty tag keys aren't supported")
            if key in RESTRICTED_TAG_KEYS or key.startswith(RESTRICTED_TAG_PREFIX):
                matched = key if key in RESTRICTED_TAG_KEYS else f"{RESTRICTED_TAG_PREFIX}/"
                raise ValueError(f"tag contains a restricted tag matching {matched}")
        return tags

    @field_validator("block_device_mappings")
    @classmethod
    def _one_root_volume(cls, mappings: list[BlockDeviceMapping]) -> list[BlockDeviceMapping]:
        if sum(1 for m in mappings if m.root_volume) > 1:
            raise ValueError("must have only one blockDeviceMappings with rootVolume")
        return mappings

    @field_serializer("block_device_mappings")
    def _mappings_as_written(self, mappings: list[BlockDeviceMapping]) -> list[dict[str, Any]]:
        return [_wire(m) or {} for m in mappings]

    @field_serializer("metadata_options", "enclave_options")
    def _options_as_written(self, options: BaseModel | None) -> dict[str, Any] | None:
        return _wire(options)

    @property
    def family(self) -> str:
        """amiFamily, else the family of the first `alias` AMI selector term (`al2023@latest`), else
        AL2023 (Karpenter v1's default)."""
        if self.ami_family:
            return self.ami_family
        for term in self.ami_selector_terms:
            if term.alias:
                return term.alias.split("@", 1)[0]
        return "AL2023"


class EC2NodeClassStatus(KubeModel):
    amis: list[ResolvedAMI] = Field(default_factory=list)
    subnets: list[ResolvedSubnet] = Field(default_factory=list)
    security_groups: list[ResolvedSecurityGroup] = Field(default_factory=list)
    instance_profile: str | None = None


class EC2NodeClass(KubeModel):
    api_version: str = "karpenter.k8s.aws/v1"
    kind: Literal["EC2NodeClass"] = "EC2NodeClass"
    metadata: ObjectMeta
    spec: EC2NodeClassSpec = Field(default_factory=EC2NodeClassSpec)
    status: EC2NodeClassStatus = Field(default_factory=EC2NodeClassStatus)

    @property
    def name(self) -> str:
        return self.metadata.name
