"""Workflow ids: readable, and derived from what they act on, so that whoever starts a workflow
(the controller, the deletion watcher, the interruption handler, a person) starts the same one.

Temporal refuses a second running workflow with an id, which is what makes a replayed, restarted or
duplicated start harmless.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def termination_workflow_id(node: str) -> str:
    """One termination per node at a time."""
    return f"termination/{node}"


def command_hash(method: str, reason: str, nodes: Iterable[str]) -> str:
    """A short hash of a decision: the same method, reason and node set give the same id."""
    text = "|".join([method, reason, *sorted(nodes)])
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def disruption_workflow_id(nodepools: Iterable[str], reason: str, short_hash: str) -> str:
    """`disruption/<pool>/<reason>/<short-hash>` (pools joined with `+`)."""
    pools = "+".join(sorted(nodepools)) or "none"
    return f"disruption/{pools}/{reason}/{short_hash}"


def controller_workflow_id(cluster: str) -> str:
    """The one ControllerWorkflow of a cluster (a singleton: every worker starts it idempotently)."""
    return f"karpflow-controller/{cluster}"


def interruption_poller_workflow_id(cluster: str) -> str:
    """The one workflow that owns a cluster's interruption-queue poller, if it is a workflow."""
    return f"karpflow-interruption/{cluster}"


def interruption_workflow_id(instance_id: str) -> str:
    """What an interruption of one EC2 instance starts: derived from the instance id, so a message
    delivered twice (SQS is at least once) starts nothing twice."""
    return f"interruption/{instance_id}"
