"""send_notification (activities/notifications.py) against a real HTTP server on localhost: the
webhook URL read from the Secret, Slack's payload, and which failures are retried."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from aiohttp import web
from temporalio.exceptions import ApplicationError

from activities.notifications import NotificationActivities
from api.notifications import Notification
from kube.client import KubeError

NOTE = Notification(
    event="ApprovalPending",
    workflow_id="disruption/c/default/Underutilized/abc",
    text="Underutilized command awaits approval",
    nodes=["ip-10-0-1-7"],
)


class SecretKube:
    """The one call the activity makes to Kubernetes: GET the Secret."""

    def __init__(self, data: dict[str, str] | None) -> None:
        self.data = data
        self.paths: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.paths.append(path)
        if self.data is None:
            raise KubeError(404, "Not Found", "secrets not found")
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in self.data.items()}}


@pytest.fixture
async def aiohttp_server_factory():
    runners: list[web.AppRunner] = []

    async def start(status: int = 200) -> tuple[str, list[dict[str, Any]]]:
        received: list[dict[str, Any]] = []

        async def hook(request: web.Request) -> web.Response:
            received.append(await request.json())
            return web.Response(status=status, text="ok" if status < 400 else "no")

        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/hook", received

    yield start
    for runner in runners:
        await runner.cleanup()


def activities(kube: SecretKube, **kw: Any) -> NotificationActivities:
    return NotificationActivities(kube, "prod-eu", secret="karpflow/webhook", **kw)  # type: ignore[arg-type]


async def test_the_message_goes_to_the_url_in_the_secret_in_slacks_shape(aiohttp_server_factory):
    url, received = await aiohttp_server_factory()
    kube = SecretKube({"url": url})
    result = await activities(kube).send_notification(NOTE)
    assert result.sent and result.status == 200
    assert received == [{"text": "[karpflow prod-eu] Underutilized command awaits approval"}]
    assert kube.paths == ["/api/v1/namespaces/karpflow/secrets/webhook"]


async def test_the_json_format_carries_every_field(aiohttp_server_factory):
    url, received = await aiohttp_server_factory()
    await activities(SecretKube({"url": url}), format="json").send_notification(NOTE)
    (body,) = received
    assert (body["event"], body["cluster"], body["nodes"]) == ("ApprovalPending", "prod-eu", ["ip-10-0-1-7"])


async def test_without_a_secret_nothing_is_sent_and_the_result_says_so():
    result = await NotificationActivities(SecretKube({}), "c").send_notification(NOTE)  # type: ignore[arg-type]
    assert not result.sent and "--notify-webhook-secret" in result.why


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(500, True), (503, True), (429, True), (400, False), (404, False)],
)
async def test_which_answers_are_retried(aiohttp_server_factory, status, retryable):
    url, received = await aiohttp_server_factory(status)
    with pytest.raises(ApplicationError) as raised:
        await activities(SecretKube({"url": url})).send_notification(NOTE)
    assert raised.value.non_retryable is not retryable and str(status) in str(raised.value)
    assert len(received) == 1


async def test_an_unreachable_webhook_is_retried():
    with pytest.raises(ApplicationError) as raised:
        await activities(SecretKube({"url": "http://127.0.0.1:9/hook"})).send_notification(NOTE)
    assert not raised.value.non_retryable and raised.value.type == "WebhookUnavailable"


@pytest.mark.parametrize(
    ("data", "why"),
    [(None, "not found"), ({"other": "x"}, "has no key 'url'"), ({"url": "slack.com/x"}, "http(s) URL")],
)
async def test_a_missing_or_bad_secret_is_the_operators_to_fix(data, why):
    with pytest.raises(ApplicationError) as raised:
        await activities(SecretKube(data)).send_notification(NOTE)
    assert raised.value.non_retryable and why in str(raised.value)
