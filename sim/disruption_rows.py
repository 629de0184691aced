"""How the demo prints a DisruptionWorkflow: one row per workflow, one line per change.

What is left of the demo's old plan runner now that the controller starts the workflows: the row
model, the replacement and progress lines, and the Web UI link.
"""

from __future__ import annotations

import urllib.parse

from pydantic import BaseModel, Field

from api.workflow_io import ReplacementStatus


class DisruptionProgress(BaseModel):
    """Where one DisruptionWorkflow is: one row of the demo's output."""

    workflow_id: str
    reason: str
    nodes: list[str]
    execution: str = "Running"  # Temporal's execution status: Running, Completed, Failed, Canceled...
    phase: str = "Starting"  # the workflow's own phase (status query), "Starting" before it answers
    # One line per replacement (see replacement_text), then the offerings found without capacity.
    replacements: list[str] = Field(default_factory=list)
    terminations: dict[str, str] = Field(default_factory=dict)  # candidate -> termination state/phase
    replaced_by: list[str] = Field(default_factory=list)  # nodes of the initialized replacements
    failure: str = ""  # why the workflow failed, from its failure (empty unless it did)
    kept: dict[str, str] = Field(default_factory=dict)  # candidate it did not take -> why (from its result)

    @property
    def taken(self) -> list[str]:
        """The candidates the command took (a delete goes on without those it could not)."""
        return [n for n in self.nodes if n not in self.kept]

    @property
    def done(self) -> bool:
        return self.execution != "Running"

    @property
    def succeeded(self) -> bool:
        return self.execution == "Completed"


def short_node(name: str) -> str:
    """`ip-172-31-5-90` for `ip-172-31-5-90.us-west-2.compute.internal`: tables stay narrow."""
    return name.split(".", 1)[0]


def replacement_text(replacement: ReplacementStatus) -> str:
    """Where one replacement is, e.g. `Registered r5.large/us-west-2b/spot i-0abc → ip-172-31-16-4`:
    its state, the offering it was launched with, the instance and the node that registered for it
    (each as soon as it is known), and why it failed if it did."""
    parts = [f"{replacement.nodepool}: {replacement.state}"]
    if replacement.offering is not None:
        parts.append(replacement.offering.key)
    if replacement.instance_id:
        parts.append(replacement.instance_id)
    if replacement.node:
        parts.append(f"→ {short_node(replacement.node)}")
    text = " ".join(parts)
    if replacement.state in ("Failed", "Discarded") and replacement.message:
        text += f" ({replacement.message})"
    return text


def progress_line(row: DisruptionProgress) -> str:
    """One line per change, for logs and terminals without live tables."""
    parts = [f"{row.workflow_id}: {row.execution}/{row.phase}"]
    if row.replacements:
        parts.append("replacements " + "; ".join(row.replacements))
    if row.terminations:
        parts.append("terminations " + ", ".join(f"{short_node(n)} {s}" for n, s in row.terminations.items()))
    return "  ".join(parts)


def ui_workflows_url(ui_url: str, namespace: str, query: str) -> str:
    """The Temporal Web UI's workflow list, filtered by a visibility query."""
    return (
        f"{ui_url.rstrip('/')}/namespaces/{urllib.parse.quote(namespace, safe='')}/workflows"
        f"?query={urllib.parse.quote(query, safe='')}"
    )
