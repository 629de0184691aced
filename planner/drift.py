"""Drift: nodes that no longer match what their NodePool / EC2NodeClass would launch today (§6).

Detection, first hit wins:
1. the node's NodeClaim already says `Drifted=True` (trusted as is);
2. NodePoolDrifted: the node's `karpenter.sh/nodepool-hash` differs from `nodepool_hash(pool)`, compared
   only when the node's `karpenter.sh/nodepool-hash-version` is ours (`NODEPOOL_HASH_VERSION`). Nodes
   launched by another tool (or by Karpenter, whose hash is computed differently) carry another
   version or none and are never drifted by the hash: adopting a cluster cannot drift it all at once.
   `hash_stamps(snapshot)` lists the nodes to re-stamp so later template changes do drift them;
3. RequirementsDrifted: the node's labels no longer satisfy the NodePool requirements (narrowing
   drifts, widening never does). Well-known labels a node lacks are taken from the catalog; a value
   still unknown never causes drift;
4. InstanceTypeNotFound (only with `options.instance_type_drift`): the type or its offering for the
   node's zone and capacity type left the catalog, for nodes older than 1 h;
5. EC2NodeClass: NodeClassDrifted (our `ec2nodeclass-hash` of the spec minus selector terms, same
   version rule), AMIDrift (the node's image is not among `status.amis` that fit the node),
   SubnetDrift (its instance's subnet is not in `status.subnets`), SecurityGroupDrift (its
   instance's security groups differ from `status.securityGroups`). As in Karpenter these are facts
   of the instance, not labels: the image is the NodeClaim's `status.imageID` when Karpenter launched
   the node, else EC2's, and subnet and groups are EC2's (`Node.instance`, which the planning
   activity reads from DescribeInstances). Missing information on either side never causes drift.

Besides, a node karpflow marked `karpflow.dev/rollout-requested: <rollout id>` (`karpflow rollout`,
workflows/rollout.py) is drifted with reason RolloutRequested, checked right after the NodeClaim's
condition: a rollout is drift the operator asked for, with every control drift has.

Acting (`Drift` method): eventual class, budget reason Drifted, no validation delay. Empty drifted
nodes first, then oldest drifted first; for each candidate within the controls whose pods can all
be placed, one command with the new nodes the simulation needs (none: a plain delete). Karpenter
starts one per pass; here a pass starts up to `PlanOptions.drift_commands_per_pass`, validated
together (planner/drift_batch.py); 1 is Karpenter's pace. A static NodePool's drifted nodes are
left to StaticDrift (planner/static_drift.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from api.constants import (
    ARCH_LABEL,
    CAPACITY_TYPE_LABEL,
    HOSTNAME_LABEL,
    INSTANCE_TYPE_LABEL,
    NODECLASS_HASH_ANNOTATION,
    NODECLASS_HASH_VERSION_ANNOTATION,
    NODEPOOL_HASH_ANNOTATION,
    NODEPOOL_HASH_VERSION_ANNOTATION,
    OS_LABEL,
    REASON_DRIFTED,
    REGION_LABEL,
    ROLLOUT_ANNOTATION,
    ZONE_LABEL,
)
from api.hashes import (
    NODECLASS_HASH_VERSION,
    NODEPOOL_HASH_VERSION,
    nodeclass_hash,
    nodeclass_hash_annotations,
    nodepool_hash,
    nodepool_hash_annotations,
)
from api.nodepool import EC2NodeClass, NodePool
from kube.selectors import Requirement
from planner.drift_batch import DriftBatch
from planner.model import (
    DRIFT,
    BudgetMap,
    Candidate,
    Command,
    DisruptionClass,
    DriftStatus,
    PlanContext,
    Replacement,
    ValidationResult,
)
from planner.rollout_holds import drift_hold
from planner.snapshot import Node

# Our hash algorithm's version. Deliberately not Karpenter's "v3": the two hashes are computed
# differently, so equal versions would make every Karpenter-launched node look drifted.

# Labels Karpenter treats as well-known: a NodePool may constrain them even if a node lacks them.
WELL_KNOWN_PREFIXES = ("karpenter.k8s.aws/", "karpenter.sh/")
WELL_KNOWN_LABELS = frozenset(
    {
        ZONE_LABEL,
        REGION_LABEL,
        INSTANCE_TYPE_LABEL,
        ARCH_LABEL,
        OS_LABEL,
        CAPACITY_TYPE_LABEL,
        HOSTNAME_LABEL,
        "topology.k8s.aws/zone-id",
        "node.kubernetes.io/windows-build",
    }
)
INSTANCE_TYPE_DRIFT_MIN_AGE = timedelta(hours=1)
# The drift reason of a node a RolloutWorkflow marked (`karpflow rollout`): replaced as drift is, under
# the Drifted budget reason and the Drift window action; only the detail says why.
ROLLOUT_REQUESTED = "RolloutRequested"


# --- Hashes (api/hashes.py computes them: the launch activity stamps the same) ---------------


def hash_stamps(ctx: PlanContext) -> dict[str, dict[str, str]]:
    """Managed nodes whose hash annotations are missing or of another version, with the annotations
    to patch onto them (adoption: from then on, template changes drift them). Drifted nodes are
    left alone, as Karpenter's hash controller does."""
    out: dict[str, dict[str, str]] = {}
    for node, pool in ctx.snapshot.live_managed_nodes():
        patch: dict[str, str] = {}
        if node.annotation(NODEPOOL_HASH_VERSION_ANNOTATION) != NODEPOOL_HASH_VERSION:
            patch.update(nodepool_hash_annotations(pool))
        nodeclass = _nodeclass_of(ctx, node, pool)
        if (
            nodeclass is not None
            and node.annotation(NODECLASS_HASH_VERSION_ANNOTATION) != NODECLASS_HASH_VERSION
        ):
            patch.update(nodeclass_hash_annotations(nodeclass))
        if patch and drift_status(ctx, node, pool) is None:
            out[node.name] = patch
    return out


