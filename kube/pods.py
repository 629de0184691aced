"""What a pod (or node) is, for disruption: its controlling owner, static/mirror pods, critical pods,
and Karpenter's do-not-disrupt protection. Plain functions of the object's fields, so the planner's
slim parsed pods and the drain's JSON views apply the same rule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from api.constants import (
    CRITICAL_PRIORITY_CLASSES,
    DO_NOT_DISRUPT_ANNOTATION,
    LEGACY_DO_NOT_CONSOLIDATE_ANNOTATION,
    LEGACY_DO_NOT_EVICT_ANNOTATION,
    MIRROR_POD_ANNOTATION,
)
from api.duration import DurationError, karpenter_duration


def controller_owner(owner_references: Iterable[Mapping[str, Any]] | None) -> tuple[str | None, str | None]:
    """(kind, name) of the owner that controls the object, else of its first owner; (None, None)."""
    owners = list(owner_references or ())
    if not owners:
        return None, None
    owner = next((o for o in owners if o.get("controller")), owners[0])
    return owner.get("kind"), owner.get("name")


def is_mirror(annotations: Mapping[str, str], owner_kind: str | None) -> bool:
    """Static pods: the kubelet owns them; they are neither evicted nor rescheduled."""
    return MIRROR_POD_ANNOTATION in annotations or owner_kind == "Node"


def is_critical(priority_class_name: str | None) -> bool:
    """Drained last (Kubernetes graceful node shutdown order)."""
    return priority_class_name in CRITICAL_PRIORITY_CLASSES


def _do_not_disrupt_window(value: str) -> tuple[timedelta | None, str | None]:
    """(protection window, problem) of a pod's do-not-disrupt value other than "true"/"false"."""
    try:
        return karpenter_duration(value, never_ok=False), None
    except DurationError as err:
        return None, f'{DO_NOT_DISRUPT_ANNOTATION}={value!r}: {err} (the pod is protected as with "true")'


def do_not_disrupt_problem(annotations: Mapping[str, str]) -> str | None:
    """Why the pod's do-not-disrupt annotation is invalid (for the plan's problems), or None."""
    value = annotations.get(DO_NOT_DISRUPT_ANNOTATION)
    if value is None or value in ("true", "false"):
        return None
    return _do_not_disrupt_window(value)[1]


def do_not_disrupt_reason(
    annotations: Mapping[str, str], started: datetime | None, now: datetime
) -> str | None:
    """The annotation that protects an active pod from voluntary disruption right now, or None.

    `karpenter.sh/do-not-disrupt: "true"` protects while the pod runs; a Go duration ("30m") protects
    for that long after the pod started (Karpenter HEAD), and for ever when its start is unknown (the
    window cannot be shown to have ended); "false" and "0s" do not protect. Any other value (a
    negative duration, "1d", a typo) fails closed: it protects like "true" and is reported
    (`do_not_disrupt_problem`); Karpenter reads it as absent instead, evicting the pod its owner
    meant to protect. The v1alpha5 `karpenter.sh/do-not-evict: "true"` is honoured like "true".
    Whether the pod is active is the caller's question."""
    value = annotations.get(DO_NOT_DISRUPT_ANNOTATION)
    if value is not None and value != "false":
        if value == "true":
            return DO_NOT_DISRUPT_ANNOTATION
        window, problem = _do_not_disrupt_window(value)
        if problem is not None:
            return f'{DO_NOT_DISRUPT_ANNOTATION}={value} (invalid: protected as "true")'
        assert window is not None
        if window.total_seconds() > 0 and (started is None or now < started + window):
            return f"{DO_NOT_DISRUPT_ANNOTATION}={value}"
    if annotations.get(LEGACY_DO_NOT_EVICT_ANNOTATION) == "true":
        return LEGACY_DO_NOT_EVICT_ANNOTATION
    return None


def node_do_not_disrupt_reason(annotations: Mapping[str, str]) -> str | None:
    """A node's own protection: `karpenter.sh/do-not-disrupt: "true"` blocks every voluntary disruption
    of it; the v1alpha5 `karpenter.sh/do-not-consolidate: "true"` blocks consolidation only, which the
    caller decides about (see `node_do_not_consolidate`)."""
    if annotations.get(DO_NOT_DISRUPT_ANNOTATION) == "true":
        return DO_NOT_DISRUPT_ANNOTATION
    return None


def node_do_not_consolidate(annotations: Mapping[str, str]) -> bool:
    return annotations.get(LEGACY_DO_NOT_CONSOLIDATE_ANNOTATION) == "true"
