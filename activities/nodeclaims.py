"""Beside Karpenter (--karpenter-coexistence): replacements are NodeClaims, and Karpenter terminates
the nodes of NodeClaims. docs/running-beside-karpenter.md says why; in short, from Karpenter's code:

- its AWS provider lists the instances tagged `karpenter.sh/nodepool`, `karpenter.k8s.aws/ec2nodeclass`
  and `eks:eks-cluster-name=<cluster>`, and terminates every one older than 30 s that no NodeClaim
  names (deleting its Node without a drain). So karpflow launches nothing itself: it creates the
  replacement's NodeClaim, as Karpenter's provisioner would, and Karpenter launches, registers and
  initializes it; karpflow reads the progress off the NodeClaim's conditions.
- its node termination controller acts on every deleting Node that carries the termination finalizer
  and the `karpenter.k8s.aws/ec2nodeclass` label: it deletes the node's NodeClaim, drains, and ends the
  instance. Two drainers on one node would be one too many, so karpflow hands such a node over:
  it stamps its drain deadline on the NodeClaim (`karpenter.sh/nodeclaim-termination-timestamp`,
  which Karpenter's drain reads and never overwrites) and deletes the NodeClaim; Karpenter drains
  through the Eviction API (PDBs hold) and terminates the instance once.

Every activity is idempotent: a NodeClaim has a name derived from the command and the replacement
(api/workflow_ids.py), a retried create finds it, and deletions carry a UID precondition.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from temporalio import activity

from activities import budget_claims, errors
from activities.errors import classify_kube, not_found, permanent
from api.activity_io import (
    HandoverWait,
    NodeClaimDeletion,
    NodeClaimRequest,
    NodeClaimState,
    NodeClaimWait,
)
from api.constants import (
    AWS_GROUP,
    CAPACITY_RESERVATION_ID_LABEL,
    CAPACITY_TYPE_LABEL,
    EC2NODECLASS_KIND,
    INSTANCE_TYPE_LABEL,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODEPOOL_LABEL,
    TERMINATION_TIMESTAMP_ANNOTATION,
    ZONE_LABEL,
)
from api.workflow_io import Offering
from cluster.reads import ClusterReads
from kube import events
from kube.client import Json, KubeApi, KubeError
from kube.times import parse_time, rfc3339

log = logging.getLogger(__name__)

NODECLAIMS = f"/apis/{KARPENTER_GROUP}/{KARPENTER_VERSION}/nodeclaims"
NODEPOOLS = f"/apis/{KARPENTER_GROUP}/{KARPENTER_VERSION}/nodepools"
# Provenance on the NodeClaims karpflow creates (Karpenter copies NodeClaim annotations onto the Node
# at registration: these say which command the node replaced, and claim nothing).
REPLACEMENT_FOR_ANNOTATION = "karpflow.io/replacement-for"
REPLACEMENT_INDEX_ANNOTATION = "karpflow.io/replacement-index"
# The keys a replacement's offerings pin, in place of the NodePool's requirement on the same key.
PINNED_KEYS = (INSTANCE_TYPE_LABEL, ZONE_LABEL, CAPACITY_TYPE_LABEL, CAPACITY_RESERVATION_ID_LABEL)


def _path(name: str) -> str:
    return f"{NODECLAIMS}/{quote(name, safe='')}"


def _distinct(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _pinned(request: NodeClaimRequest) -> dict[str, list[str]]:
    """What the planner chose: instance types (cheapest first), zones, capacity types."""
    spec = request.spec
    if spec.offerings:
        return {
            INSTANCE_TYPE_LABEL: _distinct([o.instance_type for o in spec.offerings]),
            ZONE_LABEL: _distinct([o.zone for o in spec.offerings]),
            CAPACITY_TYPE_LABEL: _distinct([o.capacity_type for o in spec.offerings]),
            # A reserved replacement: the reservations the pass took for it, as Karpenter's scheduler
            # pins a NodeClaim to the reservations it reserved (nodeclaim.go, ReservationIDLabel).
            CAPACITY_RESERVATION_ID_LABEL: _distinct(
                [o.reservation_id for o in spec.offerings if o.reservation_id]
            ),
        }
    return {
        INSTANCE_TYPE_LABEL: list(spec.instance_types),
        ZONE_LABEL: list(spec.zones),
        CAPACITY_TYPE_LABEL: list(spec.capacity_type),
    }


def nodeclaim_body(request: NodeClaimRequest, pool: Json) -> Json:
    """The NodeClaim Karpenter's provisioner would create for this replacement: the NodePool template
    (labels, annotations with the drift hashes, taints, startupTaints, expireAfter,
    terminationGracePeriod, nodeClassRef) with the NodePool's requirements, those on instance type,
    zone and capacity type narrowed to what the planner chose, owned by the NodePool."""
    template = request.template
    pool_meta = pool.get("metadata") or {}
    pool_spec = ((pool.get("spec") or {}).get("template") or {}).get("spec") or {}
    pinned = {key: values for key, values in _pinned(request).items() if values}
    requirements = [
        dict(r)
        for r in pool_spec.get("requirements") or ()
        if r.get("key") not in pinned and r.get("key") != NODEPOOL_LABEL
    ]
    requirements.append({"key": NODEPOOL_LABEL, "operator": "In", "values": [template.nodepool]})
    requirements += [{"key": key, "operator": "In", "values": values} for key, values in pinned.items()]
    # The minValues the planner kept (lowered under MinValuesPolicy BestEffort), on the pinned keys
    # too, as Karpenter's NodeClaimTemplate.ToNodeClaim keeps them: Karpenter's launch checks its 60
    # cheapest options against them (cloudprovider.InstanceTypes.Truncate).
    for requirement in requirements:
        if requirement["key"] in request.spec.min_values:
            requirement["minValues"] = request.spec.min_values[requirement["key"]]
    spec: Json = {
        "nodeClassRef": {"group": AWS_GROUP, "kind": EC2NODECLASS_KIND, "name": template.nodeclass},
        "requirements": requirements,
    }
    if template.taints:
        spec["taints"] = [t.model_dump(exclude_none=True) for t in template.taints]
    if template.startup_taints:
        spec["startupTaints"] = [t.model_dump(exclude_none=True) for t in template.startup_taints]
    for field in ("expireAfter", "terminationGracePeriod"):
        if pool_spec.get(field) is not None:
            spec[field] = pool_spec[field]
    metadata: Json = {
        "name": request.name,
        "labels": dict(template.labels),
        "annotations": {
            **template.annotations,
            REPLACEMENT_FOR_ANNOTATION: request.command_id,
            REPLACEMENT_INDEX_ANNOTATION: str(request.index),
        },
    }
    if pool_meta.get("uid"):
        metadata["ownerReferences"] = [
            {
                "apiVersion": f"{KARPENTER_GROUP}/{KARPENTER_VERSION}",
                "kind": "NodePool",
                "name": template.nodepool,
                "uid": pool_meta["uid"],
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": f"{KARPENTER_GROUP}/{KARPENTER_VERSION}",
        "kind": "NodeClaim",
        "metadata": metadata,
        "spec": spec,
    }


def conditions(claim: Json) -> dict[str, Json]:
    return {c.get("type", ""): c for c in (claim.get("status") or {}).get("conditions") or ()}


def nodeclaim_state(claim: Json) -> NodeClaimState:
    meta, status = claim.get("metadata") or {}, claim.get("status") or {}
    labels = meta.get("labels") or {}
    provider_id = status.get("providerID") or None
    offering = None
    if labels.get(INSTANCE_TYPE_LABEL) and labels.get(ZONE_LABEL) and labels.get(CAPACITY_TYPE_LABEL):
        offering = Offering(
            instance_type=labels[INSTANCE_TYPE_LABEL],
            zone=labels[ZONE_LABEL],
            capacity_type=labels[CAPACITY_TYPE_LABEL],
        )
    instance_id = provider_id.rsplit("/", 1)[-1] if provider_id else None
    return NodeClaimState(
        name=meta.get("name", ""),
        uid=meta.get("uid"),
        provider_id=provider_id,
        instance_id=instance_id if instance_id and instance_id.startswith("i-") else None,
        node=status.get("nodeName") or None,
        offering=offering,
        conditions={kind: c.get("status", "Unknown") for kind, c in conditions(claim).items()},
    )


def _progress(state: NodeClaimState, waiting_for: str) -> dict[str, str]:
    """A wait's heartbeat: what it waits for, and what Karpenter has done so far (the instance it
    launched, the node that registered), for whoever looks at the pending activity."""
    beat = {"nodeclaim": state.name, "waiting_for": waiting_for}
    if state.instance_id:
        beat["instance"] = state.instance_id
    if state.node:
        beat["node"] = state.node
    return beat


def _why_not(claim: Json, until: str) -> str:
    """What Karpenter says the NodeClaim still waits for (the condition's reason and message)."""
    condition = conditions(claim).get(until)
    if condition is None:
        return f"no {until} condition yet"
    text = " ".join(p for p in (condition.get("reason"), condition.get("message")) if p)
    return f"{until}={condition.get('status')}" + (f" ({text})" if text else "")


def _heartbeat(details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(details)


class KarpenterHandover:
    """The termination side: find a node's NodeClaim, stamp the drain deadline on it, delete it."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube

    async def nodeclaim_for(self, node: Json) -> Json | None:
        """The NodeClaim whose status.providerID is the node's (as Karpenter matches them)."""
        provider_id = (node.get("spec") or {}).get("providerID")
        if not provider_id:
            return None
        items = (await self.kube.request("GET", NODECLAIMS)).get("items") or ()
        found = [c for c in items if (c.get("status") or {}).get("providerID") == provider_id]
        return found[0] if len(found) == 1 else None  # several: no single source of truth (Karpenter too)

    async def hand_over(self, claim: Json, deadline: datetime | None) -> None:
        """Stamp `deadline` on the NodeClaim (or move its deadline earlier, never later), then delete it
        with a UID precondition (already deleting: nothing to delete)."""
        name, uid = claim["metadata"]["name"], claim["metadata"].get("uid")
        if deadline is not None:
            await self._bring_deadline_forward(name, uid, deadline)
        if claim["metadata"].get("deletionTimestamp"):
            return
        body: Json = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.kube.request("DELETE", _path(name), body=body)
        except KubeError as err:
            if err.status not in (404, 409):  # gone, or another NodeClaim of the name: not ours to end
                raise

    async def _bring_deadline_forward(self, name: str, uid: str | None, deadline: datetime) -> None:
        wanted = deadline.astimezone(UTC).replace(microsecond=0)
        for attempt in range(8):
            try:
                claim = await self.kube.request("GET", _path(name))
            except KubeError as err:
                if err.status == 404:
                    return
                raise
            meta = claim["metadata"]
            if uid and meta.get("uid") != uid:
                return
            annotations = meta.setdefault("annotations", {}) or {}
            meta["annotations"] = annotations
            existing = _parse(annotations.get(TERMINATION_TIMESTAMP_ANNOTATION))
            if existing is not None and existing <= wanted:
                return
            annotations[TERMINATION_TIMESTAMP_ANNOTATION] = rfc3339(wanted)
            try:
                await self.kube.request("PUT", _path(name), body=claim)
                return
            except KubeError as err:
                if err.status != 409 or attempt == 7:
                    raise
            await asyncio.sleep(0.05 * (attempt + 1))


def _parse(value: str | None) -> datetime | None:
    try:
        return parse_time(value)
    except ValueError:
        return None


class NodeClaimActivities:
    """Replacements as NodeClaims, and the wait for a node handed to Karpenter's termination."""

    def __init__(self, kube: KubeApi, poll_interval: float = 1.0, reads: ClusterReads | None = None) -> None:
        self.kube = kube
        self.poll_interval = poll_interval
        # The waits poll the NodeClaim, the node and its pods: from the worker's cache (cluster/reads.py).
        self.reads = reads if reads is not None else ClusterReads(kube)

    def _interval(self, requested: float | None) -> float:
        return requested if requested and requested > 0 else self.poll_interval

    async def _get(self, name: str) -> Json | None:
        try:
            return await self.kube.request("GET", _path(name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def _polled(self, name: str) -> Json | None:
        """The NodeClaim as a wait polls it: the cache's copy; the server's when the cache has none (a
        NodeClaim created a moment ago, or gone: only the server says gone)."""
        answered, claim = self.reads.cached_object("NodeClaim", name)
        return claim if answered and claim is not None else await self._get(name)

    @activity.defn(name="create_nodeclaim")
    async def create_nodeclaim(self, request: NodeClaimRequest) -> NodeClaimState:
        """Create the replacement's NodeClaim from its NodePool; a retry finds the one created before.
        A NodeClaim of that name that another command created is refused (nothing changed)."""
        name, pool_name = request.name, request.template.nodepool
        try:
            pool = await self.kube.request("GET", f"{NODEPOOLS}/{quote(pool_name, safe='')}")
        except Exception as err:
            if not_found(err):
                raise permanent(f"NodePool {pool_name} not found", errors.INVALID) from None
            raise classify_kube(err, f"reading NodePool {pool_name}") from None
        body = nodeclaim_body(request, pool)
        try:
            created = await self.kube.request("POST", NODECLAIMS, body=body)
            log.info("replacement %s: created NodeClaim %s for Karpenter to launch", request.index, name)
        except KubeError as err:
            if err.status in (400, 422):  # the CRD refuses it: retrying changes nothing
                raise permanent(f"NodeClaim {name} refused: {err.body[:500]}", errors.INVALID) from None
            if err.status != 409:
                raise classify_kube(err, f"creating NodeClaim {name}") from None
            existing = await self._get(name)
            if existing is None:
                raise classify_kube(err, f"creating NodeClaim {name}") from None
            owner = ((existing.get("metadata") or {}).get("annotations") or {}).get(
                REPLACEMENT_FOR_ANNOTATION
            )
            if owner != request.command_id:
                raise permanent(
                    f"NodeClaim {name} exists and is not replacement {request.index} of "
                    f"{request.command_id} (it says {owner or 'nothing'})",
                    errors.INVALID,
                ) from None
            created = existing
        except Exception as err:
            raise classify_kube(err, f"creating NodeClaim {name}") from None
        # Karpenter's DisruptionLaunching on each node it replaces (the recorder dedupes a retry's).
        await events.record_all(
            events.recorder_for(self.kube),
            [
                events.disruption_launching(ref, request.reason or "disruption", f"NodeClaim {name}")
                for ref in events.refs(request.candidates)
            ],
        )
        return nodeclaim_state(created)

    @activity.defn(name="await_nodeclaim")
    async def await_nodeclaim(self, request: NodeClaimWait) -> NodeClaimState:
        """Wait until Karpenter reports the condition True (Registered and Initialized also need the
        node's name). A NodeClaim deleted meanwhile (Karpenter gives up on a launch out of capacity, a
        registration that timed out) fails at once: Karpenter will not bring it back."""
        interval = self._interval(request.poll_interval_seconds)
        name, last = request.name, ""
        said = False
        while True:
            try:
                claim = await self._polled(name)
            except Exception as err:
                raise classify_kube(err, f"reading NodeClaim {name}") from None
            gone = claim is None or (request.uid and claim["metadata"].get("uid") != request.uid)
            if gone or claim is None or claim["metadata"].get("deletionTimestamp"):
                what = "was deleted" if gone else "is being deleted"
                raise permanent(
                    f"NodeClaim {name} {what} before it was {request.until}"
                    + (f"; Karpenter last said {last}" if last else ""),
                    errors.NOT_FOUND,
                )
            assert claim is not None
            state = nodeclaim_state(claim)
            ready = state.conditions.get(request.until) == "True"
            if ready and (request.until == "Launched" or state.node):
                return state
            last = _why_not(claim, request.until)
            _heartbeat(_progress(state, last))
            if not said:  # the candidates wait for it: say so once
                said = True
                replacement = f"NodeClaim {name}"
                await events.record_all(
                    events.recorder_for(self.kube),
                    [
                        events.disruption_waiting_readiness(ref, replacement)
                        for ref in events.refs(request.candidates)
                    ],
                )
            await asyncio.sleep(interval)

    @activity.defn(name="delete_nodeclaims")
    async def delete_nodeclaims(self, request: NodeClaimDeletion) -> list[str]:
        """Delete the NodeClaims this command created (its annotation says so; another's is left);
        Karpenter terminates their instances. Returns the ones deleted or already deleting."""
        deleted = []
        for name in request.names:
            try:
                claim = await self._get(name)
                if claim is None:
                    continue
                meta = claim["metadata"]
                if (meta.get("annotations") or {}).get(REPLACEMENT_FOR_ANNOTATION) != request.command_id:
                    log.warning("NodeClaim %s is not %s's replacement: left alone", name, request.command_id)
                    continue
                if not meta.get("deletionTimestamp"):
                    body = {
                        "kind": "DeleteOptions",
                        "apiVersion": "v1",
                        "preconditions": {"uid": meta["uid"]},
                    }
                    await self.kube.request("DELETE", _path(name), body=body)
                deleted.append(name)
            except KubeError as err:
                if err.status in (404, 409):
                    continue
                raise classify_kube(err, f"deleting NodeClaim {name}") from None
            except Exception as err:
                raise classify_kube(err, f"deleting NodeClaim {name}") from None
        return deleted

    @activity.defn(name="await_karpenter_termination")
    async def await_karpenter_termination(self, request: HandoverWait) -> str:
        """Wait until the node handed to Karpenter is gone (drained, its instance terminated, its
        finalizer released) and so is its NodeClaim; then give back the node's NodeDisruptionBudget
        claims, as karpflow's own termination does when it removes the finalizer (Karpenter removes
        it here, so that step never runs). Heartbeats what is left; a retry resumes."""
        interval = self._interval(request.poll_interval_seconds)
        while True:
            try:
                # From the worker's cache; "gone" (the end of the wait) is the server's word.
                node = await self.reads.node(request.node) or await self.kube.find_node(request.node)
                if node is not None and request.uid and node["metadata"].get("uid") != request.uid:
                    node = None  # the name is another node's now: the pinned one is gone
                claim = await self._polled(request.nodeclaim) if request.nodeclaim else None
                pods = len(await self.reads.pods_on_node(request.node)) if node is not None else 0
            except Exception as err:
                raise classify_kube(err, f"watching Karpenter terminate node {request.node}") from None
            if node is None and claim is None:
                try:
                    await budget_claims.release(self.kube, nodes=[request.node], uid=request.uid)
                except Exception as err:
                    raise classify_kube(
                        err, f"releasing the NodeDisruptionBudget claims of {request.node}"
                    ) from None
                return f"Karpenter drained and terminated node {request.node}" + (
                    f" (NodeClaim {request.nodeclaim})" if request.nodeclaim else ""
                )
            waiting = []
            if node is not None:
                state = "deleting" if node["metadata"].get("deletionTimestamp") else "not deleted yet"
                waiting.append(f"node {request.node} {state}, {pods} pod(s) on it")
            if claim is not None:
                waiting.append(f"NodeClaim {request.nodeclaim}")
            _heartbeat({"node": request.node, "waiting_for": "; ".join(waiting)})
            await asyncio.sleep(interval)