# --- Detection ------------------------------------------------------------------------------------


def _nodeclass_of(ctx: PlanContext, node: Node, pool: NodePool) -> EC2NodeClass | None:
    name = node.nodeclass
    if not name and pool.spec.template.spec.node_class_ref is not None:
        name = pool.spec.template.spec.node_class_ref.name
    return ctx.snapshot.nodeclasses.get(name or "")


def node_labels_with_catalog(ctx: PlanContext, node: Node) -> dict[str, str]:
    """The node's labels, completed with the well-known labels its instance type implies."""
    instance_type = ctx.catalog.get(node.instance_type)
    if instance_type is None:
        return node.labels
    return {**instance_type.labels, **node.labels}


def _is_well_known(key: str) -> bool:
    return key in WELL_KNOWN_LABELS or key.startswith(WELL_KNOWN_PREFIXES)


def requirements_drift(ctx: PlanContext, node: Node, pool: NodePool) -> str | None:
    labels = node_labels_with_catalog(ctx, node)
    for raw in pool.spec.template.spec.requirements:
        requirement = Requirement(raw.key, raw.operator, frozenset(raw.values), karpenter=True)
        value = labels.get(raw.key)
        if value is None and _is_well_known(raw.key):
            continue  # unknown, not wrong
        if not requirement.matches_value(value):
            shown = "absent" if value is None else repr(value)
            return f"label {raw.key} is {shown}, the nodepool now requires {requirement}"
    return None


def instance_type_drift(ctx: PlanContext, node: Node) -> str | None:
    created = node.creation_timestamp
    if created is None or ctx.now - created < INSTANCE_TYPE_DRIFT_MIN_AGE or not node.instance_type:
        return None
    instance_type = ctx.catalog.get(node.instance_type)
    if instance_type is None:
        return f"instance type {node.instance_type} is no longer offered"
    if node.zone and node.capacity_type:
        offering = instance_type.offering(node.zone, node.capacity_type)
        if offering is None and not (
            node.capacity_type == "reserved" and instance_type.offering(node.zone, "on-demand") is not None
        ):
            return f"no {node.capacity_type} offering of {node.instance_type} in {node.zone} any more"
    return None


