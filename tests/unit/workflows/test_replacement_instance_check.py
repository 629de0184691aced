"""The wait for a replacement's node asks EC2 now and then whether its instance still runs
(`_refuse_if_instance_ended`). A look that fails for a passing reason is logged and the wait goes
on; a permanent one (access denied, a bug) fails the wait at once instead of hiding the
misconfiguration until the replacement's deadline.

The boundaries are faked: a Kubernetes API with no node yet, and an EC2 client that answers from a
script; the ownership check between them is EC2Activities' own."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from botocore.exceptions import ClientError
from temporalio.exceptions import ApplicationError

from activities import errors
from activities.ec2 import EC2Activities
from activities.kubernetes import KubernetesActivities
from api.activity_io import InstanceState, LaunchedInstance, LaunchTemplate, RegistrationRequest
from api.workflow_io import Offering

INSTANCE = "i-0123456789abcdef0"


class NoNodeYet:
    """The Kubernetes API while the replacement's kubelet has not registered."""

    async def find_node(self, name: str) -> None:
        return None

    async def list_nodes(self) -> dict[str, Any]:
        return {"items": []}


class ScriptedEC2:
    """describe_instances answers with the next of `answers`: an error to raise, or an instance state."""

    def __init__(self, *answers: ClientError | str) -> None:
        self.answers = list(answers)
        self.calls = 0

    def describe_instances(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, ClientError):
            raise answer
        instance = {"InstanceId": INSTANCE, "State": {"Name": answer}, "Tags": []}
        return {"Reservations": [{"Instances": [instance]}]}


def ec2_error(code: str, status: int) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": f"{code} says so"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "DescribeInstances")


def waiting_for(ownership: Any) -> tuple[KubernetesActivities, RegistrationRequest]:
    activities = KubernetesActivities(NoNodeYet(), poll_interval=0.001, ownership=ownership)  # type: ignore[arg-type]
    activities.instance_check_seconds = 0  # ask EC2 at every poll
    instance = LaunchedInstance(
        instance_id=INSTANCE,
        provider_id=f"aws:///us-west-2a/{INSTANCE}",
        private_dns_name="ip-10-0-0-9.us-west-2.compute.internal",
        offering=Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="on-demand"),
    )
    template = LaunchTemplate(
        nodepool="default", nodeclass="default", subnets={}, security_group_ids=[], amis=[]
    )
    return activities, RegistrationRequest(instance=instance, template=template, poll_interval_seconds=0.001)


async def test_a_passing_ec2_failure_is_logged_and_the_wait_goes_on(caplog: pytest.LogCaptureFixture):
    ec2 = ScriptedEC2(
        ec2_error("RequestLimitExceeded", 503),
        ec2_error("InternalError", 500),
        ec2_error("InvalidInstanceID.NotFound", 400),  # just after a launch: EC2 does not know it yet
        "pending",
        "terminated",
    )
    activities, request = waiting_for(EC2Activities(ec2, "prod").ownership)
    with (
        caplog.at_level(logging.WARNING, logger="activities.node_registration"),
        pytest.raises(ApplicationError) as ended,
    ):
        await asyncio.wait_for(activities.await_node_registered(request), 5)
    # It went on past both failures and the unknown instance, and stopped only when EC2 said terminated.
    assert ec2.calls == 5
    assert ended.value.type == errors.NOT_FOUND and "never register" in ended.value.message
    logged = [
        r.getMessage() for r in caplog.records if "could not look up replacement instance" in r.getMessage()
    ]
    assert len(logged) == 2
    assert "RequestLimitExceeded" in logged[0] and "InternalError" in logged[1]


@pytest.mark.parametrize("code", ["AccessDenied", "UnauthorizedOperation"])
async def test_a_denied_look_at_ec2_fails_the_wait_at_once(code: str):
    ec2 = ScriptedEC2(ec2_error(code, 403))
    activities, request = waiting_for(EC2Activities(ec2, "prod").ownership)
    with pytest.raises(ApplicationError) as denied:
        await asyncio.wait_for(activities.await_node_registered(request), 5)
    assert ec2.calls == 1  # not asked again: retrying cannot grant the permission
    assert denied.value.type == errors.FORBIDDEN and denied.value.non_retryable
    assert code in denied.value.message and INSTANCE in denied.value.message


async def test_a_bug_in_the_ownership_check_fails_the_wait_at_once():
    calls = 0

    async def broken(instance_id: str) -> InstanceState:
        nonlocal calls
        calls += 1
        raise TypeError("ownership() got an unexpected keyword argument")

    activities, request = waiting_for(broken)
    with pytest.raises(ApplicationError) as failed:
        await asyncio.wait_for(activities.await_node_registered(request), 5)
    assert calls == 1
    assert failed.value.type == errors.INVALID and failed.value.non_retryable
    assert "TypeError" in failed.value.message and INSTANCE in failed.value.message


@pytest.mark.parametrize(("attempt", "looked"), [(1, 0), (2, 1)])
async def test_a_retried_wait_looks_at_ec2_at_once(attempt: int, looked: int):
    """Chaos seed 1: every attempt of the wait was cut short (429s, killed workers) before its first
    look at EC2, 30 s in, so an instance that ended was noticed three minutes late. A retry looks
    first thing; a first attempt still gives EC2 its time."""
    import dataclasses

    from temporalio.testing import ActivityEnvironment

    ec2 = ScriptedEC2("terminated")
    activities, request = waiting_for(EC2Activities(ec2, "prod").ownership)
    activities.instance_check_seconds = 30.0
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    wait = asyncio.ensure_future(env.run(activities.await_node_registered, request))
    await asyncio.sleep(0.3)
    assert ec2.calls == looked
    if looked:
        with pytest.raises(ApplicationError) as ended:
            await wait
        assert ended.value.type == errors.NOT_FOUND
    else:
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait


class OneNode:
    """The Kubernetes API with the replacement's node in a given shape."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.updates = 0

    async def find_node(self, name: str) -> dict[str, Any]:
        return self.node

    async def update_node(self, name: str, fn: Any, current: Any = None) -> dict[str, Any]:
        self.updates += 1
        fn(self.node)
        return self.node


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (
            {
                "metadata": {
                    "name": "n",
                    "annotations": {"karpflow.io/disruption-command": "interruption/c/i-1/spot"},
                },
                "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
            "held by interruption/c/i-1/spot",
        ),
        (
            {
                "metadata": {"name": "n", "deletionTimestamp": "2026-12-01T21:19:14Z"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
            "is being deleted",
        ),
    ],
)
async def test_a_ready_replacement_that_is_going_away_is_not_initialized(node: dict[str, Any], why: str):
    """Chaos seed 5: a spot interruption took the Drifted batch node's replacement while it booted; it
    turned Ready in the moment before its deletion, was counted as initialized, and the candidate's
    pods were drained onto a node that was gone a second later."""
    from api.activity_io import InitializationRequest

    kube = OneNode(node)
    activities = KubernetesActivities(kube, poll_interval=0.001)  # type: ignore[arg-type]
    with pytest.raises(ApplicationError) as leaving:
        await asyncio.wait_for(activities.await_node_initialized(InitializationRequest(node="n")), 5)
    assert leaving.value.type == errors.NOT_FOUND and why in leaving.value.message
    assert kube.updates == 0  # not labelled initialized

    kube = OneNode(
        {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    await asyncio.wait_for(
        KubernetesActivities(kube, poll_interval=0.001).await_node_initialized(  # type: ignore[arg-type]
            InitializationRequest(node="n")
        ),
        5,
    )
    assert kube.updates == 1
