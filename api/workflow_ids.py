"""Workflow ids: readable, and derived from what they act on, so that whoever starts a workflow
(the controller, the deletion watcher, the interruption handler, a person) starts the same one.

Temporal refuses a second running workflow with an id, which is what makes a replayed, restarted or
duplicated start harmless. Every id carries the cluster: two clusters may share a Temporal
namespace. A node's id also carries its UID, because a node name is not an identity (EKS names nodes
by private DNS, which comes back with the IP): a new node that reuses the name is another node, with
its own termination, and a workflow started for the old one never acts on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Literal

InterruptionKind = Literal["spot", "rebalance", "capacity-reservation", "capacity-block-expiration"]


def termination_workflow_id(cluster: str, node: str, uid: str) -> str:
    """`termination/<cluster>/<node>/<uid>`: one termination per node incarnation."""
    return f"termination/{cluster}/{node}/{uid}"


def legacy_termination_workflow_id(node: str) -> str:
    """The id terminations had before they carried their cluster and node UID; only workflows
    started before that change (replayed from their history) still use it."""
    return f"termination/{node}"


def command_hash(method: str, reason: str, nodes: Iterable[str]) -> str:
    """A short hash of a decision: the same method, reason and node set give the same id."""
    text = "|".join([method, reason, *sorted(nodes)])
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def disruption_workflow_id(cluster: str, nodepools: Iterable[str], reason: str, short_hash: str) -> str:
    """`disruption/<cluster>/<pool>/<reason>/<short-hash>` (pools joined with `+`)."""
    pools = "+".join(sorted(nodepools)) or "none"
    return f"disruption/{cluster}/{pools}/{reason}/{short_hash}"


def controller_workflow_id(cluster: str) -> str:
    """The one ControllerWorkflow of a cluster (a singleton: every worker starts it idempotently)."""
    return f"karpflow-controller/{cluster}"


def interruption_poller_workflow_id(cluster: str) -> str:
    """The one workflow that owns a cluster's interruption-queue poller, if it is a workflow."""
    return f"karpflow-interruption/{cluster}"


def interruption_workflow_id(cluster: str, instance_id: str, kind: InterruptionKind) -> str:
    """What an interruption of one EC2 instance starts: derived from the instance id, so a message
    delivered twice (SQS is at least once) starts nothing twice, and from the kind of event: a spot
    warning is never taken for a duplicate of the rebalance recommendation that preceded it."""
    return f"interruption/{cluster}/{instance_id}/{kind}"


def replacement_nodeclaim_name(nodepool: str, command_id: str, index: int) -> str:
    """`<nodepool>-<hash>`: the NodeClaim of a command's replacement beside Karpenter, named as
    Karpenter names its own (`<nodepool>-<suffix>`), from the command and the replacement index, so a
    retried create finds the one created before and a rollback knows what to delete."""
    digest = hashlib.sha256(f"{command_id}\x00{index}".encode()).hexdigest()[:10]
    return f"{nodepool[:200]}-{digest}"


def rollout_workflow_id(cluster: str, nodepool: str, selector: dict[str, str], requested_at: str) -> str:
    """`rollout/<cluster>/<pool>/<short-hash>`: one rollout per pool, selector and request time, so a
    repeated start of the same request (a retried CLI call) starts nothing twice."""
    terms = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    digest = hashlib.sha256(f"{nodepool}|{terms}|{requested_at}".encode()).hexdigest()[:10]
    return f"rollout/{cluster}/{nodepool}/{digest}"


def drift_rollout_workflow_id(cluster: str, nodepool: str, target: str) -> str:
    """`rollout/<cluster>/<pool>/drift-<target>`: one drift rollout per pool and target, so the
    controller's repeated ask while its state is not yet written starts nothing twice."""
    return f"rollout/{cluster}/{nodepool}/drift-{target}"
