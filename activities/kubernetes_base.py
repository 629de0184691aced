"""The state and small helpers every group of Kubernetes activities shares (KubernetesActivities in
activities/kubernetes.py is composed of those groups): the constructor the worker calls, the poll
interval, Events, NodeDisruptionBudget claim release, the NodePool as the planner reads it, and
heartbeats that a local activity skips.
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity

from activities import budget_claims, errors, guards
from activities.controls_gate import ControlsGate
from activities.errors import classify_kube, permanent
from activities.nodeclaims import KarpenterHandover
from api.constants import disrupted_taint_key
from api.nodepool import NodePool
from api.nodepool_reader import read_nodepool
from cluster.reads import ClusterReads
from kube import events
from kube.client import Json, KubeApi

log = logging.getLogger(__name__)

INSTANCE_CHECK_SECONDS = 30.0


def heartbeat(details: Any) -> None:
    # A local activity has no heartbeat: it is short, and its workflow task is its liveness.
    if activity.in_activity() and not activity.info().is_local:
        activity.heartbeat(details)


class KubernetesBase:
    """What every group of Kubernetes activities shares: the clients and settings the worker gives
    them, the poll interval, Events, NodeDisruptionBudget claims and reading a NodePool."""

    def __init__(
        self,
        kube: KubeApi,
        poll_interval: float = 1.0,
        *,
        ownership: guards.OwnershipCheck | None = None,
        cluster: str = "",
        karpenter_coexistence: bool = False,
        controls: ControlsGate | None = None,
        reads: ClusterReads | None = None,
    ) -> None:
        self.kube = kube
        # What the waits and the drain poll (nodes, pods, PDBs, VolumeAttachments): the worker's
        # informer cache while it is current (cluster/reads.py); without one, the API server.
        self.reads = reads if reads is not None else ClusterReads(kube)
        self.poll_interval = poll_interval
        # The controls outside the cluster (the controller's pauses, the starts rate budgets count),
        # checked at the taint with the windows; None (tests of single steps) checks only the cluster's.
        self.controls = controls
        # How often a wait for a replacement's node asks EC2 whether its instance still runs.
        self.instance_check_seconds = INSTANCE_CHECK_SECONDS
        # Whether this cluster owns an instance (EC2Activities.ownership): the managed-node guard.
        self.ownership = ownership
        self.cluster = cluster
        # Beside Karpenter: karpflow's own taint key, replacements as NodeClaims, and the nodes
        # Karpenter's termination controller acts on handed to it (activities/nodeclaims.py).
        self.coexistence = karpenter_coexistence
        self.taint_key = disrupted_taint_key(karpenter_coexistence)
        self.disrupted_taint = {"key": self.taint_key, "effect": "NoSchedule"}
        self.handover = KarpenterHandover(kube) if karpenter_coexistence else None

    def _interval(self, requested: float | None) -> float:
        return requested if requested and requested > 0 else self.poll_interval

    async def _record(self, batch: list[events.Event]) -> None:
        """Events of this step (best effort: kube/events.py `record_all` never raises)."""
        await events.record_all(events.recorder_for(self.kube), batch)

    async def _release_claims(self, *, cached: bool = False, **which: Any) -> None:
        """`cached`: the budgets are found in the worker's cache (budget_claims.release)."""
        try:
            await budget_claims.release(self.kube, reads=self.reads if cached else None, **which)
        except Exception as err:
            raise classify_kube(err, "releasing NodeDisruptionBudget claims") from None

    @staticmethod
    def _read_nodepool(name: str, raw: Json) -> NodePool:
        try:
            pool, problems = read_nodepool(raw)
        except ValueError as err:
            raise permanent(f"NodePool {name} does not validate: {err}", errors.INVALID) from None
        for problem in problems:
            log.warning("NodePool %s: %s", name, problem)
        return pool
