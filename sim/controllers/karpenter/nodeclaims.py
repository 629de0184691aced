"""The simulated Karpenter's NodeClaim lifecycle (kubernetes-sigs/karpenter
pkg/controllers/nodeclaim/lifecycle: launch, registration, initialization, liveness, and the
finalizer), as Karpenter's code does it, paraphrased:

- **launch**: the `karpenter.sh/termination` finalizer goes on first, so no instance can leak; then
  the cloud provider creates the instance (launch.py). No capacity in any offering: the NodeClaim is
  deleted (reason insufficient capacity) and the offerings are remembered as unavailable for 3 min.
  A class that cannot be found: deleted too (NodeClassNotReady). Then the NodeClaim gets the
  instance's labels (its own labels win), providerID, image, capacity, allocatable, `Launched=True`.
- **registration**: once a Node has the NodeClaim's providerID, Karpenter syncs onto it the
  finalizer, an owner reference to the NodeClaim, the NodeClaim's taints and startup taints (unless
  the node is labelled `karpenter.sh/do-not-sync-taints=true`), annotations and labels; it removes
  `karpenter.sh/unregistered:NoExecute` and labels the node `karpenter.sh/registered=true`; then
  `Registered=True` and `status.nodeName`. Two Nodes with the providerID: `Registered=False`. The
  tagging controller then tags the instance `Name=<node>` and `karpenter.sh/nodeclaim=<claim>`.
- **initialization**: the Node Ready, no startup taint and no known ephemeral taint left: the node
  is labelled `karpenter.sh/initialized=true` and the NodeClaim `Initialized=True`.
- **liveness**: not launched 5 min after creation, or not registered 15 min after launch: deleted.
- **finalizer** (a deleted NodeClaim): stamp `karpenter.sh/nodeclaim-termination-timestamp` =
  deletion + `terminationGracePeriod` unless an annotation is already there (never overwritten);
  if registered, delete its Nodes and wait until they are gone (the node termination controller
  drains them, termination.py); then terminate the instance, `InstanceTerminating=True`, until EC2
  says it is gone; then remove the finalizer.

Conditions are set as Karpenter's operatorpkg sets them (conditions.py): Ready follows Launched,
Registered and Initialized. Delays are Karpenter's, scaled by the simulator's TimeScale.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from api import constants as k
from api.duration import parse_duration
from sim.apiserver.errors import NotFound
from sim.controllers.karpenter.conditions import initialize, set_condition
from sim.controllers.karpenter.launch import (
    choices,
    image_for,
    instance_labels,
    launch_tags,
    run_instances_params,
)
from sim.controllers.karpenter.userdata import ami_family, user_data
from sim.controllers.predicates import node_ready

if TYPE_CHECKING:
    from sim.controllers.karpenter.neighbour import KarpenterNeighbour

log = logging.getLogger(__name__)

Obj = dict[str, Any]
NODECLAIMS = "nodeclaims"
MAX_INSTANCE_TYPES = 60  # what one CreateFleet request carries
EPHEMERAL_TAINTS = (
    k.NOT_READY_TAINT_KEY,
    k.UNREACHABLE_TAINT_KEY,
    "node.cloudprovider.kubernetes.io/uninitialized",
    k.UNREGISTERED_TAINT_KEY,
)
GONE = ("shutting-down", "terminated")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def condition(claim: Obj, kind: str) -> Obj | None:
    for cond in (claim.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return cond
    return None


def is_true(claim: Obj, kind: str) -> bool:
    return (condition(claim, kind) or {}).get("status") == "True"


def provider_id_of(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("providerID") or (obj.get("spec") or {}).get("providerID") or "")


def instance_id_of(provider_id: str) -> str | None:
    tail = provider_id.rsplit("/", 1)[-1] if provider_id.startswith("aws://") else ""
    return tail if tail.startswith("i-") else None


def merge_taints(current: list[Obj], extra: list[Obj]) -> list[Obj]:
    """Karpenter's `Taints.Merge`: add each taint whose key and effect the node does not carry yet."""
    merged = list(current)
    for taint in extra:
        if not any(
            t.get("key") == taint.get("key") and t.get("effect") == taint.get("effect") for t in merged
        ):
            merged.append(dict(taint))
    return merged


