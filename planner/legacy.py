"""Karpenter's older APIs mapped onto the v1 NodePool the planner understands.

karpflow grew out of a Provisioner-era setup, so snapshots may still hold:
- `karpenter.sh/v1alpha5` Provisioner (ttlSecondsAfterEmpty, ttlSecondsUntilExpired, consolidation.enabled);
- `karpenter.sh/v1beta1` NodePool (expireAfter under spec.disruption, WhenUnderutilized);
- nodes labelled `karpenter.sh/provisioner-name` instead of `karpenter.sh/nodepool`;
- nodes a v1beta1 controller was disrupting, tainted `karpenter.sh/disruption=disrupting:NoSchedule`
  (v1 uses `karpenter.sh/disrupted`).

The mapping (documented by Karpenter's v1beta1 and v1 migration guides):

| Provisioner-era setting           | v1 NodePool                                                      |
|-----------------------------------|------------------------------------------------------------------|
| ttlSecondsAfterEmpty: N           | consolidationPolicy: WhenEmpty, consolidateAfter: Ns             |
| consolidation.enabled: true       | consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s |
| neither of the two                | consolidateAfter: Never (v1alpha5 never removed such nodes)      |
| ttlSecondsUntilExpired: N         | template.spec.expireAfter: Ns                                    |
| ttlSecondsUntilExpired absent     | template.spec.expireAfter: Never (v1alpha5 had no default expiry)|
| labels / annotations / taints / startupTaints / requirements | template.metadata / template.spec  |
| providerRef.name                  | template.spec.nodeClassRef (EC2NodeClass of the same name)       |
| limits.resources                  | limits                                                           |

A TTL that is not a whole, non-negative number of seconds is reported and reads as Never (nothing
is emptied or expired for it), like every invalid duration karpflow reads (api/duration.py).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from api.duration import NEVER, DurationError, ttl_seconds

PROVISIONER_KIND = "Provisioner"
AWS_NODE_TEMPLATE_KIND = "AWSNodeTemplate"
LEGACY_PROVISIONER_LABEL = "karpenter.sh/provisioner-name"


def _ttl(spec: Mapping[str, Any], field: str, problems: list[str]) -> str:
    """The TTL as a duration; Never when absent, or when invalid (then reported)."""
    value = spec.get(field)
    if value is None:
        return NEVER
    try:
        return f"{int(ttl_seconds(value).total_seconds())}s"
    except DurationError as err:
        problems.append(f"spec.{field}: {err} (read as Never)")
        return NEVER


def provisioner_to_nodepool(provisioner: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A v1alpha5 Provisioner as a v1 NodePool dict (input is not modified), and its invalid TTLs."""
    spec = provisioner.get("spec") or {}
    meta = provisioner.get("metadata") or {}
    problems: list[str] = []
    consolidation_enabled = bool((spec.get("consolidation") or {}).get("enabled"))
    after_empty = _ttl(spec, "ttlSecondsAfterEmpty", problems)
    if consolidation_enabled:
        disruption = {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}
    else:
        disruption = {"consolidationPolicy": "WhenEmpty", "consolidateAfter": after_empty}
    template_spec: dict[str, Any] = {
        "requirements": copy.deepcopy(spec.get("requirements") or []),
        "taints": copy.deepcopy(spec.get("taints") or []),
        "startupTaints": copy.deepcopy(spec.get("startupTaints") or []),
        "expireAfter": _ttl(spec, "ttlSecondsUntilExpired", problems),
    }
    provider_ref = spec.get("providerRef") or {}
    if provider_ref.get("name"):
        template_spec["nodeClassRef"] = {
            "group": "karpenter.k8s.aws",
            "kind": "EC2NodeClass",
            "name": provider_ref["name"],
        }
    nodepool: dict[str, Any] = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {
            "name": meta.get("name", ""),
            "annotations": {"karpflow.io/converted-from": "karpenter.sh/v1alpha5 Provisioner"},
        },
        "spec": {
            "template": {
                "metadata": {
                    "labels": dict(spec.get("labels") or {}),
                    "annotations": dict(spec.get("annotations") or {}),
                },
                "spec": template_spec,
            },
            "disruption": disruption,
            "limits": dict((spec.get("limits") or {}).get("resources") or {}),
        },
    }
    if spec.get("weight") is not None:
        nodepool["spec"]["weight"] = spec["weight"]
    return nodepool, problems


