"""The drift hashes: what a node records at launch so that later template changes can be seen.

`karpenter.sh/nodepool-hash` and `karpenter.k8s.aws/ec2nodeclass-hash` (with their `-version`
annotations). The launch activity stamps them and the planner's drift rule compares them, so they
live here, where both import from. The version names karpflow's own hash (it is not Karpenter's
byte for byte): a node stamped by another version is re-stamped, never drifted, as Karpenter does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from api.constants import (
    NODECLASS_HASH_ANNOTATION,
    NODECLASS_HASH_VERSION_ANNOTATION,
    NODEPOOL_HASH_ANNOTATION,
    NODEPOOL_HASH_VERSION_ANNOTATION,
)
from api.duration import format_duration, parse_optional_duration
from api.nodepool import EC2NodeClass, NodePool

NODEPOOL_HASH_VERSION = "karpflow-v1"
NODECLASS_HASH_VERSION = "karpflow-v1"


def _digest(document: Any) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _prune(value: Any) -> Any:
    """Drop zero values (None, "", empty maps and lists) so `{}` and a missing field hash alike."""
    if isinstance(value, Mapping):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in (None, "", {}, [])}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def _normal_duration(value: str | None) -> str | None:
    return None if value is None else format_duration(parse_optional_duration(value))


def nodepool_hash(pool: NodePool) -> str:
    """Stable hash of the template fields whose change must replace nodes: template labels and
    annotations, taints and startupTaints (as sets), expireAfter, terminationGracePeriod and
    nodeClassRef. Not hashed: requirements (checked separately, widening must not drift), disruption
    settings, limits and weight."""
    template = pool.spec.template
    spec = template.spec
    document = {
        "labels": dict(template.metadata.labels),
        "annotations": dict(template.metadata.annotations),
        "taints": sorted(json.dumps(t.to_wire(), sort_keys=True) for t in spec.taints),
        "startupTaints": sorted(json.dumps(t.to_wire(), sort_keys=True) for t in spec.startup_taints),
        "expireAfter": _normal_duration(spec.expire_after),
        "terminationGracePeriod": _normal_duration(spec.termination_grace_period),
        "nodeClassRef": spec.node_class_ref.to_wire() if spec.node_class_ref else None,
    }
    return _digest(_prune(document))


def nodepool_hash_annotations(pool: NodePool) -> dict[str, str]:
    """The annotations a node launched for `pool` must carry (the launch workflow stamps them)."""
    return {
        NODEPOOL_HASH_ANNOTATION: nodepool_hash(pool),
        NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION,
    }


def nodeclass_hash(nodeclass: EC2NodeClass) -> str:
    """Hash of the EC2NodeClass spec minus the selector terms (their resolved status is compared
    instead): role, instance profile, AMI family, user data, tags, block devices, metadata options,
    kubelet."""
    spec = nodeclass.spec.model_dump(
        mode="json",
        # ipPrefixCount is not hashed by Karpenter either: changing it does not replace nodes.
        exclude={
            "ami_selector_terms",
            "subnet_selector_terms",
            "security_group_selector_terms",
            # hash:"ignore" in Karpenter's EC2NodeClass: a new reservation replaces no node.
            "capacity_reservation_selector_terms",
            "ip_prefix_count",
        },
        exclude_none=True,
    )
    return _digest(_prune(spec))


def nodeclass_hash_annotations(nodeclass: EC2NodeClass) -> dict[str, str]:
    return {
        NODECLASS_HASH_ANNOTATION: nodeclass_hash(nodeclass),
        NODECLASS_HASH_VERSION_ANNOTATION: NODECLASS_HASH_VERSION,
    }


def rollout_target(pool: NodePool, nodeclass: EC2NodeClass | None) -> str:
    """What a node launched for `pool` today would be, as a short digest: the pool's template hash and
    requirements, the EC2NodeClass's hash and the AMIs, subnets and security groups its status
    resolved. A change of any of them is a new target for the pool's rollout waves (a halted target
    stays halted until the NodePool or EC2NodeClass moves on: api/rollout_policy.py)."""
    document: dict[str, Any] = {
        "nodepool": nodepool_hash(pool),
        "requirements": sorted(
            json.dumps(r.model_dump(mode="json"), sort_keys=True)
            for r in pool.spec.template.spec.requirements
        ),
    }
    if nodeclass is not None:
        status = nodeclass.status
        document["nodeclass"] = nodeclass_hash(nodeclass)
        document["amis"] = sorted(a.id for a in status.amis)
        document["subnets"] = sorted(s.id for s in status.subnets)
        document["securityGroups"] = sorted(g.id for g in status.security_groups)
    return _digest(document)[:10]
