"""A spot warning for a node whose termination already runs (issue 17 item 3): the forceful command
does not fail on the deleting node, and brings its termination deadline forward; the drain under
way re-reads it and is done by then. A deadline is never moved later."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from api.activity_io import BeginTerminationRequest, DrainRequest, TaintRequest, TerminationGateRequest
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


async def test_a_gated_termination_starts_its_drain_clock_when_the_gate_opens(world):
    """Issue 30 item 2: begin_termination with `defer_deadline` deletes the node and stamps nothing;
    the gate that lets it go stamps now + terminationGracePeriod, so however long the gate waited the
    drain has its whole grace period. A gate asked again keeps the stamp (never moved)."""
    world.nodepool(termination_grace_period="1h")
    world.node("n1")
    acts, env = world.activities(), ActivityEnvironment()
    began = await env.run(
        acts.begin_termination, BeginTerminationRequest(node="n1", reason="Manual", defer_deadline=True)
    )
    assert began.found and began.deadline is None and stamped(world, "n1") is None
    assert world.get_node("n1")["metadata"].get("deletionTimestamp")

    ask = TerminationGateRequest(node="n1", uid=began.uid, reason="Manual", holder="t@r", stamp_deadline=True)
    opened = await env.run(acts.termination_gate, ask)
    assert opened.go and opened.deadline is not None
    assert opened.deadline == stamped(world, "n1")
    assert timedelta(minutes=59) < opened.deadline - datetime.now(UTC) <= timedelta(hours=1)
    again = await env.run(acts.termination_gate, ask)
    assert again.deadline == opened.deadline


async def test_the_gate_never_postpones_an_earlier_or_a_hard_deadline(world):
    world.nodepool(termination_grace_period="1h")
    world.node("n1")
    world.node("n2")
    acts, env = world.activities(), ActivityEnvironment()
    soon = datetime.now(UTC) + timedelta(minutes=2)
    # n1: a spot warning brought its deadline forward while its termination waited at the gate.
    await env.run(
        acts.begin_termination, BeginTerminationRequest(node="n1", reason="Manual", defer_deadline=True)
    )
    (claimed,) = await env.run(
        acts.taint_disrupted,
        TaintRequest(
            nodes=["n1"], command_id="interruption/prod/i-1/spot@r", reason="Interrupted", deadline=soon
        ),
    )
    assert claimed.ok
    opened = await env.run(
        acts.termination_gate,
        TerminationGateRequest(node="n1", reason="Manual", holder="t@r", stamp_deadline=True),
    )
    assert opened.go and opened.deadline == stamped(world, "n1") == soon.replace(microsecond=0)
    # n2: the termination's own hard deadline (an interruption's time) is the earlier one.
    await env.run(
        acts.begin_termination,
        BeginTerminationRequest(node="n2", reason="Interrupted", deadline=soon, defer_deadline=True),
    )
    opened = await env.run(
        acts.termination_gate,
        TerminationGateRequest(
            node="n2", reason="Interrupted", holder="t2@r", stamp_deadline=True, deadline=soon
        ),
    )
    assert opened.go and opened.deadline == stamped(world, "n2") == soon.replace(microsecond=0)