def upgrade_v1beta1_nodepool(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A karpenter.sh/v1beta1 NodePool in v1 shape: expireAfter moved from disruption to the template."""
    out = copy.deepcopy(dict(raw))
    spec = out.setdefault("spec", {})
    disruption = spec.setdefault("disruption", {}) or {}
    expire = disruption.pop("expireAfter", None)
    if expire is not None:
        template_spec = spec.setdefault("template", {}).setdefault("spec", {})
        template_spec.setdefault("expireAfter", expire)
    # v1beta1 only allowed consolidateAfter with WhenEmpty; WhenUnderutilized acted at once.
    if disruption.get("consolidationPolicy") == "WhenUnderutilized":
        disruption.setdefault("consolidateAfter", "0s")
    out["apiVersion"] = "karpenter.sh/v1"
    return out


def is_legacy_nodepool(raw: Mapping[str, Any]) -> bool:
    return str(raw.get("apiVersion", "")).endswith("/v1beta1")


def node_pool_name(labels: Mapping[str, str], nodepool_label: str) -> str | None:
    """The node's pool: the v1 label, else the Provisioner-era label."""
    return labels.get(nodepool_label) or labels.get(LEGACY_PROVISIONER_LABEL)


def migration_warning(obj: Mapping[str, Any]) -> str | None:
    """What to tell the operator about a seed-era object (shown by `karpflow plan` and the
    controller's status), naming the newer field for each setting in use; None for a v1 object."""
    # Any object of the kind reaches here (a snapshot file, a served object): its parser reports a
    # malformed metadata or spec; the warning must not fail on it first.
    metadata = obj.get("metadata")
    name = metadata.get("name", "?") if isinstance(metadata, Mapping) else "?"
    kind = obj.get("kind")
    if kind == PROVISIONER_KIND:
        spec = obj.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        moves = [
            f"{old} -> NodePool {new}"
            for old, new, present in (
                (
                    "ttlSecondsAfterEmpty",
                    "spec.disruption.consolidateAfter (WhenEmpty)",
                    "ttlSecondsAfterEmpty" in spec,
                ),
                (
                    "ttlSecondsUntilExpired",
                    "spec.template.spec.expireAfter",
                    "ttlSecondsUntilExpired" in spec,
                ),
                ("consolidation.enabled", "spec.disruption.consolidationPolicy", "consolidation" in spec),
                ("providerRef", "spec.template.spec.nodeClassRef (an EC2NodeClass)", "providerRef" in spec),
            )
            if present
        ]
        detail = f": {'; '.join(moves)}" if moves else ""
        return f"warning: Provisioner {name} (karpenter.sh/v1alpha5) is read as NodePool {name}{detail}"
    if kind == AWS_NODE_TEMPLATE_KIND:
        return (
            f"warning: AWSNodeTemplate {name} (karpenter.k8s.aws/v1alpha1) is not read: migrate it to an "
            "EC2NodeClass (karpenter.k8s.aws/v1; subnetSelector -> subnetSelectorTerms, "
            "securityGroupSelector -> securityGroupSelectorTerms, amiFamily -> amiSelectorTerms alias)"
        )
    if is_legacy_nodepool(obj):
        return (
            f"warning: NodePool {name} is karpenter.sh/v1beta1: read as v1 "
            "(spec.disruption.expireAfter -> spec.template.spec.expireAfter)"
        )
    return None
