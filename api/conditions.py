"""Status conditions (metav1.Condition) as karpflow writes them on its own objects."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from api.nodepool import KubeModel


class Condition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ControlStatus(KubeModel):
    """The status of a MaintenanceWindow or NodeDisruptionBudget: its conditions only."""

    conditions: list[Condition] = Field(default_factory=list)
