"""ReplicaSet and Deployment controllers, kept to what a disruption simulator needs.

ReplicaSet: keeps `spec.replicas` active pods (not terminating, not finished). An evicted or deleted
pod stops counting the moment it gets a deletionTimestamp, so its replacement is created while it
still terminates, as on a real cluster. Replacements are Pending pods built from the template with
`generateName: <rs>-` and a controller ownerReference; the scheduler places them. Scale-down deletes
unscheduled, then pending, then not-ready pods first, then the lowest pod-deletion-cost, newest first.
Orphan pods are not adopted.

Deployment: owns one ReplicaSet per template, named `<deployment>-<pod-template-hash>` and labelled
with the hash as kube does. When the template changes the new ReplicaSet gets every replica at once
and the old ones go to zero (no surge / unavailability arithmetic: a rolling update is not what
karpflow is tested on). Status (replicas, updated/ready/available/unavailable, the Available
condition) follows the ReplicaSets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson

from api.constants import POD_DELETION_COST_ANNOTATION
from sim.apiserver.errors import AlreadyExists, ApiError, NotFound
from sim.apiserver.store import Store
from sim.controllers.informer import Informer, Key, key_of
from sim.controllers.node_objects import now_rfc3339
from sim.controllers.predicates import pod_is_terminal

log = logging.getLogger(__name__)

TEMPLATE_HASH_LABEL = "pod-template-hash"
_SAFE_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # kube's rand.SafeEncodeString alphabet
YIELD_EVERY = 200
RETRY_SECONDS = 1.0


def controller_uid(obj: dict[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return ref.get("uid")
    return None


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner.get("apiVersion", "apps/v1"),
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def is_active(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and not pod_is_terminal(pod)


def is_ready(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pod_from_template(
    owner: dict[str, Any], template: dict[str, Any], **spec_overrides: Any
) -> dict[str, Any]:
    meta = template.get("metadata") or {}
    spec = orjson.loads(orjson.dumps(template.get("spec") or {}))
    spec.update(spec_overrides)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{owner['metadata']['name']}-",
            "namespace": owner["metadata"].get("namespace", "default"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": spec,
    }


def template_hash(template: dict[str, Any]) -> str:
    """A stable short hash of a pod template, spelled like kube's pod-template-hash."""
    data = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    h = 0x811C9DC5
    for byte in data:  # FNV-1a, 32 bit, as the deployment controller uses
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE_CHARS[b % len(_SAFE_CHARS)] for b in str(h).encode())


class _OwnedPods:
    """Pods by controlling owner uid, from informer events."""

    def __init__(self) -> None:
        self.by_owner: dict[str, set[Key]] = {}
        self._owner_of: dict[Key, str] = {}

    def update(self, new: dict[str, Any] | None, old: dict[str, Any] | None) -> str | None:
        obj = new or old
        assert obj is not None
        key = key_of(obj)
        before = self._owner_of.pop(key, None)
        if before is not None:
            keys = self.by_owner.get(before)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_owner[before]
        owner = controller_uid(new) if new is not None else None
        if owner is not None:
            self._owner_of[key] = owner
            self.by_owner.setdefault(owner, set()).add(key)
        return owner or before


class _Controller:
    """Shared plumbing: dirty keys, a wake event, a run loop that reconciles them."""

    name = "controller"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.store = store
        self.informer = informer
        self.dirty: set[Key] = set()
        self.wake = asyncio.Event()
        informer.add_handler(self._on_event)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        raise NotImplementedError

    def mark(self, key: Key) -> None:
        self.dirty.add(key)
        self.wake.set()

    @staticmethod
    def _track(by_uid: dict[str, Key], new: dict[str, Any] | None, old: dict[str, Any] | None) -> Key:
        """Keep `by_uid` (the controller's own objects by uid) up to date with one event on one of
        them (forgotten once deleted, `new` None); the object's key."""
        obj = new or old
        assert obj is not None
        key = key_of(obj)
        if new is None:
            by_uid.pop(obj["metadata"]["uid"], None)
        else:
            by_uid[obj["metadata"]["uid"]] = key
        return key

    async def reconcile(self, key: Key) -> None:
        raise NotImplementedError

    async def reconcile_dirty(self) -> None:
        self.informer.sync()
        while self.dirty:
            key = self.dirty.pop()
            try:
                await self.reconcile(key)
            except ApiError as err:
                # E.g. a template the API refuses: retry later, without holding up other objects.
                log.warning("%s %s/%s: %s; retrying in %.0f s", self.name, key[0], key[1], err, RETRY_SECONDS)
                asyncio.get_running_loop().call_later(RETRY_SECONDS, self.mark, key)
            self.informer.sync()

    async def run(self) -> None:
        self.informer.sync()
        while True:
            await self.wake.wait()
            self.wake.clear()
            try:
                await self.reconcile_dirty()
            except Exception:
                log.exception("%s reconcile failed", self.name)
                await asyncio.sleep(0.1)


