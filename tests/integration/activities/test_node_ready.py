"""await_node_ready (a disruption's one wait for its replacement, issue 21) against the emulator: it
registers, then initializes the node; once registered, its heartbeat and its failure name the node,
which the workflow reads to say how far the replacement got and which node to release."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import errors
from api.activity_io import LaunchedInstance, LaunchTemplate, RegistrationRequest
from api.constants import INITIALIZED_LABEL, REGISTERED_LABEL
from api.workflow_io import Offering

pytestmark = pytest.mark.integration


def request(world, name: str, ready: bool) -> RegistrationRequest:
    world.nodepool()
    node = world.node(name, ready=ready, initialized=False)
    provider_id = node["spec"]["providerID"]
    instance = LaunchedInstance(
        instance_id=provider_id.rsplit("/", 1)[-1],
        provider_id=provider_id,
        private_dns_name=name,
        offering=Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="on-demand"),
    )
    template = LaunchTemplate(
        nodepool="default", nodeclass="default", subnets={}, security_group_ids=[], amis=[]
    )
    return RegistrationRequest(instance=instance, template=template, poll_interval_seconds=0.01)


async def test_a_ready_node_is_registered_then_initialized_in_one_call(world):
    registered = await ActivityEnvironment().run(
        world.activities().await_node_ready, request(world, "r1", True)
    )

    assert registered.node == "r1"
    labels = world.get_node("r1")["metadata"]["labels"]
    assert labels[REGISTERED_LABEL] == "true" and labels[INITIALIZED_LABEL] == "true"


async def test_once_registered_its_heartbeat_and_its_failure_name_the_node(world):
    env = ActivityEnvironment()
    beats: list[dict] = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    waiting = asyncio.create_task(env.run(world.activities().await_node_ready, request(world, "r2", False)))
    for _ in range(500):
        if any(beat.get("node") == "r2" for beat in beats):
            break
        await asyncio.sleep(0.01)
    assert {"node": "r2", "waiting_for": ["not Ready"]} in beats, beats
    node = world.get_node("r2")  # gone before it initialized (its finalizer, from registration, dropped)
    node["metadata"]["finalizers"] = []
    world.emu.store.update("nodes", node)
    world.emu.store.delete("nodes", "r2")

    with pytest.raises(ApplicationError) as failure:
        await asyncio.wait_for(waiting, 10)
    assert failure.value.type == errors.NOT_FOUND and "disappeared" in failure.value.message
    assert failure.value.details == ({"node": "r2"},)
