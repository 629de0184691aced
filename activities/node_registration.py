"""A replacement's Node, from launch to capacity: `await_node_registered` (wait for the Node, then
make it karpflow's: NodePool labels, annotations and taints, the finalizer, registered),
`await_node_initialized` (Ready, no startup or ephemeral taint left), `await_node_ready` (both as
one activity, failing at once when the instance ended or the registered node is gone), and
`release_node` (compensation for a replacement that never initialized).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from temporalio import activity

from activities import errors
from activities.errors import classify_kube, not_found, permanent
from activities.kubernetes_base import KubernetesBase, heartbeat
from activities.node_json import (
    add_taint,
    drop_finalizer,
    ensure_finalizer,
    initialization_blockers,
    instance_id_of,
    pinned,
    remove_taint,
    replacement_leaving,
    set_annotations,
    set_labels,
    uid_of,
)
from api.activity_io import (
    DiscardRequest,
    InitializationRequest,
    LaunchedInstance,
    LaunchTemplate,
    RegisteredNode,
    RegistrationRequest,
)
from api.constants import (
    DO_NOT_SYNC_TAINTS_LABEL,
    INITIALIZED_LABEL,
    REGISTERED_LABEL,
    UNREGISTERED_TAINT_KEY,
)
from kube import events
from kube.client import Json

log = logging.getLogger(__name__)

ENDED_INSTANCE_STATES = frozenset({"shutting-down", "terminated"})


class NodeRegistration(KubernetesBase):
    """The waits for a replacement's Node, and the compensation for one that never initialized."""

    async def _node_for(self, name_hint: str | None, provider_id: str, list_too: bool) -> Json | None:
        """The node with this providerID: from the worker's cache (its providerID index); without a
        current cache, by name first (the private DNS name), then by listing (cluster/reads.py)."""
        return await self.reads.node_with_provider_id(provider_id, name_hint, list_too)

    @activity.defn(name="await_node_registered")
    async def await_node_registered(self, request: RegistrationRequest) -> RegisteredNode:
        """Wait for the replacement's Node, then make it karpflow's: NodePool labels, annotations and
        taints, the termination finalizer, `karpenter.sh/registered=true`, and no
        `karpenter.sh/unregistered` taint."""
        instance = request.instance
        interval = self._interval(request.poll_interval_seconds)
        polls = 0
        what = f"replacement instance {instance.instance_id} ({instance.provider_id})"
        said = False
        # A first attempt gives EC2 time to list the new instance; a retry (a passing error, a dead
        # worker) looks at once: else every attempt cut short before the first look starts the clock
        # again, and an instance that ended is not noticed for minutes (chaos seed 1: three).
        retried = activity.in_activity() and activity.info().attempt > 1
        look_at_ec2 = time.monotonic() + (0.0 if retried else self.instance_check_seconds)
        while True:
            try:
                node = await self._node_for(
                    instance.private_dns_name, instance.provider_id, list_too=polls % 3 == 2
                )
            except Exception as err:
                raise classify_kube(err, f"looking for the node of {what}") from None
            if node is not None:
                name = node["metadata"]["name"]
                try:
                    # On the version the cache holds (no read first); a conflict reads the server's.
                    await self.kube.update_node(
                        name,
                        pinned(
                            uid_of(node),
                            lambda n: self._sync_registration(n, request.template, instance.labels),
                        ),
                        current=node,
                    )
                except Exception as err:
                    raise classify_kube(err, f"registering node {name}") from None
                log.info("node %s registered for %s", name, what)
                return RegisteredNode(node=name)
            heartbeat({"waiting_for": f"a Node with providerID {instance.provider_id}"})
            if not said:  # the candidates wait for it: say so once (the recorder dedupes a retry)
                said = True
                replacement = f"{instance.instance_id} ({instance.offering.instance_type})"
                await self._record(
                    [
                        events.disruption_waiting_readiness(r, replacement)
                        for r in events.refs(request.candidates)
                    ]
                )
            if time.monotonic() >= look_at_ec2:
                look_at_ec2 = time.monotonic() + self.instance_check_seconds
                await self._refuse_if_instance_ended(instance)
            polls += 1
            await asyncio.sleep(interval)

    async def _refuse_if_instance_ended(self, instance: LaunchedInstance) -> None:
        """An instance that is terminating or terminated will never register a node: fail the wait
        now, not at the replacement's deadline. (Not found is not enough: EC2 is eventually
        consistent just after a launch.) A look that failed for a passing reason (throttled, 5xx,
        unreachable) is only logged and the wait goes on; a permanent one (access denied, a bug)
        fails the wait at once, rather than hide a misconfiguration until the deadline."""
        if self.ownership is None:
            return
        try:
            state = await self.ownership(instance.instance_id)
        except Exception as err:
            failure = errors.classify_ec2_lookup(
                err, f"looking up replacement instance {instance.instance_id}"
            )
            if failure.non_retryable and failure.type != errors.NOT_FOUND:
                raise failure from None
            log.warning("could not look up replacement instance %s: %s", instance.instance_id, failure)
            return
        if state.state in ENDED_INSTANCE_STATES:
            raise permanent(
                f"replacement instance {instance.instance_id} is {state.state}: its node will never register",
                errors.NOT_FOUND,
            )

    @staticmethod
    def _sync_registration(node: Json, template: LaunchTemplate, instance_labels: dict[str, str]) -> bool:
        """What Karpenter's registration copies from the NodeClaim: the instance type's and offering's
        labels (karpenter.k8s.aws/instance-*, zone id, capacity type: as no kubelet writes them), the
        NodePool's labels, annotations and taints. All the NodePool's labels: the user data carried
        only those the kubelet accepts (launch/kubelet_labels.py), and these are written in the same
        update that removes `karpenter.sh/unregistered`, so they are on the Node before anything
        can schedule there or initialization can label it."""
        changed = set_labels(node, {**instance_labels, **template.labels, REGISTERED_LABEL: "true"})
        changed |= set_annotations(node, template.annotations)
        if (node["metadata"].get("labels") or {}).get(DO_NOT_SYNC_TAINTS_LABEL) != "true":
            for taint in template.taints:
                changed |= add_taint(node, taint.model_dump(exclude_none=True))
        changed |= remove_taint(node, UNREGISTERED_TAINT_KEY)
        changed |= ensure_finalizer(node)
        return changed

    @activity.defn(name="await_node_initialized")
    async def await_node_initialized(self, request: InitializationRequest) -> None:
        """Wait until the node is Ready with no startup or ephemeral taint left, then label it initialized.
        The heartbeat says what it still waits for; a timeout reports it."""
        interval = self._interval(request.poll_interval_seconds)
        said = False
        while True:
            try:
                node = await self.reads.node(request.node)
            except Exception as err:
                raise classify_kube(err, f"reading node {request.node}") from None
            if node is None:
                # The cache may not have seen a node registered a moment ago: only the server says gone.
                try:
                    node = await self.kube.find_node(request.node)
                except Exception as err:
                    raise classify_kube(err, f"reading node {request.node}") from None
            if node is None:
                raise permanent(f"node {request.node} disappeared before it initialized", errors.NOT_FOUND)
            if leaving := replacement_leaving(node):
                raise permanent(f"node {request.node} {leaving}: it will not be capacity", errors.NOT_FOUND)
            blockers = initialization_blockers(node, request.startup_taints)
            if not blockers:
                try:
                    await self.kube.update_node(
                        request.node,
                        pinned(uid_of(node), lambda n: set_labels(n, {INITIALIZED_LABEL: "true"})),
                        current=node,
                    )
                except Exception as err:
                    raise classify_kube(err, f"labelling node {request.node} initialized") from None
                return
            heartbeat({"node": request.node, "waiting_for": blockers})
            if not said:
                said = True
                await self._record(
                    [
                        events.disruption_waiting_readiness(r, request.node)
                        for r in events.refs(request.candidates)
                    ]
                )
            await asyncio.sleep(interval)

    @activity.defn(name="await_node_ready")
    async def await_node_ready(self, request: RegistrationRequest) -> RegisteredNode:
        """`await_node_registered`, then `await_node_initialized`: the two always follow each other,
        and as one wait they cost a disruption's history one activity, not two. Once registered, the
        heartbeat names the node, and so does a failure (`details[0]["node"]`): the workflow knows
        how far the replacement got. A retry registers again (idempotent) and goes on waiting; but if
        an earlier attempt registered a node and no Node has the instance's providerID now, that node
        is gone (its instance vanished, someone deleted it): the retry fails at once, naming it, so
        the workflow rolls back instead of waiting out the replacement's deadline."""
        await self._refuse_if_registered_node_gone(request.instance, request.registered_node)
        registered = await self.await_node_registered(request)
        # Before the first wait: a worker that dies now leaves the node's name to the retry.
        heartbeat({"node": registered.node, "waiting_for": "initialization"})
        initialization = InitializationRequest(
            node=registered.node,
            startup_taints=request.template.startup_taints,
            poll_interval_seconds=request.poll_interval_seconds,
            candidates=request.candidates,
        )
        try:
            await self.await_node_initialized(initialization)
        except errors.ApplicationError as err:
            raise errors.ApplicationError(
                err.message,
                {"node": registered.node},
                type=err.type,
                non_retryable=err.non_retryable,
                next_retry_delay=err.next_retry_delay,
            ) from None
        return registered

    async def _refuse_if_registered_node_gone(
        self, instance: LaunchedInstance, known: str | None = None
    ) -> None:
        """The node an earlier attempt registered (its heartbeat), or the caller knows (`known`), must
        still have the instance's providerID."""
        node: Any = known
        if not node and activity.in_activity() and not activity.info().is_local:
            beats = activity.info().heartbeat_details
            last = beats[0] if beats else None
            node = last.get("node") if isinstance(last, dict) else None
        if not isinstance(node, str) or not node:
            return
        try:
            # Gone is decided by the server: a cache that lags must not roll a replacement back.
            found = await self._node_for(node, instance.provider_id, list_too=True)
            if found is None:
                found = await self.reads.node_with_provider_id(instance.provider_id, node, fresh=True)
        except Exception as err:
            raise classify_kube(err, f"looking for node {node} again") from None
        if found is None:
            raise permanent(
                f"node {node} of replacement instance {instance.instance_id} disappeared after it "
                f"registered: no Node has providerID {instance.provider_id} now",
                errors.NOT_FOUND,
                {"node": node},
            )

    @activity.defn(name="release_node")
    async def release_node(self, request: DiscardRequest) -> None:
        """Compensation for a replacement that never initialized, once its instance is terminated: drop
        karpflow's finalizer and delete its Node (nothing to drain on a node that never initialized).
        Missing node: nothing to do."""
        try:
            node = await self.kube.find_node(request.node) if request.node else None
            if (
                node is None
                or instance_id_of((node.get("spec") or {}).get("providerID")) != request.instance_id
            ):
                node = next(
                    (
                        item
                        for item in (await self.kube.list_nodes()).get("items") or ()
                        if instance_id_of((item.get("spec") or {}).get("providerID")) == request.instance_id
                    ),
                    None,
                )
            if node is None:
                return
            name = node["metadata"]["name"]
            await self.kube.update_node(name, drop_finalizer)
            await self.kube.delete_node(name)
        except Exception as err:
            if not_found(err):
                return
            raise classify_kube(err, f"releasing the node of instance {request.instance_id}") from None
