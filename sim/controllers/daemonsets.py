"""DaemonSet controller: one pod per node that should run it, placed by the scheduler as in kube.

Kubernetes' `NodeShouldRunDaemonPod` (kubernetes/kubernetes pkg/controller/daemon/daemon_controller.go)
looks at the node's name, the template's nodeSelector and required node affinity, and the node's
taints, nothing else: a node should run a DaemonSet's pod when they match and every
NoSchedule/NoExecute taint is tolerated; a pod already there may stay while only NoExecute taints
are tolerated (a new `karpenter.sh/disrupted:NoSchedule` taint does not remove it, it only stops a
new one from being created). A node being deleted (a finalizer holds it) is no different: its daemon
pods stay until a drain evicts them, the taint manager (taint_eviction.py) or the pod GC
(podgc.py, once the Node is gone) ends them. The pod pins itself to its node with a required
`matchFields metadata.name` term (what the real controller does) and gets the tolerations every
DaemonSet pod gets automatically (`AUTO_TOLERATIONS`, pkg/controller/daemon/util/daemonset_util.go);
the template decides anything else, e.g. the disrupted taint. Pods that finished and extra pods on
one node are deleted; of the pods whose node does not exist, only those never bound to it
(`getUnscheduledPodsWithoutNode`: a bound one is the pod GC's); status counts follow.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import orjson

from sim.apiserver.errors import NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer, Key
from sim.controllers.predicates import node_selection_matches, untolerated_taints
from sim.controllers.workloads import (
    _Controller,
    _OwnedPods,
    _write_status_if_changed,
    is_ready,
    pod_from_template,
)

log = logging.getLogger(__name__)

# The tolerations the DaemonSet controller adds to every daemon pod (network-unavailable only with
# hostNetwork), so that node problems and cordons do not evict or block node agents.
AUTO_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}


def daemon_tolerations(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    tolerations = [dict(t) for t in pod_spec.get("tolerations") or ()]
    extra = list(AUTO_TOLERATIONS)
    if pod_spec.get("hostNetwork"):
        extra.append(HOST_NETWORK_TOLERATION)
    for auto in extra:
        if not any(t.get("key") == auto["key"] and t.get("effect") == auto["effect"] for t in tolerations):
            tolerations.append(dict(auto))
    return tolerations


def pinned_affinity(pod_spec: dict[str, Any], node_name: str) -> dict[str, Any]:
    """The template's affinity with its required node terms replaced by `metadata.name In [node]`."""
    affinity = orjson.loads(orjson.dumps(pod_spec.get("affinity") or {}))
    node_affinity = affinity.setdefault("nodeAffinity", {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }
    return affinity


def pinned_node(pod: dict[str, Any]) -> str | None:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or ():
        for expr in term.get("matchFields") or ():
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In" and expr.get("values"):
                return expr["values"][0]
    return None


def should_run(
    template_spec: dict[str, Any], tolerations: list[dict[str, Any]], node: dict[str, Any]
) -> tuple[bool, bool]:
    """(should run a new pod there, may keep an existing one): `NodeShouldRunDaemonPod`, which never
    reads the node's deletionTimestamp."""
    wanted_name = template_spec.get("nodeName")
    if wanted_name and wanted_name != node["metadata"].get("name"):
        return False, False
    if not node_selection_matches(template_spec, node):
        return False, False
    taints = (node.get("spec") or {}).get("taints") or ()
    keep = not untolerated_taints(tolerations, taints, ("NoExecute",))
    run = keep and not untolerated_taints(tolerations, taints, ("NoSchedule",))
    return run, keep


def _node_shape(node: dict[str, Any]) -> tuple[Any, ...]:
    spec = node.get("spec") or {}
    return (node["metadata"].get("labels"), spec.get("taints"))


class DaemonSetController(_Controller):
    name = "daemonsets"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.owned = _OwnedPods()
        self.ds_by_uid: dict[str, Key] = {}
        self.created = 0
        super().__init__(store, informer)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "daemonsets":
            key = self._track(self.ds_by_uid, new, old)
            if new is None:
                return
            if old is None or new.get("spec") != old.get("spec"):
                self.mark(key)
        elif plural == "pods":
            owner = self.owned.update(new, old)
            if owner is not None and owner in self.ds_by_uid:
                self.mark(self.ds_by_uid[owner])
        elif plural == "nodes" and (new is None or old is None or _node_shape(new) != _node_shape(old)):
            for key in self.ds_by_uid.values():
                self.mark(key)

    async def reconcile(self, key: Key) -> None:
        ds = self.informer.get("daemonsets", key[1], key[0])
        if ds is None or ds["metadata"].get("deletionTimestamp"):
            return
        template = (ds.get("spec") or {}).get("template") or {}
        template_spec = template.get("spec") or {}
        tolerations = daemon_tolerations(template_spec)
        by_node: dict[str, list[dict[str, Any]]] = {}
        for pod_key in list(self.owned.by_owner.get(ds["metadata"]["uid"], ())):
            pod = self.informer.get("pods", pod_key[1], pod_key[0])
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                self._delete(pod)  # the controller replaces finished daemon pods
                continue
            by_node.setdefault(pinned_node(pod) or "", []).append(pod)

        desired = scheduled = misscheduled = ready = 0
        for node in list(self.informer.items("nodes")):
            name = node["metadata"]["name"]
            run, keep = should_run(template_spec, tolerations, node)
            pods = sorted(by_node.pop(name, []), key=lambda p: p["metadata"].get("creationTimestamp", ""))
            if run:
                desired += 1
            if pods and not keep:
                for pod in pods:
                    self._delete(pod)
                continue
            if not pods and run:
                spec_overrides = {
                    "affinity": pinned_affinity(template_spec, name),
                    "tolerations": tolerations,
                }
                self.store.create("pods", pod_from_template(ds, template, **spec_overrides))
                self.created += 1
                continue
            for extra in pods[1:]:
                self._delete(extra)
            if pods:
                if run:
                    scheduled += 1
                else:
                    misscheduled += 1
                if is_ready(pods[0]):
                    ready += 1
        for pods in by_node.values():  # pods for nodes that do not exist
            for pod in pods:
                if not (pod.get("spec") or {}).get("nodeName"):  # never bound: nobody else will
                    self._delete(pod)
        status = {
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": scheduled,
            "numberMisscheduled": misscheduled,
            "numberReady": ready,
            "numberAvailable": ready,
            "numberUnavailable": max(0, desired - ready),
            "updatedNumberScheduled": scheduled,
            "observedGeneration": ds["metadata"].get("generation", 1),
        }
        _write_status_if_changed(self.store, "daemonsets", key, status)

    def _delete(self, pod: dict[str, Any]) -> None:
        with contextlib.suppress(NotFound):
            self.store.delete("pods", pod["metadata"]["name"], pod["metadata"].get("namespace"))
