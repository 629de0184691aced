"""A spot warning for a node whose termination already runs (issue 17 item 3): the forceful command
does not fail on the deleting node, and brings its termination deadline forward; the drain under
way re-reads it and is done by then. A deadline is never moved later."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from api.activity_io import BeginTerminationRequest, DrainRequest, TaintRequest
from api.constants import TERMINATION_TIMESTAMP_ANNOTATION
from kube.times import parse_time

pytestmark = pytest.mark.integration

DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}


def stamped(world, name: str) -> datetime | None:
    return parse_time(
        (world.get_node(name)["metadata"].get("annotations") or {}).get(TERMINATION_TIMESTAMP_ANNOTATION)
    )


async def test_a_spot_warning_brings_a_running_drain_to_its_deadline(world):
    world.nodepool(termination_grace_period="1h")
    world.node("n1")
    world.pod("trainer-1", "n1", annotations=DO_NOT_DISRUPT, spec={"terminationGracePeriodSeconds": 1})
    acts, env = world.activities(), ActivityEnvironment()
    began = await env.run(acts.begin_termination, BeginTerminationRequest(node="n1", reason="Drifted"))
    assert began.deadline is not None and began.deadline - datetime.now(UTC) > timedelta(minutes=50)
    drain = asyncio.create_task(
        env.run(
            acts.drain_node, DrainRequest(node="n1", uid=began.uid, reason="Drifted", deadline=began.deadline)
        )
    )
    await asyncio.sleep(1)
    assert not drain.done()  # the do-not-disrupt pod holds it until the deadline, an hour away

    spot = datetime.now(UTC) + timedelta(seconds=3)
    (claimed,) = await env.run(
        acts.taint_disrupted,
        TaintRequest(
            nodes=["n1"], command_id="interruption/prod/i-1/spot@r", reason="Interrupted", deadline=spot
        ),
    )
    assert claimed.ok, claimed.message  # a deleting node does not fail a forceful command
    assert stamped(world, "n1") == spot.replace(microsecond=0)

    drained = await asyncio.wait_for(drain, timeout=30)
    assert drained.deleted == 1 and datetime.now(UTC) < spot + timedelta(seconds=5)


async def test_a_termination_deadline_is_never_moved_later(world):
    world.nodepool()
    world.node("n1")
    acts, env = world.activities(), ActivityEnvironment()
    soon = datetime.now(UTC) + timedelta(minutes=2)
    await env.run(
        acts.begin_termination, BeginTerminationRequest(node="n1", reason="Interrupted", deadline=soon)
    )
    later = await env.run(
        acts.begin_termination,
        BeginTerminationRequest(node="n1", reason="Interrupted", deadline=soon + timedelta(hours=1)),
    )
    (claimed,) = await env.run(
        acts.taint_disrupted,
        TaintRequest(nodes=["n1"], command_id="x@r", reason="Expired", deadline=soon + timedelta(hours=2)),
    )
    assert claimed.ok and later.deadline == stamped(world, "n1") == soon.replace(microsecond=0)
