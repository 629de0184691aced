"""NodeOverlay (karpenter.sh/v1alpha1, cluster-scoped, Karpenter v1.7): a user's correction to the
instance types Karpenter's simulation sees.

    apiVersion: karpenter.sh/v1alpha1
    kind: NodeOverlay
    metadata:
      name: discount-m5
    spec:
      requirements:              # which instance types and offerings, per NodePool (required)
      - {key: karpenter.k8s.aws/instance-family, operator: In, values: [m5]}
      priceAdjustment: "-10%"    # or "+0.05", "-0.5", "+15%"; or price: "0.08" (not both)
      capacity:                  # extended resources added; cpu, memory, ephemeral-storage, pods refused
        smarter-devices/fuse: "1"
      weight: 10                 # 1..10000; the highest wins a conflict (none: 0)

The wire shape with Karpenter's validation: the CRD's schema and CEL rules
(pkg/apis/crds/karpenter.sh_nodeoverlays.yaml) and its runtime validation
(pkg/apis/v1alpha1/nodeoverlay_validation.go `RuntimeValidate`: each requirement as
`v1.ValidateRequirement` checks it, no well-known resource in capacity). `read_node_overlay`
never raises: an object that does not validate is kept with its problems, and
planner/node_overlay.py reports it and applies nothing of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from api.nodepool import KubeModel, ObjectMeta
from api.quantity import QuantityError, to_int

OVERLAY_API_VERSION = "karpenter.sh/v1alpha1"
OVERLAY_KIND = "NodeOverlay"

# The CRD's patterns (nodeoverlay.go kubebuilder markers).
PRICE_PATTERN = re.compile(r"^\d+(\.\d+)?$")
PRICE_ADJUSTMENT_PATTERN = re.compile(
    r"^(([+-]{1}(\d*\.?\d+))|(\+{1}\d*\.?\d+%)|(^(-\d{1,2}(\.\d+)?%)$)|(-100%))$"
)
# v1.WellKnownResources: capacity may only add extended resources.
WELL_KNOWN_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})
# v1.RestrictedLabelDomains and RestrictedLabels, with the well-known labels they allow
# (pkg/apis/v1/labels.go `IsRestrictedLabel`).
_RESTRICTED_DOMAIN = "karpenter.sh"
_ALLOWED_IN_RESTRICTED = frozenset({"karpenter.sh/capacity-type", "karpenter.sh/nodepool"})
_RESTRICTED_LABELS = frozenset({"kubernetes.io/hostname"})
# k8s.io/apimachinery validation.IsQualifiedName and IsValidLabelValue.
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes qualified name (prefix/name), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"key {key}: prefix part must be a DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            f"key {key}: name part must be at most 63 characters, alphanumeric, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return None


def restricted_label_problem(key: str) -> str | None:
    """Karpenter's IsRestrictedLabel: karpenter.sh keys other than the well-known ones, hostname."""
    if key in _ALLOWED_IN_RESTRICTED:
        return None
    domain = key.partition("/")[0] if "/" in key else ""
    if domain == _RESTRICTED_DOMAIN or domain.endswith("." + _RESTRICTED_DOMAIN) or key in _RESTRICTED_LABELS:
        return f"key {key}: label is restricted (it might interfere with Karpenter's provisioning)"
    return None


class OverlayRequirement(KubeModel):
    """A requirement of spec.requirements (Karpenter's v1alpha1.NodeSelectorRequirement)."""

    key: str
    operator: Operator
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> OverlayRequirement:
        problems = [
            p for p in (qualified_name_problem(self.key), restricted_label_problem(self.key)) if p is not None
        ]
        for value in self.values:
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                problems.append(f"key {self.key}: invalid value {value!r}")
        if self.operator in ("In", "NotIn") and not self.values:
            problems.append(f"key {self.key}: operator {self.operator} must have a value defined")
        if self.operator in ("Gt", "Lt", "Gte", "Lte") and (
            len(self.values) != 1 or not self.values[0].isdigit()
        ):
            problems.append(
                f"key {self.key}: operator {self.operator} must have a single positive integer value"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class NodeOverlaySpec(KubeModel):
    requirements: list[OverlayRequirement] = Field(max_length=100)
    price: str | None = None
    price_adjustment: str | None = None
    capacity: dict[str, int | str] = Field(default_factory=dict)
    weight: int | None = Field(default=None, ge=1, le=10000)

    @field_validator("price")
    @classmethod
    def _price(cls, value: str | None) -> str | None:
        if value is not None and not PRICE_PATTERN.match(value):
            raise ValueError(f"price {value!r} must be a non-negative decimal such as 0.08")
        return value

    @field_validator("price_adjustment")
    @classmethod
    def _price_adjustment(cls, value: str | None) -> str | None:
        if value is not None and not PRICE_ADJUSTMENT_PATTERN.match(value):
            raise ValueError(
                f"priceAdjustment {value!r} must be signed: +0.5, -0.5, +10% or -10% (at most -100%)"
            )
        return value

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        restricted = sorted(name for name in value if name in WELL_KNOWN_RESOURCES)
        if restricted:
            raise ValueError(
                f"capacity: {', '.join(restricted)} may not be overlaid (extended resources only)"
            )
        for name, quantity in value.items():
            try:
                to_int(quantity)
            except (QuantityError, ValueError, TypeError) as err:
                raise ValueError(f"capacity {name}: {err}") from None
        return value

    @model_validator(mode="after")
    def _one_price(self) -> NodeOverlaySpec:
        if self.price is not None and self.price_adjustment is not None:
            raise ValueError("cannot set both 'price' and 'priceAdjustment'")
        return self

    @property
    def price_change(self) -> str | None:
        """The one price change this overlay makes (Karpenter keeps price first, then the adjustment)."""
        return self.price if self.price is not None else self.price_adjustment

    def capacity_units(self) -> dict[str, int]:
        """The extended resources, as whole units (bytes for hugepages)."""
        return {name: to_int(quantity) for name, quantity in self.capacity.items()}


class NodeOverlay(KubeModel):
    api_version: Literal["karpenter.sh/v1alpha1"] = "karpenter.sh/v1alpha1"
    kind: Literal["NodeOverlay"] = "NodeOverlay"
    metadata: ObjectMeta
    spec: NodeOverlaySpec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def weight(self) -> int:
        """spec.weight, 0 when unset (Karpenter's lo.FromPtr)."""
        return self.spec.weight or 0


@dataclass(frozen=True)
class ReadOverlay:
    """A NodeOverlay as read from the cluster: the model, or why it cannot be applied."""

    name: str
    overlay: NodeOverlay | None
    problems: tuple[str, ...] = ()


def read_node_overlay(raw: Mapping[str, Any]) -> ReadOverlay:
    """The overlay an object describes; one that does not validate is kept with its problems."""
    meta = raw.get("metadata")
    name = str(meta.get("name") or "<no name>") if isinstance(meta, Mapping) else "<no name>"
    try:
        overlay = NodeOverlay.model_validate(raw)
    except ValidationError as err:
        return ReadOverlay(name, None, tuple(_message(e) for e in err.errors(include_url=False)))
    return ReadOverlay(name, overlay)


def _message(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()) if not isinstance(part, int))
    text = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {text}" if where else text
