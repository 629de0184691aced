"""The activity that judges a waiting command again: `check_waiting_command`.

A DisruptionWorkflow that waits for an operator's approval asks it now and then while it waits, and
once more when the wait ends and before it taints anything (workflows/disruption.py). The verdict is
the planner's (planner/waiting_validation.py) on the worker's cached view, as the controller's own
validation sees it: the other commands in flight hold their nodes (visibility), the operator's pauses
are the controller's, read as every voluntary path reads them (activities/controls_gate.py), and the
command's own start is not counted against its rate budget.

Fail closed: a view that cannot be had (cache stale, visibility or the controller's query failing)
is a retryable error; a command whose check finally fails takes no node (the workflow says why).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from temporalio import activity

from activities.controls_gate import ControlsUnreadable, controller_pauses
from activities.errors import UNAVAILABLE, retryable
from activities.planning import PlanningActivities, heartbeats
from api.activity_io import WaitingCommandCheck, WaitingCommandVerdict
from api.controller_io import Pause
from planner.plan import CommandOut
from planner.waiting_validation import approval_required, validate_waited


class WaitingCommandActivities:
    def __init__(self, planning: PlanningActivities) -> None:
        self.planning = planning

    async def _pauses(self) -> list[Pause]:
        """The pauses in force, read as every voluntary path reads them (activities/controls_gate.py)."""
        try:
            return await controller_pauses(self.planning.client, self.planning.cluster)
        except ControlsUnreadable as err:
            raise retryable(str(err), UNAVAILABLE) from None

    @activity.defn(name="check_waiting_command")
    async def check_waiting_command(self, request: WaitingCommandCheck) -> WaitingCommandVerdict:
        """Is the waiting command's plan still good on a fresh view, and is approval still asked for?"""
        async with heartbeats():
            return await self._check(request)

    async def _check(self, request: WaitingCommandCheck) -> WaitingCommandVerdict:
        now = datetime.now(UTC)
        pauses = await self._pauses()
        flying = await self.planning._in_flight()
        others = {
            node: workflow_id
            for node, (workflow_id, _) in flying.holders.items()
            if workflow_id != request.workflow_id
        }
        snapshot = await self.planning._snapshot(set(others), now, pauses, (), request.workflow_id)
        catalog = await self.planning._catalog_for(snapshot, [], now)
        planned = CommandOut.model_validate(request.planned) if request.planned is not None else None
        out = await asyncio.to_thread(
            validate_waited,
            snapshot,
            catalog,
            request.nodes,
            request.reason,
            request.node_uids,
            planned,
            self.planning.options,
            held=others,
        )
        nodes = list(out.command.nodes) if out.valid and out.command is not None else list(request.nodes)
        return WaitingCommandVerdict(
            valid=out.valid,
            reason=out.reason,
            nodes=nodes if out.valid else [],
            approval_required=approval_required(snapshot, request.nodes, request.reason),
        )