def nodeclass_drift(ctx: PlanContext, node: Node, pool: NodePool) -> tuple[str, str] | None:
    nodeclass = _nodeclass_of(ctx, node, pool)
    if nodeclass is None:
        return None
    if node.annotation(NODECLASS_HASH_VERSION_ANNOTATION) == NODECLASS_HASH_VERSION:
        recorded = node.annotation(NODECLASS_HASH_ANNOTATION)
        if recorded is not None and recorded != nodeclass_hash(nodeclass):
            return "NodeClassDrifted", f"ec2nodeclass {nodeclass.name} spec changed since launch"
    status = nodeclass.status
    instance = node.instance
    ami = (node.nodeclaim.image_id if node.nodeclaim else None) or (instance.image_id if instance else None)
    if ami and status.amis:
        labels = node_labels_with_catalog(ctx, node)
        fitting = {
            a.id
            for a in status.amis
            if all(
                Requirement(r.key, r.operator, frozenset(r.values)).matches(labels) for r in a.requirements
            )
        }
        if ami not in fitting:
            return "AMIDrift", f"AMI {ami} is no longer among ec2nodeclass {nodeclass.name} status.amis"
    if instance is None:
        return None
    subnet = instance.subnet_id
    if subnet and status.subnets and subnet not in {s.id for s in status.subnets}:
        return (
            "SubnetDrift",
            f"subnet {subnet} is no longer among ec2nodeclass {nodeclass.name} status.subnets",
        )
    if instance.security_group_ids and status.security_groups:
        mine = set(instance.security_group_ids)
        wanted = {g.id for g in status.security_groups}
        if mine != wanted:
            return (
                "SecurityGroupDrift",
                f"security groups {sorted(mine)} differ from ec2nodeclass {nodeclass.name} {sorted(wanted)}",
            )
    return None


def drift_status(ctx: PlanContext, node: Node, pool: NodePool) -> DriftStatus | None:
    """Whether and why `node` is drifted (None: it is not)."""
    claim = node.nodeclaim
    if claim is not None and claim.condition_true("Drifted"):
        condition = claim.conditions["Drifted"]
        return DriftStatus(condition.reason or "Drifted", condition.message or "", condition.last_transition)
    since = _drift_since(node)
    rollout = node.annotation(ROLLOUT_ANNOTATION)
    if rollout:
        return DriftStatus(ROLLOUT_REQUESTED, f"rollout {rollout} asks for its replacement", since)
    if node.annotation(NODEPOOL_HASH_VERSION_ANNOTATION) == NODEPOOL_HASH_VERSION:
        recorded = node.annotation(NODEPOOL_HASH_ANNOTATION)
        if recorded is not None and recorded != _pool_hash(ctx, pool):
            return DriftStatus(
                "NodePoolDrifted", f"nodepool {pool.name} template changed since launch", since
            )
    detail = requirements_drift(ctx, node, pool)
    if detail is not None:
        return DriftStatus("RequirementsDrifted", detail, since)
    if ctx.options.instance_type_drift:
        detail = instance_type_drift(ctx, node)
        if detail is not None:
            return DriftStatus("InstanceTypeNotFound", detail, since)
    found = nodeclass_drift(ctx, node, pool)
    if found is not None:
        return DriftStatus(found[0], found[1], since)
    return None


def _pool_hash(ctx: PlanContext, pool: NodePool) -> str:
    key = ("nodepool_hash", pool.name)
    if key not in ctx.memo:
        ctx.memo[key] = nodepool_hash(pool)
    known: str = ctx.memo[key]
    return known


