"""What other parts of karpflow tell the ControllerWorkflow (signals) and read from it (queries).

Kept apart from the controller's code so that the interruption handler, the CLI and the tests speak
to it without importing it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

# Signal names of the ControllerWorkflow (workflows/controller.py).
SIGNAL_OFFERING_UNAVAILABLE = "offering_unavailable"


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


# -- The controller's own inputs and outputs (workflows/controller.py, activities/planning.py) ------

QUERY_STATUS = "status"


class ControllerInput(BaseModel):
    """What the ControllerWorkflow runs with; carried over continue-as-new with its state."""

    cluster: str
    task_queue: str = "karpflow"
    interval_seconds: float = 10.0
    validation_seconds: float = 15.0
    # Continue-as-new once the history holds this many events (a pass adds about 10 to 20).
    max_history_events: int = 1000
    backoff_min_seconds: float = 60.0
    backoff_max_seconds: float = 600.0
    first_run: bool = True  # crash cleanup of orphan taints runs once per controller start
    # State carried over continue-as-new.
    unavailable: list[OfferingUnavailable] = Field(default_factory=list)
    backoffs: dict[str, PoolBackoff] = Field(default_factory=dict)
    started: dict[str, StartedCommand] = Field(default_factory=dict)
    passes: int = 0


class PoolBackoff(BaseModel):
    pool: str
    reason: str
    failures: int
    until: datetime


class StartedCommand(BaseModel):
    workflow_id: str
    nodepools: list[str]
    reason: str
    nodes: list[str]
    started_at: datetime


class InFlight(BaseModel):
    workflow_id: str
    workflow_type: str
    nodes: list[str] = Field(default_factory=list)
    reason: str = ""


class InFlightOutput(BaseModel):
    running: list[InFlight] = Field(default_factory=list)
    # Of the ids asked about: the ones that closed without completing (failed, timed out, ...).
    failed: list[str] = Field(default_factory=list)
    closed: list[str] = Field(default_factory=list)


class InFlightInput(BaseModel):
    track: list[str] = Field(default_factory=list)


class PlannedCommand(BaseModel):
    """One planner command as the controller handles it."""

    workflow_id: str
    method: str
    reason: str
    nodepools: list[str]
    nodes: list[str]
    forceful: bool
    needs_validation: bool
    command: dict[str, Any] = Field(description="the planner's CommandOut, by alias, for re-validation")
    input: dict[str, Any] = Field(description="the DisruptionInput, as JSON")


class PassInput(BaseModel):
    in_flight_nodes: list[str] = Field(default_factory=list)
    unavailable: list[OfferingUnavailable] = Field(default_factory=list)


class BlockedNode(BaseModel):
    node: str
    reason: str


class PassOutput(BaseModel):
    synced: bool
    at: datetime | None = None
    commands: list[PlannedCommand] = Field(default_factory=list)
    blocked: list[BlockedNode] = Field(default_factory=list)
    budgets: dict[str, dict[str, int]] = Field(default_factory=dict)
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    tainted_nodes: list[str] = Field(default_factory=list, description="nodes carrying a disruption taint")
    waiting: int = Field(default=0, description="nodes only waiting for consolidateAfter")
    problems: list[str] = Field(default_factory=list)
    duration_seconds: float = 0.0


class ValidateInput(BaseModel):
    command: PlannedCommand
    in_flight_nodes: list[str] = Field(default_factory=list)


class ValidateOutput(BaseModel):
    valid: bool
    reason: str = ""
    command: PlannedCommand | None = None


class StartOutput(BaseModel):
    workflow_id: str
    already_started: bool


class ControllerStatus(BaseModel):
    cluster: str
    synced: bool = False
    last_pass_at: datetime | None = None
    last_pass_seconds: float = 0.0
    passes: int = 0
    commands: list[str] = Field(default_factory=list, description="workflow ids the last pass started")
    validating: list[str] = Field(default_factory=list)
    blocked: list[BlockedNode] = Field(default_factory=list)
    budgets: dict[str, dict[str, int]] = Field(default_factory=dict)
    in_flight: list[InFlight] = Field(default_factory=list)
    backoffs: list[PoolBackoff] = Field(default_factory=list)
    unavailable: list[OfferingUnavailable] = Field(default_factory=list)
    untainted: list[str] = Field(default_factory=list, description="orphan taints removed at start")
    problems: list[str] = Field(default_factory=list)
    quiet: bool = False


ControllerInput.model_rebuild()