def _delete_priority(pod: dict[str, Any]) -> tuple[Any, ...]:
    """Sort key: pods to delete first come first (kube's ActivePods ordering, simplified)."""
    status = pod.get("status") or {}
    annotations = pod["metadata"].get("annotations") or {}
    try:
        cost = int(annotations.get(POD_DELETION_COST_ANNOTATION, 0))
    except ValueError:
        cost = 0
    return (
        bool((pod.get("spec") or {}).get("nodeName")),
        status.get("phase") == "Running",
        is_ready(pod),
        cost,
        "".join(chr(0x10FFFF - ord(c)) for c in pod["metadata"].get("creationTimestamp", "")),  # newest first
    )


class ReplicaSetController(_Controller):
    name = "replicasets"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.owned = _OwnedPods()
        self.rs_by_uid: dict[str, Key] = {}
        self.created = 0
        super().__init__(store, informer)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "replicasets":
            key = self._track(self.rs_by_uid, new, old)
            if new is None:
                return
            if (
                old is None
                or new.get("spec") != old.get("spec")
                or new["metadata"].get("generation") != ((new.get("status") or {}).get("observedGeneration"))
            ):
                self.mark(key)
        elif plural == "pods":
            owner = self.owned.update(new, old)
            if owner is not None and owner in self.rs_by_uid:
                if new is not None and old is not None and _pod_summary(new) == _pod_summary(old):
                    return  # nothing the ReplicaSet counts has changed
                self.mark(self.rs_by_uid[owner])

    def _pods(self, rs: dict[str, Any]) -> list[dict[str, Any]]:
        ns = rs["metadata"]["namespace"]
        out = []
        for key in self.owned.by_owner.get(rs["metadata"]["uid"], ()):
            pod = self.informer.get("pods", key[1], ns)
            if pod is not None:
                out.append(pod)
        return out

    async def reconcile(self, key: Key) -> None:
        rs = self.informer.get("replicasets", key[1], key[0])
        if rs is None or rs["metadata"].get("deletionTimestamp"):
            return
        pods = self._pods(rs)
        active = [p for p in pods if is_active(p)]
        want = int((rs.get("spec") or {}).get("replicas", 1))
        diff = want - len(active)
        template = (rs.get("spec") or {}).get("template") or {}
        if diff > 0:
            for i in range(diff):
                self.store.create("pods", pod_from_template(rs, template))
                self.created += 1
                if (i + 1) % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        elif diff < 0:
            for pod in sorted(active, key=_delete_priority)[:-diff]:
                with contextlib.suppress(NotFound):
                    self.store.delete("pods", pod["metadata"]["name"], key[0])
        self.informer.sync()
        self._write_status(key, rs)

    def _write_status(self, key: Key, rs: dict[str, Any]) -> None:
        pods = [p for p in self._pods(rs) if is_active(p)]
        selector_labels = (((rs.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
            "labels"
        ) or {}
        ready = sum(1 for p in pods if is_ready(p))
        status = {
            "replicas": len(pods),
            "fullyLabeledReplicas": sum(
                1
                for p in pods
                if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector_labels.items())
            ),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": rs["metadata"].get("generation", 1),
        }
        _write_status_if_changed(self.store, "replicasets", key, status)


def _pod_summary(pod: dict[str, Any]) -> tuple[Any, ...]:
    return (
        is_active(pod),
        is_ready(pod),
        (pod.get("spec") or {}).get("nodeName"),
        (pod.get("status") or {}).get("phase"),
    )


def _write_status_if_changed(store: Store, plural: str, key: Key, status: dict[str, Any]) -> None:
    def apply(obj: dict[str, Any]) -> dict[str, Any]:
        current = dict(obj.get("status") or {})
        merged = {**current, **status}
        if merged != current:
            obj["status"] = merged
        return obj

    with contextlib.suppress(NotFound):
        store.mutate(plural, key[1], apply, key[0], subresource="status")


class DeploymentController(_Controller):
    name = "deployments"

    def __init__(self, store: Store, informer: Informer) -> None:
        self.deploy_by_uid: dict[str, Key] = {}
        super().__init__(store, informer)

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural == "deployments":
            key = self._track(self.deploy_by_uid, new, old)
            if new is None:
                return
            if old is None or new.get("spec") != old.get("spec"):
                self.mark(key)
        elif plural == "replicasets":
            obj = new or old
            assert obj is not None
            owner = controller_uid(obj)
            if owner is not None and owner in self.deploy_by_uid:
                if (
                    new is not None
                    and old is not None
                    and new.get("status") == old.get("status")
                    and (new.get("spec") == old.get("spec"))
                ):
                    return
                self.mark(self.deploy_by_uid[owner])

    async def reconcile(self, key: Key) -> None:
        deploy = self.informer.get("deployments", key[1], key[0])
        if deploy is None or deploy["metadata"].get("deletionTimestamp"):
            return
        spec = deploy.get("spec") or {}
        want = int(spec.get("replicas", 1))
        template = orjson.loads(orjson.dumps(spec.get("template") or {}))
        hashed = template_hash(template)
        uid = deploy["metadata"]["uid"]
        owned = [rs for rs in self.informer.items("replicasets") if controller_uid(rs) == uid]
        current = next(
            (rs for rs in owned if (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL) == hashed),
            None,
        )
        if current is None:
            current = self._create_replicaset(deploy, template, hashed, want)
        elif int((current.get("spec") or {}).get("replicas", 0)) != want:
            self._scale(current, want)
        for rs in owned:
            if rs is not current and int((rs.get("spec") or {}).get("replicas", 0)) != 0:
                self._scale(rs, 0)
        self.informer.sync()
        self._write_status(key, deploy, hashed)

    def _create_replicaset(
        self, deploy: dict[str, Any], template: dict[str, Any], hashed: str, replicas: int
    ):
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels[TEMPLATE_HASH_LABEL] = hashed
        template.setdefault("metadata", {})["labels"] = labels
        selector = orjson.loads(orjson.dumps((deploy.get("spec") or {}).get("selector") or {}))
        selector.setdefault("matchLabels", {})[TEMPLATE_HASH_LABEL] = hashed
        rs = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{deploy['metadata']['name']}-{hashed}",
                "namespace": deploy["metadata"]["namespace"],
                "labels": labels,
                "ownerReferences": [owner_reference({**deploy, "kind": "Deployment"})],
            },
            "spec": {"replicas": replicas, "selector": selector, "template": template},
        }
        try:
            return self.store.create("replicasets", rs)
        except AlreadyExists:
            return self.store.get("replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"])

    def _scale(self, rs: dict[str, Any], replicas: int) -> None:
        with contextlib.suppress(NotFound):
            self.store.patch(
                "replicasets",
                rs["metadata"]["name"],
                {"spec": {"replicas": replicas}},
                rs["metadata"]["namespace"],
            )

    def _write_status(self, key: Key, deploy: dict[str, Any], hashed: str) -> None:
        uid = deploy["metadata"]["uid"]
        owned = [rs for rs in self.informer.items("replicasets") if controller_uid(rs) == uid]
        want = int((deploy.get("spec") or {}).get("replicas", 1))

        def total(field: str, sets: list[dict[str, Any]]) -> int:
            return sum(int((rs.get("status") or {}).get(field, 0) or 0) for rs in sets)

        current = [
            rs for rs in owned if (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL) == hashed
        ]
        available = total("availableReplicas", owned)
        at = now_rfc3339()
        ok = available >= want
        previous = {c.get("type"): c for c in (deploy.get("status") or {}).get("conditions") or ()}

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
            old = previous.get(kind)
            since = old.get("lastTransitionTime", at) if old and old.get("status") == status else at
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastUpdateTime": old.get("lastUpdateTime", at)
                if old and old.get("reason") == reason
                else at,
                "lastTransitionTime": since,
            }

        status = {
            "observedGeneration": deploy["metadata"].get("generation", 1),
            "replicas": total("replicas", owned),
            "updatedReplicas": total("replicas", current),
            "readyReplicas": total("readyReplicas", owned),
            "availableReplicas": available,
            "unavailableReplicas": max(0, want - available),
            "conditions": [
                condition(
                    "Available",
                    "True" if ok else "False",
                    "MinimumReplicasAvailable" if ok else "MinimumReplicasUnavailable",
                    "Deployment has minimum availability."
                    if ok
                    else "Deployment does not have minimum availability.",
                ),
                condition(
                    "Progressing",
                    "True",
                    "NewReplicaSetAvailable" if ok else "ReplicaSetUpdated",
                    f'ReplicaSet "{deploy["metadata"]["name"]}-{hashed}" '
                    + ("has successfully progressed." if ok else "is progressing."),
                ),
            ],
        }
        _write_status_if_changed(self.store, "deployments", key, status)