def _drift_since(node: Node) -> datetime | None:
    # Without a Drifted condition there is no record of when drift began; the node's age is the next
    # best order (the oldest nodes were launched from the oldest templates).
    return node.creation_timestamp


def drifted_by_pool(ctx: PlanContext, pools: set[str]) -> dict[str, list[Node]]:
    """The drifted nodes of these pools that no command holds yet (the rollouts' candidates)."""
    out: dict[str, list[Node]] = {}
    for node, pool in ctx.snapshot.live_managed_nodes():
        if pool.name in pools and not node.has_disrupted_taint and drift_status(ctx, node, pool) is not None:
            out.setdefault(pool.name, []).append(node)
    return out


# --- The method -----------------------------------------------------------------------------------


class Drift:
    """Replace drifted nodes, one command a node, as many per pass as the controls allow (§6.2 and
    planner/drift_batch.py)."""

    name = DRIFT
    reason = REASON_DRIFTED
    disruption_class = DisruptionClass.EVENTUAL
    consolidation_type = ""

    def should_disrupt(self, ctx: PlanContext, candidate: Candidate) -> bool:
        candidate.drift = drift_status(ctx, candidate.node, candidate.nodepool)
        # A static pool's drifted node is StaticDrift's (Karpenter drift.go ShouldDisrupt).
        if candidate.drift is None or candidate.nodepool.spec.is_static:
            return False
        # A pool with a rollout policy drifts in waves: only what a wave marked (planner/rollout_holds.py).
        hold = drift_hold(ctx, candidate.node, candidate.nodepool)
        if hold is not None:
            ctx.explain(candidate.name, self.name, hold)
            return False
        return True

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        def make(candidate: Candidate, replacements: list[Replacement]) -> Command:
            return Command(
                method=self.name,
                reason=self.reason,
                candidates=[candidate],
                replacements=replacements,
                disruption_class=self.disruption_class,
                message=drift_label(candidate),
            )

        batch = DriftBatch(ctx, self.name, budgets, ctx.options.drift_commands_per_pass, drift_label)
        return batch.run(sorted(candidates, key=_drift_order), make)

    def validate(self, ctx: PlanContext, command: Command) -> ValidationResult:
        # Drift commands run without the 15 s validation in Karpenter (§1.7); there is nothing to re-check.
        return ValidationResult(True, command)


def drift_label(candidate: Candidate) -> str:
    """What a drift command and the explanations say of a drifted candidate."""
    drift = candidate.drift
    return f"drifted ({drift.reason}: {drift.detail})" if drift is not None else "drifted"


def _drift_order(candidate: Candidate) -> tuple[bool, float, str]:
    since = candidate.drift.since if candidate.drift else None
    return (not candidate.is_empty, since.timestamp() if since else float("inf"), candidate.name)


# The seed-era marker (v0.2x Karpenter): drifted nodes carry `karpenter.sh/voluntary-disruption:
# drifted`, so dashboards and scripts written then keep working.
VOLUNTARY_DISRUPTION_ANNOTATION = "karpenter.sh/voluntary-disruption"
DRIFTED_MARKER = "drifted"


def voluntary_disruption_markers(ctx: PlanContext) -> list[tuple[str, str | None]]:
    """(node, value) changes of the marker: set on drifted, unmarked nodes; removed from nodes that no
    longer drift (drift fixed, or turned off); left alone when another controller set another value."""
    changes: list[tuple[str, str | None]] = []
    for node, pool in ctx.snapshot.live_managed_nodes():
        current = node.annotation(VOLUNTARY_DISRUPTION_ANNOTATION)
        if current is not None and current != DRIFTED_MARKER:
            continue
        drifted = ctx.options.drift and drift_status(ctx, node, pool) is not None
        if drifted and current is None:
            changes.append((node.name, DRIFTED_MARKER))
        elif not drifted and current == DRIFTED_MARKER:
            changes.append((node.name, None))
    return changes
