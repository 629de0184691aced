"""CapacityBuffer pods (Karpenter v1.14, `autoscaling.x-k8s.io/v1beta1`): placeholder capacity that
keeps a node from counting as empty.

Karpenter never writes a buffer's pods to the API. It builds them in memory from each ready buffer
(pkg/state/virtualpods/utilities.go `BuildVirtualPods`: `status.replicas` copies of the buffer's pod
template, named `capacity-buffer-<buffer>-<i>`, the template's labels, no nodeName, PVC and
ephemeral volumes dropped, the lowest priority), adds them to the pending pods of every scheduling
simulation (provisioner.go `GetPendingPods`), and remembers on which existing nodes its provisioning
pass placed them (state/cluster.go `UpdateBufferPodCounts`). Then:
- Emptiness skips a node hosting buffer pods (disruption/emptiness.go `ShouldDisrupt`, the event
  "Node ... has buffer pods"); with no other pod it is empty, so the consolidation methods leave it
  to emptiness too;
- consolidation counts them through the pending pods: a replacement must hold the real pods and the
  buffer pods that were on the candidate (disruption/consolidation_test.go "Buffer Pods").

karpflow does the same from what it can read (api/capacity_buffer.py): it builds the pods from the
buffer and its PodTemplate, gives them to the simulation as pending pods
(planner/scheduling/adapter.py `pending_pods`), and finds where they go with a simulation that moves
nothing (planner/buffer_hosts.py): the provisioner's placement of the pending pods. Where karpflow's placement
order differs from Karpenter's provisioner, so may the node it protects.

Fails closed: a ready buffer whose pods karpflow cannot build (a `scalableRef`, whose Deployment,
StatefulSet or ReplicaSet karpflow does not read; a PodTemplate it cannot find or parse) could sit on
any node, so while it is there no node is emptied, and the reason says which buffer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.snapshot import Pod, Snapshot, parse_pod

# Karpenter's marks on its virtual pods (pkg/apis/autoscaling/v1beta1/constants.go).
FAKE_POD_ANNOTATION = "karpenter.sh/capacity-buffer-fake-pod"
BUFFER_NAME_ANNOTATION = "karpenter.sh/capacity-buffer-name"
BUFFER_NAMESPACE_ANNOTATION = "karpenter.sh/capacity-buffer-namespace"
VIRTUAL_POD_PRIORITY = -(1 << 31)


def buffer_pods(snapshot: Snapshot) -> tuple[list[Pod], list[str]]:
    """The pods of every ready buffer, and why a ready buffer's pods cannot be built (one line each)."""
    pods: list[Pod] = []
    unresolved: list[str] = []
    for key in sorted(snapshot.capacity_buffers):
        buffer = snapshot.capacity_buffers[key]
        if not buffer.ready:
            continue
        if buffer.pod_template is None:
            unresolved.append(
                f"CapacityBuffer {key}: its scalableRef {buffer.scalable} is not read by karpflow yet"
            )
            continue
        template = snapshot.pod_templates.get(f"{buffer.namespace}/{buffer.pod_template}")
        if template is None:
            unresolved.append(f"CapacityBuffer {key}: PodTemplate {buffer.pod_template} not found")
            continue
        try:
            for index in range(1, buffer.replicas + 1):
                pods.append(
                    parse_pod(
                        _virtual_pod(buffer.namespace, buffer.name, buffer.uid, index, template.template)
                    )
                )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            unresolved.append(f"CapacityBuffer {key}: PodTemplate {buffer.pod_template}: {err}")
    return pods, unresolved


def ready_buffers(snapshot: Snapshot) -> dict[str, int]:
    """The ready buffers and their replicas (namespace/name -> replicas): what an emptiness decision
    accounted for, which the taint checks again (activities/buffer_guard.py)."""
    return {key: b.replicas for key, b in sorted(snapshot.capacity_buffers.items()) if b.ready}


def is_buffer_pod(pod: Pod) -> bool:
    return pod.annotations.get(FAKE_POD_ANNOTATION) == "true"


def _virtual_pod(
    namespace: str, name: str, uid: str, index: int, template: Mapping[str, Any]
) -> dict[str, Any]:
    """Karpenter's BuildVirtualPods for one pod, as a Pod object the snapshot parser reads."""
    meta = template.get("metadata") or {}
    spec = dict(template.get("spec") or {})
    spec.pop("nodeName", None)
    dropped = {
        v.get("name")
        for v in spec.get("volumes") or ()
        if isinstance(v, Mapping)
        and (v.get("persistentVolumeClaim") is not None or v.get("ephemeral") is not None)
    }
    if dropped:
        spec["volumes"] = [v for v in spec.get("volumes") or () if v.get("name") not in dropped]
    spec["priority"] = VIRTUAL_POD_PRIORITY
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"capacity-buffer-{name}-{index}",
            "namespace": namespace,
            "uid": f"{uid}-{index}",
            "labels": dict(meta.get("labels") or {}),
            "annotations": {
                FAKE_POD_ANNOTATION: "true",
                BUFFER_NAME_ANNOTATION: name,
                BUFFER_NAMESPACE_ANNOTATION: namespace,
            },
        },
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
