"""await_node_ready (a disruption's one wait for its replacement, issue 21) against the emulator: it
registers, then initializes the node; once registered, its heartbeat and its failure name the node,
which the workflow reads to say how far the replacement got and which node to release."""

from __future__ import annotations

import asyncio
import dataclasses

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
    # What it waits for next depends on how far the node got before the first beat (on a loaded
    # machine it may be Ready already and wait for initialization); the beat names the node either way.
    named = [beat for beat in beats if beat.get("node") == "r2"]
    assert named and str(named[0].get("waiting_for")) in ("['not Ready']", "initialization"), beats
    node = world.get_node("r2")  # gone before it initialized (its finalizer, from registration, dropped)
    node["metadata"]["finalizers"] = []
    world.emu.store.update("nodes", node)
    world.emu.store.delete("nodes", "r2")

    with pytest.raises(ApplicationError) as failure:
        await asyncio.wait_for(waiting, 10)
    assert failure.value.type == errors.NOT_FOUND and "disappeared" in failure.value.message
    assert failure.value.details == ({"node": "r2"},)


def retry_after(beat: dict) -> ActivityEnvironment:
    """An environment whose activity is a retry: the earlier attempt's last heartbeat was `beat`."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[beat])
    return env


async def test_a_retry_fails_at_once_when_the_node_it_registered_is_gone(world):
    """The chaos run's stuck disruption: the replacement's node registered, its instance vanished and
    its Node was released; the next attempt looked for a Node of that instance until the replacement's
    deadline (10 minutes), the candidates tainted all along."""
    ask = request(world, "r3", False)
    node = world.get_node("r3")
    node["metadata"]["finalizers"] = []
    world.emu.store.update("nodes", node)
    world.emu.store.delete("nodes", "r3")

    env = retry_after({"node": "r3", "waiting_for": ["not Ready"]})
    with pytest.raises(ApplicationError) as failure:
        await asyncio.wait_for(env.run(world.activities().await_node_ready, ask), 5)
    assert failure.value.type == errors.NOT_FOUND and failure.value.non_retryable
    assert "r3" in failure.value.message and ask.instance.provider_id in failure.value.message
    assert failure.value.details == ({"node": "r3"},)


async def test_a_retry_whose_node_is_still_there_goes_on_waiting(world):
    """Only a registered node that is gone fails the retry: one still there is registered again
    (idempotent) and initializes."""
    env = retry_after({"node": "r4", "waiting_for": "initialization"})
    registered = await asyncio.wait_for(
        env.run(world.activities().await_node_ready, request(world, "r4", True)), 5
    )
    assert registered.node == "r4"
    assert world.get_node("r4")["metadata"]["labels"][INITIALIZED_LABEL] == "true"


async def test_a_retry_that_had_not_registered_waits_as_before(world):
    ask = request(world, "r5", True)
    node = world.get_node("r5")
    node["metadata"]["finalizers"] = []
    world.emu.store.update("nodes", node)
    world.emu.store.delete("nodes", "r5")
    waiting = retry_after({"waiting_for": f"a Node with providerID {ask.instance.provider_id}"})
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(waiting.run(world.activities().await_node_ready, ask), 0.5)


def unregistered(world) -> RegistrationRequest:
    """A replacement whose instance runs (in moto) and has no Node yet."""
    instance_id = world.instance()
    provider_id = f"aws:///us-west-2a/{instance_id}"
    return request(world, "r6", True).model_copy(
        update={
            "instance": LaunchedInstance(
                instance_id=instance_id,
                provider_id=provider_id,
                private_dns_name="ip-10-0-0-6.us-west-2.compute.internal",
                offering=Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="on-demand"),
            )
        }
    )


async def test_the_wait_for_registration_fails_once_ec2_says_the_instance_ended(world):
    """An instance that vanished before its node registered used to hold the candidates tainted until
    the replacement's deadline; the wait now asks EC2 now and then, and fails as soon as it ends."""
    ask = unregistered(world)
    activities = world.activities()
    activities.instance_check_seconds = 0.05
    waiting = asyncio.create_task(ActivityEnvironment().run(activities.await_node_ready, ask))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # running, no node: it waits
    world.ec2.terminate_instances(InstanceIds=[ask.instance.instance_id])

    with pytest.raises(ApplicationError) as failure:
        await asyncio.wait_for(waiting, 5)
    assert failure.value.type == errors.NOT_FOUND and failure.value.non_retryable
    assert ask.instance.instance_id in failure.value.message and "never register" in failure.value.message
