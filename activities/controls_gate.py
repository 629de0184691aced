"""The operator's controls that live outside the cluster, read the same way by every voluntary path.

Two controls are not Kubernetes objects: the controller's pauses (`karpflow pause`, kept in the
ControllerWorkflow's state) and the starts rate budgets count (Temporal visibility,
activities/recent_starts.py). The controller's own passes get them with each pass (PassRequest
carries the pauses; planning.py reads the starts). Every other way in goes through here:

- the taint of every command (activities/taints.py `_check_controls`): started by the controller,
  by hand (`karpflow disrupt`, `temporal workflow start`), by a rollout (through the controller's
  drift), approved hours after it was planned, or by the interruption poller's rebalance;
- the interruption poller, before it starts a rebalance replacement (cluster/interruption.py).

Pauses are read with the `pauses` query of `karpflow-controller/<cluster>` (falling back to its
`status` query on a controller older than that query). A latest run that ended (stopped, failed,
terminated) still holds its pauses: the run started next carries them over; they are read from a
stopped run's result when it holds its state, else from the ended run's `status` query. No
controller ever started: no pause. Any other failure (Temporal unreachable, no worker answers in
time) fails closed: `ControlsUnreadable`, which the taint turns into a retryable error (nothing is
tainted until the pauses can be read; after its retries the command fails having changed nothing),
a termination's gate into a wait, and the poller into "no proactive replacement".

Rate budgets at the moment of acting: the nodes' NodePools as the planner reads them
(api/nodepool_reader.py: a budget that does not read fails the pool closed), the pool's initialized
nodes for percentages, and the starts visibility lists within the longest `per`, without the command's
own run (planner/rate_budgets.py `rate_refusal`, the rule a pass applies). Visibility is read only
when a candidate's pool has a rate budget for the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import QueryRejectCondition
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities import guards
from activities.errors import UNAVAILABLE, classify_kube, retryable
from activities.recent_starts import Start, recent_disruptions, recent_starts
from api.constants import INITIALIZED_LABEL, KARPENTER_GROUP, KARPENTER_VERSION, NODEPOOL_LABEL
from api.controller_io import QUERY_PAUSES, QUERY_STATUS, ControllerStatus, Pause, Pauses
from api.karpflow_overrides import BUDGETS, MAX_DISRUPTIONS_PER_HOUR
from api.nodepool import NodePool
from api.nodepool_reader import read_nodepool
from api.workflow_ids import controller_workflow_id
from api.workflow_io import VOLUNTARY_REASONS
from kube.client import Json, KubeApi, KubeError
from planner.maintenance_windows import Window, pause_window
from planner.rate_budgets import longest_period, rate_budgets, rate_refusal

log = logging.getLogger(__name__)

# A query waits for a worker to run it: long enough for a loaded worker, short within a taint's call.
QUERY_TIMEOUT = timedelta(seconds=10)


class ControlsUnreadable(RuntimeError):
    """The controller's pauses or the recent starts cannot be read now: voluntary work waits."""


def pause_windows(pauses: Iterable[Pause]) -> dict[str, Window]:
    """The operator's pauses as windows (planner/maintenance_windows.py `pause_window`): how a pass,
    the rebalance check and the taint all apply them."""
    return {
        f"pause/{p.key}": pause_window(f"pause/{p.key}", p.describe(), p.action, p.nodepool) for p in pauses
    }


async def controller_pauses(client: Client, cluster: str) -> list[Pause]:
    """The pauses of the cluster's latest controller run, running or ended (none when no controller
    was ever started). Raises ControlsUnreadable when they cannot be read."""
    handle = client.get_workflow_handle(controller_workflow_id(cluster))
    try:
        try:
            answer = await handle.query(
                QUERY_PAUSES,
                result_type=Pauses,
                reject_condition=QueryRejectCondition.NOT_OPEN,
                rpc_timeout=QUERY_TIMEOUT,
            )
            return list(answer.pauses)
        except WorkflowQueryFailedError:
            # A controller run by an older worker knows only `status`, which carries the pauses too.
            return await _status_pauses(handle, QueryRejectCondition.NOT_OPEN)
        except WorkflowQueryRejectedError:
            return await _ended_pauses(handle)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []  # no controller was ever started: nobody paused anything
        raise ControlsUnreadable(f"the controller's pauses cannot be read: {err.message}") from err
    except ControlsUnreadable:
        raise
    except Exception as err:
        raise ControlsUnreadable(f"the controller's pauses cannot be read: {err!r}") from err


async def _status_pauses(
    handle: WorkflowHandle[Any, Any], reject: QueryRejectCondition | None = None
) -> list[Pause]:
    status = await handle.query(
        QUERY_STATUS, result_type=ControllerStatus, reject_condition=reject, rpc_timeout=QUERY_TIMEOUT
    )
    return list(status.pauses)


async def _ended_pauses(handle: WorkflowHandle[Any, Any]) -> list[Pause]:
    """An ended run's pauses: an operator stopped it, or it failed or was terminated, and the run
    started next carries its state over (runtime/controller_start.py), so they still hold. From a
    stopped run's result when it says (no worker needed), else from its status query (Temporal
    replays the closed run on a worker)."""
    described = await handle.describe()
    if described.status == WorkflowExecutionStatus.COMPLETED:
        result: Any = await handle.result()
        state = result.get("state") if isinstance(result, dict) else None
        if isinstance(state, dict) and isinstance(state.get("pauses"), dict):
            return [Pause.model_validate(p) for p in state["pauses"].values()]
    return await _status_pauses(handle)


