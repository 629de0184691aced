"""Which of karpflow's own launches are garbage: the rule, without I/O (activities/garbage_collection.py
asks EC2, the cluster cache and Temporal, then acts on what this says).

A replacement instance carries its command in the tag `karpflow.io/command-id`
(`<workflow id>@<first run id>`, activities/ec2.py `launch_tags`). While that command runs, the
instance is the command's to register, keep or discard. Once it has closed, nothing will ever adopt
the instance: a cancellation compensated, but a `temporal workflow terminate` (or a failure the
compensation could not finish) leaves it running. Such an instance is garbage when

- it has no Node with its providerID and was launched at least `grace` ago (Karpenter's AWS
  provider terminates instances with no NodeClaim once they are 30 s old:
  aws/karpenter-provider-aws pkg/controllers/nodeclaim/garbagecollection/controller.go); or
- its Node never initialized (no `karpenter.sh/initialized` label) and still cannot run pods (it
  keeps the `karpenter.sh/unregistered` taint, or is not Ready), is neither being deleted nor held
  by a command (holder annotation, disruption taint), and the instance was launched at least
  `registration_ttl` ago (Karpenter deletes a NodeClaim not registered 15 min after its launch:
  kubernetes-sigs/karpenter pkg/controllers/nodeclaim/lifecycle/liveness.go).

An initialized Node, or a registered Ready one (pods may already run there), is never collected:
that is capacity, which consolidation removes by the rules. An instance without the ownership tags
(this cluster's `owned` tag and `karpenter.sh/nodepool`, as the terminate guard and the IAM policy
require) or without a well-formed command id is never garbage. A command Temporal cannot vouch
for (a describe that failed) is in doubt: its instances are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from activities.node_json import has_taint, is_ready
from api.constants import (
    CLUSTER_TAG_VALUE,
    DISRUPTION_TAINT_KEYS,
    HOLDER_ANNOTATION,
    INITIALIZED_LABEL,
    TAG_CAPACITY_TYPE,
    TAG_COMMAND_ID,
    TAG_NODEPOOL,
    UNREGISTERED_TAINT_KEY,
    aws_provider_id,
    cluster_tag,
)
from api.garbage_io import GarbageReason
from kube.client import Json

LIVE_STATES = frozenset({"pending", "running", "stopping", "stopped"})
GONE_STATES = frozenset({"shutting-down", "terminated"})

CommandState = Literal["open", "closed", "unknown"]


@dataclass(frozen=True)
class Launch:
    """One instance karpflow launched for a command, as EC2 describes it."""

    instance_id: str
    state: str
    launched_at: datetime
    nodepool: str
    command_id: str
    workflow_id: str
    first_run_id: str
    provider_id: str
    instance_type: str
    capacity_type: str

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def launch_of(instance: Mapping[str, Any], cluster: str) -> Launch | None:
    """The launch an EC2 instance (DescribeInstances shape) is, or None when it is not one this
    cluster owns: missing ownership tags or command id are never garbage, whatever else holds."""
    tags = {t.get("Key"): t.get("Value", "") for t in instance.get("Tags") or ()}
    nodepool = tags.get(TAG_NODEPOOL) or ""
    command_id = tags.get(TAG_COMMAND_ID) or ""
    workflow_id, at, first_run_id = command_id.rpartition("@")  # a run id has no "@"; an id may
    launched_at = instance.get("LaunchTime")
    if (
        tags.get(cluster_tag(cluster)) != CLUSTER_TAG_VALUE
        or not nodepool
        or not (workflow_id and at and first_run_id)
        or not isinstance(launched_at, datetime)
        or launched_at.tzinfo is None
    ):
        return None
    zone = (instance.get("Placement") or {}).get("AvailabilityZone", "")
    return Launch(
        instance_id=instance["InstanceId"],
        state=(instance.get("State") or {}).get("Name", ""),
        launched_at=launched_at,
        nodepool=nodepool,
        command_id=command_id,
        workflow_id=workflow_id,
        first_run_id=first_run_id,
        provider_id=aws_provider_id(zone, instance["InstanceId"]),
        instance_type=instance.get("InstanceType", ""),
        capacity_type=tags.get(TAG_CAPACITY_TYPE) or instance.get("InstanceLifecycle") or "on-demand",
    )


def command_state(
    found: bool, running: bool, run_id: str, first_run_id: str, launched_by: str
) -> CommandState:
    """Whether the command chain that launched an instance (`launched_by`: the first run id in its
    tag) is closed, from a describe of its workflow id (the latest run). Only one run of an id runs at
    a time, so a latest run that is closed closes every chain of the id; a running one is this chain
    (open) or a later command that reused the id (this one is closed). A reset keeps the chain's first
    run id: the reset run is the same command. Without the first run id (an older server) a running
    run that is not the tagged one might be its reset: in doubt."""
    if not found or not running:
        return "closed"
    if first_run_id:
        return "open" if first_run_id == launched_by else "closed"
    return "open" if run_id == launched_by else "unknown"


@dataclass(frozen=True)
class NodeFacts:
    """What the rule reads of a Node."""

    name: str
    uid: str
    initialized: bool
    unregistered: bool
    ready: bool
    deleting: bool
    held: bool

    @classmethod
    def of(cls, node: Json) -> NodeFacts:
        meta = node.get("metadata") or {}
        return cls(
            name=meta.get("name") or "",
            uid=meta.get("uid") or "",
            initialized=(meta.get("labels") or {}).get(INITIALIZED_LABEL) == "true",
            unregistered=has_taint(node, UNREGISTERED_TAINT_KEY),
            ready=is_ready(node),
            deleting=bool(meta.get("deletionTimestamp")),
            held=bool((meta.get("annotations") or {}).get(HOLDER_ANNOTATION))
            or any(has_taint(node, key) for key in DISRUPTION_TAINT_KEYS),
        )

    @property
    def never_initialized(self) -> bool:
        """Not initialized and unable to run pods: still unregistered, or not Ready."""
        return not self.initialized and (self.unregistered or not self.ready)

    @property
    def releasable(self) -> bool:
        """A Node the collector may delete once its instance is gone: no one else acts on it."""
        return self.never_initialized and not self.deleting and not self.held


@dataclass(frozen=True)
class Suspect:
    """A launch that is garbage if its command is closed."""

    launch: Launch
    node: NodeFacts | None
    reason: GarbageReason
    why: str


def suspect(
    launch: Launch, node: NodeFacts | None, now: datetime, grace: timedelta, registration_ttl: timedelta
) -> Suspect | None:
    """The launch as a suspect, or None when it is not garbage whatever its command's state."""
    age = now - launch.launched_at
    if not launch.live:
        # Already ending: only a Node it left behind may remain to release.
        if node is not None and node.releasable:
            return Suspect(launch, node, "garbage_collected", f"its instance is {launch.state}")
        return None
    if node is None:
        if age < grace:
            return None
        return Suspect(launch, None, "garbage_collected", f"no Node registered in {_span(age)}")
    if not node.releasable or age < registration_ttl:
        return None
    what = "still unregistered" if node.unregistered else "not Ready"
    return Suspect(
        launch, node, "registration_timeout", f"Node {node.name} never initialized ({what}) in {_span(age)}"
    )


def _span(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
