"""Why each managed node was left alone, sent to the ControllerWorkflow as changes only.

A pass explains every managed node (about 130 bytes a node). Carried in full in every pass result,
those explanations alone would take a 3,000-node cluster's controller history past Temporal's 50 MB
limit within a run. So the `plan_pass` activity sends a `ReasonsUpdate`: the entries that changed
since the reasons the workflow already holds, which the workflow names by their fingerprint. The
worker remembers what it last sent to each controller; when the workflow's fingerprint is not that
(another worker planned the last pass, a result was lost, a new run began), it sends every reason.
The workflow keeps the whole map for its `status` query; its history grows only with the changes.

Imported by workflow code: pure and deterministic (sorted keys, a fixed hash).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from pydantic import BaseModel, Field

# A reason that only says "later": the node is not stuck, the cluster has not converged yet. A window
# or a pause that holds a node back, and a rate budget used up, say "later" too: the controller is
# not quiet while they hold anything back.
WAITING_MARKERS = ("not consolidatable until", "MaintenanceWindow", "paused (", "rate budget for")


class ReasonsUpdate(BaseModel):
    """node -> reason, as a change to the reasons whose fingerprint is `base` ("" : from nothing)."""

    base: str = Field(default="", description="fingerprint of the reasons this applies to; '' replaces them")
    changed: dict[str, str] = Field(default_factory=dict, description="node -> its new or changed reason")
    removed: list[str] = Field(default_factory=list, description="nodes no longer reported")
    fingerprint: str = Field(description="fingerprint of the reasons once this is applied")

    @property
    def entries(self) -> int:
        return len(self.changed) + len(self.removed)


def fingerprint(reasons: Mapping[str, str]) -> str:
    """A short digest of the whole map; equal maps have equal fingerprints on every worker."""
    # One update of node\0reason\0 for every node in order (the same bytes as feeding them one by
    # one, at a fraction of the calls: a pass fingerprints every managed node's reason).
    text = "".join(f"{node}\0{reasons[node]}\0" for node in sorted(reasons))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def update_from(
    previous: Mapping[str, str] | None, current: Mapping[str, str], previous_fingerprint: str = ""
) -> ReasonsUpdate:
    """The update that turns `previous` into `current` (everything when there is no previous).
    `previous_fingerprint`: `previous`'s, when the caller has it already."""
    if previous is None:
        return ReasonsUpdate(changed=dict(current), fingerprint=fingerprint(current))
    return ReasonsUpdate(
        base=previous_fingerprint or fingerprint(previous),
        changed={node: why for node, why in current.items() if previous.get(node) != why},
        removed=sorted(node for node in previous if node not in current),
        fingerprint=fingerprint(current),
    )


def apply(current: Mapping[str, str], update: ReasonsUpdate) -> dict[str, str]:
    """`current` with the update applied (the caller checks the base and the resulting fingerprint)."""
    reasons = dict(current) if update.base else {}
    for node in update.removed:
        reasons.pop(node, None)
    reasons.update(update.changed)
    return reasons


def waiting(reasons: Mapping[str, str]) -> list[str]:
    """Nodes that are only waiting (consolidateAfter, a timer), not stuck."""
    return sorted(node for node, why in reasons.items() if any(m in why for m in WAITING_MARKERS))
