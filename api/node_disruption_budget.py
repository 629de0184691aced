"""NodeDisruptionBudget (karpflow.dev/v1alpha1, cluster-scoped): a PodDisruptionBudget for nodes.

    apiVersion: karpflow.dev/v1alpha1
    kind: NodeDisruptionBudget
    metadata:
      name: ingress
    spec:
      selector:                  # a label selector over nodes; null or {} selects NO node
        matchLabels:
          node-role/ingress: "true"
      maxUnavailable: 1          # or minAvailable; exactly one of them, an integer or "N%"

The object of Karpenter's graceful termination design. This module is the wire shape only; the
schema in deploy/crds/nodedisruptionbudgets.karpflow.dev.yaml says the same, and
planner/node_disruption_budgets.py decides what a budget allows, also for an object that does not
fit this shape (docs/operator-controls.md).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from api.conditions import Condition, ControlStatus
from api.nodepool import KubeModel, ObjectMeta

_PERCENT = re.compile(r"^(\d+)%$")


def int_or_percent(value: Any, field: str) -> int | str:
    """A non-negative integer, or a percentage from 0% to 100% (text)."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected an integer or a percentage, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{field}: {value} is negative")
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    match = _PERCENT.match(text)
    if match is None:
        raise ValueError(f"{field}: {value!r} is neither a non-negative integer nor a percentage such as 20%")
    if int(match.group(1)) > 100:
        raise ValueError(f"{field}: {value!r} is more than 100%")
    return text


class LabelSelectorRequirement(KubeModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class NodeLabelSelector(KubeModel):
    """metav1.LabelSelector over node labels."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class NodeDisruptionBudgetSpec(KubeModel):
    selector: NodeLabelSelector | None = None
    min_available: int | str | None = None
    max_unavailable: int | str | None = None

    @field_validator("min_available", "max_unavailable", mode="before")
    @classmethod
    def _int_or_percent(cls, value: Any, info: Any) -> int | str | None:
        if value is None:
            return None
        field = "minAvailable" if info.field_name == "min_available" else "maxUnavailable"
        return int_or_percent(value, field)

    @model_validator(mode="after")
    def _exactly_one(self) -> NodeDisruptionBudgetSpec:
        if (self.min_available is None) == (self.max_unavailable is None):
            raise ValueError("exactly one of minAvailable and maxUnavailable must be set")
        return self


class BudgetClaim(KubeModel):
    """A node a termination is about to take down under this budget, written before its first change
    (activities/budget_claims.py): it counts as unavailable from then on, so two workers can never
    both take the last slot. Released when the node's termination ends; the controller sweeps
    claims whose node is gone or whose holder stopped before tainting it."""

    node: str
    uid: str = ""
    holder: str = Field(description="the workflow that claimed it: `<workflow id>@<first run id>`")
    reason: str = ""
    since: str = Field(description="RFC 3339: when it was claimed")


class NodeDisruptionBudgetStatus(ControlStatus):
    """Conditions (Valid) and the claims of nodes being taken down."""

    claims: list[BudgetClaim] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


class NodeDisruptionBudget(KubeModel):
    api_version: Literal["karpflow.dev/v1alpha1"] = "karpflow.dev/v1alpha1"
    kind: Literal["NodeDisruptionBudget"] = "NodeDisruptionBudget"
    metadata: ObjectMeta
    spec: NodeDisruptionBudgetSpec
    status: NodeDisruptionBudgetStatus = Field(default_factory=NodeDisruptionBudgetStatus)

    @property
    def name(self) -> str:
        return self.metadata.name
