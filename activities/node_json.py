"""Small pure helpers on Node JSON, shared by the Kubernetes activities and the controller's
housekeeping: taints, labels, annotations, the termination finalizer and deadline, readiness, and
pinning a write to the node's UID (a node name is not an identity).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from api.constants import (
    DISRUPTION_TAINT_KEYS,
    HOLDER_ANNOTATION,
    KNOWN_EPHEMERAL_TAINT_KEYS,
    TERMINATION_FINALIZER,
    TERMINATION_TIMESTAMP_ANNOTATION,
    UNREGISTERED_TAINT_KEY,
)
from api.workflow_io import TaintSpec
from kube.client import Json
from kube.times import parse_time, rfc3339


def _taints(node: Json) -> list[Json]:
    return list((node.get("spec") or {}).get("taints") or [])


def has_taint(node: Json, key: str, effect: str | None = None) -> bool:
    return any(t.get("key") == key and (effect is None or t.get("effect") == effect) for t in _taints(node))


def add_taint(node: Json, taint: Json) -> bool:
    if has_taint(node, taint["key"], taint["effect"]):
        return False
    node.setdefault("spec", {})["taints"] = [*_taints(node), taint]
    return True


def remove_taint(node: Json, key: str, effect: str | None = None) -> bool:
    kept = [
        t
        for t in _taints(node)
        if not (t.get("key") == key and (effect is None or t.get("effect") == effect))
    ]
    if len(kept) == len(_taints(node)):
        return False
    node.setdefault("spec", {})["taints"] = kept
    return True


def set_labels(node: Json, labels: dict[str, str]) -> bool:
    current = node.setdefault("metadata", {}).setdefault("labels", {})
    changed = any(current.get(k) != v for k, v in labels.items())
    current.update(labels)
    return changed


def set_annotations(node: Json, annotations: dict[str, str]) -> bool:
    current = node.setdefault("metadata", {}).setdefault("annotations", {})
    changed = any(current.get(k) != v for k, v in annotations.items())
    current.update(annotations)
    return changed


def ensure_finalizer(node: Json) -> bool:
    finalizers = node.setdefault("metadata", {}).setdefault("finalizers", [])
    if TERMINATION_FINALIZER in finalizers:
        return False
    finalizers.append(TERMINATION_FINALIZER)
    return True


def drop_finalizer(node: Json) -> bool:
    finalizers = (node.get("metadata") or {}).get("finalizers") or []
    if TERMINATION_FINALIZER not in finalizers:
        return False
    node["metadata"]["finalizers"] = [f for f in finalizers if f != TERMINATION_FINALIZER]
    return True


def is_ready(node: Json) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or ()
    )


def uid_of(node: Json) -> str | None:
    return (node.get("metadata") or {}).get("uid")


def another_node(node: Json | None, uid: str | None, provider_id: str | None = None) -> str | None:
    """Why `node` is not the node a workflow was pinned to (by UID, and by providerID when both are
    known), or None when it is (or nothing is pinned, or no node has the name)."""
    if node is None:
        return None
    name = node["metadata"]["name"]
    if uid and uid_of(node) != uid:
        return f"node {name} is another node now (uid {uid_of(node)}, not {uid}): the name was reused"
    current = (node.get("spec") or {}).get("providerID")
    if provider_id and current and current != provider_id:
        return f"node {name} is another node now (providerID {current}, not {provider_id})"
    return None


def annotated_deadline(node: Json | None) -> datetime | None:
    """The node's `karpenter.sh/nodeclaim-termination-timestamp` (None when absent or unreadable)."""
    value = ((node or {}).get("metadata", {}).get("annotations") or {}).get(TERMINATION_TIMESTAMP_ANNOTATION)
    try:
        return parse_time(value)
    except ValueError:
        return None


def bring_deadline_forward(node: Json, deadline: datetime) -> bool:
    """Stamp the termination deadline on the node, or move it earlier; never later. Whoever knows
    of an earlier one (a spot interruption's two minutes) shortens a drain already under way: the
    drain re-reads it."""
    existing = annotated_deadline(node)
    if existing is not None and existing <= deadline.astimezone(UTC).replace(microsecond=0):
        return False  # what the annotation holds already comes first (it has one-second resolution)
    return set_annotations(node, {TERMINATION_TIMESTAMP_ANNOTATION: rfc3339(deadline)})


def pinned(uid: str | None, mutate: Callable[[Json], bool]) -> Callable[[Json], bool]:
    """`mutate` for update_node, applied only to the node with `uid` (checked on the very version the
    write replaces); another node of the name is left as it is."""

    def guarded(node: Json) -> bool:
        if another_node(node, uid) is not None:
            return False
        return mutate(node)

    return guarded


def instance_id_of(provider_id: str | None) -> str | None:
    """`aws:///us-west-2a/i-0123` → `i-0123`."""
    if not provider_id or not provider_id.startswith("aws://"):
        return None
    tail = provider_id.rsplit("/", 1)[-1]
    return tail if tail.startswith("i-") else None


def initialization_blockers(node: Json, startup_taints: list[TaintSpec]) -> list[str]:
    """Why the node is not initialized yet (empty: it is). Karpenter §4: Ready, no startup taint and no
    known ephemeral taint left."""
    blockers = [] if is_ready(node) else ["not Ready"]
    for taint in startup_taints:
        if has_taint(node, taint.key, taint.effect):
            blockers.append(f"startup taint {taint.key}:{taint.effect}")
    for key in (*KNOWN_EPHEMERAL_TAINT_KEYS, UNREGISTERED_TAINT_KEY):
        if has_taint(node, key):
            blockers.append(f"taint {key}")
    return blockers


def replacement_leaving(node: Json) -> str | None:
    """Why a replacement's node will not be capacity although it may be Ready (None: it will be):
    it is being deleted, or a disruption holds it (a spot interruption of a node still booting, say).
    A command that counted it would drain its candidates onto a node that is going away."""
    if node["metadata"].get("deletionTimestamp"):
        return "is being deleted"
    for taint in _taints(node):
        if taint.get("key") in DISRUPTION_TAINT_KEYS:
            holder = (node["metadata"].get("annotations") or {}).get(HOLDER_ANNOTATION)
            return f"carries {taint.get('key')}" + (f" (held by {holder})" if holder else "")
    return None
