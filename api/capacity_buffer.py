"""CapacityBuffer (`autoscaling.x-k8s.io/v1beta1`, the upstream Cluster Autoscaler API Karpenter
v1.14 reads behind its CapacityBuffer feature gate) and the PodTemplates buffers name, as karpflow
reads them.

What karpflow may read is what the user and the buffer controller (Karpenter's
pkg/controllers/capacitybuffer, or Cluster Autoscaler's) write: the spec's `podTemplateRef` or
`scalableRef`, and the status the controller fills in (`replicas`, the `ReadyForProvisioning`
condition). The buffer's pods themselves are never written anywhere: Karpenter builds them in memory
(pkg/state/virtualpods), and so does karpflow (planner/capacity_buffers.py).

A buffer is read as Karpenter's `isBufferReadyForProvisioning` reads it (pkg/state/virtualpods/
utilities.go): ReadyForProvisioning True, `status.replicas` > 0, and a `podTemplateRef` or
`scalableRef` in its spec. A malformed buffer is kept with its problem, so the planner can fail
closed on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CAPACITY_BUFFER_KIND = "CapacityBuffer"
CAPACITY_BUFFER_GROUP = "autoscaling.x-k8s.io"
CAPACITY_BUFFER_VERSION = "v1beta1"
CAPACITY_BUFFER_PLURAL = "capacitybuffers"
CAPACITY_BUFFER_API_VERSION = f"{CAPACITY_BUFFER_GROUP}/{CAPACITY_BUFFER_VERSION}"
POD_TEMPLATE_KIND = "PodTemplate"
READY_FOR_PROVISIONING = "ReadyForProvisioning"


@dataclass(frozen=True, slots=True)
class CapacityBuffer:
    namespace: str
    name: str
    uid: str
    ready: bool  # ReadyForProvisioning True with replicas > 0 and a template reference
    replicas: int  # status.replicas (0 when unset)
    pod_template: str | None  # spec.podTemplateRef.name
    scalable: str | None  # spec.scalableRef as "Kind/name"
    problem: str | None = None  # what makes it unreadable (it is then not ready)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """A PodTemplate's `template` (metadata and spec of the pods it stands for)."""

    namespace: str
    name: str
    template: Mapping[str, Any]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def read_capacity_buffer(obj: Mapping[str, Any]) -> CapacityBuffer:
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    problem: str | None = None
    pod_template = _ref_name(spec.get("podTemplateRef"))
    scalable_ref = spec.get("scalableRef")
    scalable: str | None = None
    if isinstance(scalable_ref, Mapping) and scalable_ref.get("name"):
        scalable = f"{scalable_ref.get('kind') or '?'}/{scalable_ref['name']}"
    raw_replicas = status.get("replicas")
    replicas = 0
    if raw_replicas is not None:
        if isinstance(raw_replicas, int) and not isinstance(raw_replicas, bool):
            replicas = raw_replicas
        else:
            problem = f"status.replicas {raw_replicas!r} is not an integer"
    conditions = status.get("conditions") or ()
    ready_condition = any(
        isinstance(c, Mapping) and c.get("type") == READY_FOR_PROVISIONING and c.get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else ())
    )
    ready = problem is None and ready_condition and replicas > 0 and (pod_template or scalable) is not None
    return CapacityBuffer(namespace, name, uid, ready, replicas, pod_template, scalable, problem)


def read_pod_template(obj: Mapping[str, Any]) -> PodTemplate:
    meta = obj.get("metadata") or {}
    template = obj.get("template")
    if not isinstance(template, Mapping):
        raise ValueError("template is missing")
    return PodTemplate(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), template)


def _ref_name(ref: Any) -> str | None:
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref["name"]:
        return str(ref["name"])
    return None
