"""What other parts of karpflow tell the ControllerWorkflow (signals) and read from it (queries).

Kept apart from the controller's code so that the interruption handler, the CLI and the tests speak
to it without importing it.
"""

from __future__ import annotations

from datetime import datetime

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