class NodeClaimLifecycle:
    def __init__(self, neighbour: KarpenterNeighbour) -> None:
        self.n = neighbour
        self._launching: dict[str, asyncio.Task[None]] = {}
        self._launched: dict[str, Obj] = {}  # uid -> what the launch produced (Karpenter's launch cache)
        self._unavailable: dict[str, float] = {}  # offering key -> until (monotonic)

    # -- writes -------------------------------------------------------------------------------------

    def update_status(self, claim: Obj, edit: Callable[[Obj], bool]) -> None:
        """Edit the NodeClaim's status (through its status subresource) when `edit` changes it."""
        if edit(copy.deepcopy(claim.get("status") or {})):
            self._write(claim, lambda obj: edit(obj.setdefault("status", {})), "status")

    def _meta(self, claim: Obj, edit: Callable[[Obj], bool]) -> None:
        """Edit the NodeClaim's metadata when `edit` changes it."""
        if edit(copy.deepcopy(claim)):
            self._write(claim, edit, None)

    def _write(self, claim: Obj, edit: Callable[[Obj], bool], subresource: str | None) -> None:
        def fn(obj: Obj) -> None:
            edit(obj)

        with contextlib.suppress(NotFound):
            self.n.store.mutate(NODECLAIMS, claim["metadata"]["name"], fn, subresource=subresource)

    def delete(self, claim: Obj, why: str) -> None:
        log.info("karpenter: deleting NodeClaim %s: %s", claim["metadata"]["name"], why)
        self.n.record_action(f"deleted NodeClaim {claim['metadata']['name']}: {why}")
        with contextlib.suppress(NotFound):
            self.n.store.delete(
                NODECLAIMS, claim["metadata"]["name"], preconditions={"uid": claim["metadata"]["uid"]}
            )

    # -- the reconcile ------------------------------------------------------------------------------

    def reconcile(self, claim: Obj) -> None:
        if claim["metadata"].get("deletionTimestamp"):
            return  # finalize() runs for those
        if not self._managed(claim):
            return
        if k.TERMINATION_FINALIZER not in (claim["metadata"].get("finalizers") or ()):
            self._meta(claim, _add_finalizer)
            return
        self.update_status(claim, initialize)  # Launched, Registered, Initialized, Ready: Unknown
        if not is_true(claim, "Launched"):
            if not self._liveness(claim):
                self._start_launch(claim)
            return
        if not is_true(claim, "Registered"):
            if self._liveness(claim):
                return
            self._register(claim)
            return
        if not is_true(claim, "Initialized"):
            self._initialize(claim)

    @staticmethod
    def _managed(claim: Obj) -> bool:
        ref = (claim.get("spec") or {}).get("nodeClassRef") or {}
        return ref.get("group") == k.AWS_GROUP and ref.get("kind") == k.EC2NODECLASS_KIND

    def _liveness(self, claim: Obj) -> bool:
        """Delete a NodeClaim stuck in launch or registration; True when it did."""
        scale = self.n.scale
        now = datetime.now(UTC)
        created = parse_time(claim["metadata"].get("creationTimestamp")) or now
        if not is_true(claim, "Launched"):
            if now - created > timedelta(seconds=scale.seconds(self.n.timings.launch_ttl)):
                self.delete(claim, "launch_timeout")
                return True
            return False
        launched = parse_time((condition(claim, "Launched") or {}).get("lastTransitionTime")) or created
        if not is_true(claim, "Registered") and now - launched > timedelta(
            seconds=scale.seconds(self.n.timings.registration_ttl)
        ):
            self.delete(claim, "registration_timeout")
            return True
        return False

    # -- launch -------------------------------------------------------------------------------------

    def _start_launch(self, claim: Obj) -> None:
        uid = claim["metadata"]["uid"]
        if uid in self._launched:
            self._record_launch(claim, self._launched[uid])
            return
        task = self._launching.get(uid)
        if task is not None and not task.done():
            return
        self._launching[uid] = asyncio.create_task(self._launch(claim), name=f"karpenter-launch-{uid}")

    async def _launch(self, claim: Obj) -> None:
        name, uid = claim["metadata"]["name"], claim["metadata"]["uid"]
        spec = claim.get("spec") or {}
        ref = spec.get("nodeClassRef") or {}
        nodeclass = self.n.informer.get("ec2nodeclasses", str(ref.get("name", "")))
        if nodeclass is None:
            self.delete(claim, f"nodeclass_not_ready: EC2NodeClass {ref.get('name')} not found")
            return
        now = time.monotonic()
        self._unavailable = {key: until for key, until in self._unavailable.items() if until > now}
        options = choices(
            spec.get("requirements") or [], nodeclass, self.n.catalog, self.n.region, set(self._unavailable)
        )[:MAX_INSTANCE_TYPES]
        labels = claim["metadata"].get("labels") or {}
        nodepool = labels.get(k.NODEPOOL_LABEL, "")
        tags = launch_tags(self.n.cluster_name, nodepool, nodeclass)
        registered = [*(spec.get("taints") or []), *(spec.get("startupTaints") or [])]
        tried = []
        for choice in options:
            image = image_for(nodeclass, choice.itype)
            if image is None:
                continue
            data = user_data(
                ami_family(nodeclass),
                self.n.bootstrap,
                labels,
                registered,
                choice.itype.pods,
                (nodeclass.get("spec") or {}).get("userData"),
            )
            params = run_instances_params(choice, image, nodeclass, tags, data)
            try:
                response = await asyncio.to_thread(self.n.ec2.run_instances, **params)
            except Exception as err:
                code = getattr(err, "response", {}).get("Error", {}).get("Code", "")
                if code == "InsufficientInstanceCapacity":
                    self._unavailable[choice.key] = time.monotonic() + self.n.scale.seconds(
                        self.n.timings.unavailable_offering_ttl
                    )
                    tried.append(choice.key)
                    continue
                log.warning("karpenter: launching NodeClaim %s failed: %s", name, err)
                message = str(err)[:300]
                self.update_status(
                    claim, lambda s, m=message: set_condition(s, "Launched", "Unknown", "LaunchFailed", m)
                )
                return
            instance = response["Instances"][0]
            zone = instance["Placement"]["AvailabilityZone"]
            created = {
                "labels": instance_labels(choice, self.n.region),
                "annotations": _nodeclass_hash(nodeclass),
                "providerID": k.aws_provider_id(zone, instance["InstanceId"]),
                "imageID": image,
                "capacity": choice.itype.capacity,
                "allocatable": choice.itype.allocatable,
            }
            self._launched[uid] = created
            log.info("karpenter: launched NodeClaim %s as %s (%s)", name, instance["InstanceId"], choice.key)
            current = self.n.store_get(NODECLAIMS, name)
            if current is not None and current["metadata"]["uid"] == uid:
                self._record_launch(current, created)
            return
        why = f"no capacity in {', '.join(tried)}" if tried else "no offering meets its requirements"
        self.delete(claim, f"insufficient_capacity: {why}")

    def _record_launch(self, claim: Obj, created: Obj) -> None:
        """PopulateNodeClaimDetails: the cloud's labels under the NodeClaim's own, its annotations, the
        instance's identity and resources; then Launched=True."""

        def meta(obj: Obj) -> bool:
            m = obj["metadata"]
            labels = {**created["labels"], **(m.get("labels") or {})}
            annotations = {**(m.get("annotations") or {}), **created["annotations"]}
            changed = labels != (m.get("labels") or {}) or annotations != (m.get("annotations") or {})
            m["labels"], m["annotations"] = labels, annotations
            return changed

        def status(s: Obj) -> bool:
            before = dict(s)
            s.update(
                providerID=created["providerID"],
                imageID=created["imageID"],
                capacity=created["capacity"],
                allocatable=created["allocatable"],
            )
            changed = before != s
            return set_condition(s, "Launched", "True", "Launched") or changed

        self._meta(claim, meta)
        self.update_status(self.n.store_get(NODECLAIMS, claim["metadata"]["name"]) or claim, status)

    # -- registration and initialization ------------------------------------------------------------

    def nodes_for(self, provider_id: str) -> list[Obj]:
        return [n for n in self.n.informer.items("nodes") if provider_id and provider_id_of(n) == provider_id]

    def _register(self, claim: Obj) -> None:
        nodes = self.nodes_for(provider_id_of(claim))
        if not nodes:
            self.update_status(
                claim,
                lambda s: set_condition(
                    s, "Registered", "Unknown", "NodeNotFound", "Node not registered with cluster"
                ),
            )
            return
        if len(nodes) > 1:
            self.update_status(
                claim,
                lambda s: set_condition(
                    s,
                    "Registered",
                    "False",
                    "MultipleNodesFound",
                    "Invariant violated, matched multiple nodes",
                ),
            )
            return
        node = nodes[0]
        meta = claim["metadata"]
        spec = claim.get("spec") or {}

        def sync(obj: Obj) -> None:
            m = obj["metadata"]
            finalizers = list(m.get("finalizers") or [])
            if k.TERMINATION_FINALIZER not in finalizers:
                finalizers.append(k.TERMINATION_FINALIZER)
            m["finalizers"] = finalizers
            refs = [r for r in m.get("ownerReferences") or () if r.get("uid") != meta["uid"]]
            refs.append(
                {
                    "apiVersion": f"{k.KARPENTER_GROUP}/{k.KARPENTER_VERSION}",
                    "kind": "NodeClaim",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "blockOwnerDeletion": True,
                }
            )
            m["ownerReferences"] = refs
            labels = m.get("labels") or {}
            node_spec = obj.setdefault("spec", {})
            taints = list(node_spec.get("taints") or [])
            if labels.get(k.DO_NOT_SYNC_TAINTS_LABEL) != "true":
                taints = merge_taints(
                    taints, [*(spec.get("taints") or []), *(spec.get("startupTaints") or [])]
                )
            node_spec["taints"] = [t for t in taints if t.get("key") != k.UNREGISTERED_TAINT_KEY]
            m["annotations"] = {**(m.get("annotations") or {}), **(meta.get("annotations") or {})}
            m["labels"] = {**labels, **(meta.get("labels") or {}), k.REGISTERED_LABEL: "true"}

        try:
            self.n.store.mutate("nodes", node["metadata"]["name"], sync)
        except NotFound:
            return
        node_name = node["metadata"]["name"]

        def registered(s: Obj) -> bool:
            changed = s.get("nodeName") != node_name
            s["nodeName"] = node_name
            return set_condition(s, "Registered", "True", "Registered") or changed

        self.update_status(claim, registered)
        self.n.tag_instance(
            provider_id_of(claim), {k.TAG_NODE_NAME: node_name, k.TAG_NODECLAIM: meta["name"]}
        )

    def _initialize(self, claim: Obj) -> None:
        nodes = self.nodes_for(provider_id_of(claim))
        if len(nodes) != 1:
            self.update_status(
                claim,
                lambda s: set_condition(
                    s, "Initialized", "Unknown", "NodeNotFound", "Node not registered with cluster"
                ),
            )
            return
        node = nodes[0]
        taints = (node.get("spec") or {}).get("taints") or []
        startup = (claim.get("spec") or {}).get("startupTaints") or []
        waiting = None
        if not node_ready(node):
            waiting = ("NodeNotReady", "Node status is NotReady")
        elif any(
            t.get("key") == s.get("key") and t.get("effect") == s.get("effect")
            for t in taints
            for s in startup
        ):
            waiting = ("StartupTaintsExist", "a startup taint still exists")
        elif any(t.get("key") in EPHEMERAL_TAINTS for t in taints):
            waiting = ("KnownEphemeralTaintsExist", "a known ephemeral taint still exists")
        if waiting is not None:
            self.update_status(claim, lambda s: set_condition(s, "Initialized", "Unknown", *waiting))
            return

        def label(obj: Obj) -> None:
            obj["metadata"]["labels"] = {**(obj["metadata"].get("labels") or {}), k.INITIALIZED_LABEL: "true"}

        try:
            self.n.store.mutate("nodes", node["metadata"]["name"], label)
        except NotFound:
            return
        self.update_status(claim, lambda s: set_condition(s, "Initialized", "True", "Initialized"))

    # -- the finalizer ------------------------------------------------------------------------------

    async def finalize(self, claim: Obj) -> None:
        meta = claim["metadata"]
        if k.TERMINATION_FINALIZER not in (meta.get("finalizers") or ()):
            return
        self._stamp_deadline(claim)
        provider_id = provider_id_of(claim)
        if is_true(claim, "Registered"):
            nodes = self.nodes_for(provider_id)
            for node in nodes:
                if not node["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(NotFound):
                        self.n.store.delete("nodes", node["metadata"]["name"])
            if nodes:
                return  # the node termination controller drains them; the NodeClaim waits
        instance_id = instance_id_of(provider_id)
        if instance_id is not None:
            gone = await asyncio.to_thread(self.n.terminate_instance, instance_id)
            self.update_status(
                claim, lambda s: set_condition(s, "InstanceTerminating", "True", "InstanceTerminating")
            )
            if not gone:
                return
        self._meta(claim, _drop_finalizer)
        log.info("karpenter: NodeClaim %s finalized", meta["name"])

    def _stamp_deadline(self, claim: Obj) -> None:
        meta = claim["metadata"]
        grace = (claim.get("spec") or {}).get("terminationGracePeriod")
        if not grace or k.TERMINATION_TIMESTAMP_ANNOTATION in (meta.get("annotations") or {}):
            return
        deleted = parse_time(meta.get("deletionTimestamp")) or datetime.now(UTC)
        try:
            deadline = deleted + parse_duration(grace)
        except ValueError:
            return
        stamp = deadline.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def annotate(obj: Obj) -> bool:
            annotations = obj["metadata"].setdefault("annotations", {})
            if k.TERMINATION_TIMESTAMP_ANNOTATION in annotations:
                return False
            annotations[k.TERMINATION_TIMESTAMP_ANNOTATION] = stamp
            return True

        self._meta(claim, annotate)


def _add_finalizer(obj: Obj) -> bool:
    finalizers = list(obj["metadata"].get("finalizers") or [])
    if k.TERMINATION_FINALIZER in finalizers:
        return False
    obj["metadata"]["finalizers"] = [*finalizers, k.TERMINATION_FINALIZER]
    return True


def _drop_finalizer(obj: Obj) -> bool:
    finalizers = list(obj["metadata"].get("finalizers") or [])
    if k.TERMINATION_FINALIZER not in finalizers:
        return False
    obj["metadata"]["finalizers"] = [f for f in finalizers if f != k.TERMINATION_FINALIZER]
    return True


def _nodeclass_hash(nodeclass: Obj) -> dict[str, str]:
    """The class's drift hash, as the AWS provider's Create returns it for the NodeClaim (the hash
    controller keeps the same value on the EC2NodeClass)."""
    annotations = (nodeclass.get("metadata") or {}).get("annotations") or {}
    keys = (k.NODECLASS_HASH_ANNOTATION, k.NODECLASS_HASH_VERSION_ANNOTATION)
    return {key: annotations[key] for key in keys if key in annotations}
