"""The garbage collection of karpflow's own launches: what the controller asks, what a collection did.

activities/garbage_collection.py runs it; workflows/controller.py asks for it every
`gc_interval_seconds` and keeps the last result for `karpflow status` (docs/garbage-collection.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

# Karpenter's reason labels for a NodeClaim it gave up on (karpenter_nodeclaims_disrupted_total):
# the core garbage collection's, and the liveness check's when no node registered in time.
GarbageReason = Literal["garbage_collected", "registration_timeout"]
# What a result lists at most of each kind: it travels in the controller's state.
LISTED_AT_MOST = 20


class GarbageCollectionRequest(BaseModel):
    grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description="an instance of a closed command with no Node is collected once it is this old "
        "(Karpenter's instance garbage collection: 30 s)",
    )
    registration_ttl_seconds: float = Field(
        default=900.0,
        ge=0,
        description="an instance of a closed command whose Node never initialized is collected once it "
        "is this old (Karpenter's registration TTL: 15 min)",
    )


class CollectedInstance(BaseModel):
    instance_id: str
    nodepool: str
    command_id: str = Field(description="the karpflow.io/command-id tag: <workflow id>@<first run id>")
    reason: GarbageReason
    node: str | None = Field(default=None, description="the Node deleted with it, if it had one")
    why: str = ""


class GarbageCollectionResult(BaseModel):
    at: datetime
    instances: int = Field(default=0, description="this cluster's instances tagged with a command id")
    collected: list[CollectedInstance] = Field(default_factory=list)
    in_doubt: list[str] = Field(
        default_factory=list,
        description="instances kept because Temporal could not say whether their command is closed",
    )
    problems: list[str] = Field(default_factory=list, description="what failed (tried again next time)")

    def bounded(self) -> GarbageCollectionResult:
        """The result with each list cut to LISTED_AT_MOST entries, to keep the controller state small."""
        return self.model_copy(
            update={
                "collected": self.collected[:LISTED_AT_MOST],
                "in_doubt": self.in_doubt[:LISTED_AT_MOST],
                "problems": self.problems[:LISTED_AT_MOST],
            }
        )