def _budget_problems(problems: Iterable[str]) -> list[str]:
    """The problems of a NodePool that concern its budgets (dropped, so they fail the pool closed)."""
    return [
        p
        for p in problems
        if p.startswith("spec.disruption.budgets") or BUDGETS in p or MAX_DISRUPTIONS_PER_HOUR in p
    ]


def _labels(node: Json) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


class ControlsGate:
    """The reads of the controls outside the cluster, bound to a Temporal client, the cluster (whose
    controller holds the pauses) and the task queue (whose workflows are the starts)."""

    def __init__(self, client: Client, cluster: str, task_queue: str) -> None:
        self.client = client
        self.cluster = cluster
        self.task_queue = task_queue

    async def pauses(self) -> list[Pause]:
        return await controller_pauses(self.client, self.cluster)

    async def starts(self, since: datetime) -> list[Start]:
        try:
            return await recent_starts(self.client, self.task_queue, since)
        except RPCError as err:
            raise ControlsUnreadable(f"the recent starts cannot be read: {err.message}") from err

    # -- at the moment of acting (the taint) ----------------------------------------------------------

    async def refusal(
        self, kube: KubeApi, reason: str, command_id: str, taking: list[Json], now: datetime
    ) -> str | None:
        """Why a pause or a rate budget forbids taking `taking` for `reason` now (None: they allow it).
        Raises a retryable ApplicationError when the pauses or the starts cannot be read: nothing is
        taken until they can."""
        try:
            why = guards.window_refusal(
                await self._pause_windows_for(reason, command_id, taking), taking, reason, command_id, now
            )
            return why or await self.rate_refusal(kube, reason, command_id, taking, now)
        except ControlsUnreadable as err:
            raise retryable(f"{err}: no {reason} disruption until they can", UNAVAILABLE) from None
        except ApplicationError:
            raise
        except Exception as err:
            raise classify_kube(err, "reading the NodePools' rate budgets") from None

    async def hold(
        self, kube: KubeApi, reason: str, holder: str, node: Json, now: datetime
    ) -> tuple[str, str] | None:
        """For a termination's gate, which waits rather than fails (its node is deleting already):
        (what it waits for, why) when a pause or a rate budget holds the node, or the pauses or starts
        cannot be read (it fails closed: it waits and asks again); None when they let it go. The
        termination's own runs (every run of its id: one node) are not counted against it."""
        try:
            why = guards.window_refusal(
                await self._pause_windows_for(reason, holder, [node]), [node], reason, holder, now
            )
            if why is not None:
                return "a controller pause", why
            why = await self.rate_refusal(kube, reason, holder.partition("@")[0], [node], now)
        except ControlsUnreadable as err:
            return "the controller's pauses or the recent starts", f"{err}: waiting until they can be read"
        return None if why is None else ("a rate budget", why)

    async def _pause_windows_for(self, reason: str, command_id: str, taking: list[Json]) -> list[Window]:
        """The pauses as windows, read only when a window could block something taken (interruption
        and NodePool deletion are never paused: their taint does not wait for the controller)."""
        if all(guards.window_action(reason, command_id, node) is None for node in taking):
            return []
        return list(pause_windows(await self.pauses()).values())

    async def rate_refusal(
        self, kube: KubeApi, reason: str, command_id: str, taking: list[Json], now: datetime
    ) -> str | None:
        """Why taking `taking` for `reason` now would exceed a rate budget of their NodePools (None:
        it fits, or no rate budget applies: forceful reasons never wait for one)."""
        if reason not in VOLUNTARY_REASONS or not taking:
            return None
        by_pool: dict[str, list[str]] = {}
        for node in taking:
            if label := _labels(node).get(NODEPOOL_LABEL):
                by_pool.setdefault(label, []).append(str(node["metadata"]["name"]))
        pools: dict[str, NodePool] = {}
        for name in sorted(by_pool):
            read, refusal = await self._nodepool(kube, name)
            if refusal is not None:
                return refusal
            if read is not None and rate_budgets(read):
                pools[name] = read
        period = longest_period(pools.values())
        if period is None:
            return None
        own_id, _, own_run = command_id.partition("@")
        starts = [
            s
            for s in await self.starts(now - period)
            if not (s.workflow_id == own_id and (not own_run or s.run_id == own_run))
        ]
        managed = (await kube.list_nodes(label_selector=NODEPOOL_LABEL)).get("items") or ()
        pool_of = {str(n["metadata"]["name"]): _labels(n).get(NODEPOOL_LABEL) for n in managed}
        recent = recent_disruptions(starts, pool_of.get)
        for name, pool in pools.items():
            total = sum(
                1
                for n in managed
                if _labels(n).get(NODEPOOL_LABEL) == name and _labels(n).get(INITIALIZED_LABEL) == "true"
            )
            why = rate_refusal(pool, total, reason, now, recent, by_pool[name])
            if why is not None:
                return why
        return None

    @staticmethod
    async def _nodepool(kube: KubeApi, name: str) -> tuple[NodePool | None, str | None]:
        """The NodePool as the planner reads it, or why its budgets fail closed (None, None: gone,
        which the managed-node guard has refused already)."""
        try:
            raw: Any = await kube.get_cluster_custom(KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", name)
        except KubeError as err:
            if err.status == 404:
                return None, None
            raise
        try:
            pool, problems = read_nodepool(raw)
        except ValueError as err:
            return None, f"NodePool {name} does not validate ({err}); its budgets fail closed"
        if broken := _budget_problems(problems):
            return None, f"NodePool {name}: {broken[0]}; its budgets fail closed"
        return pool, None
