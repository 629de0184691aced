"""`send_notification`: POST one Notification to the operator's webhook (issue 35 item 4).

The webhook URL is a secret (a Slack URL is a credential), so it is read from a Kubernetes Secret
(`--notify-webhook-secret NAMESPACE/NAME`, key `--notify-webhook-key`, default `url`) at each send:
rotating the Secret needs no restart. Without a configured Secret nothing is sent and the activity
says so. Idempotence: a retry may deliver a message twice (webhooks have no idempotency key); the
caller's NotificationWorkflow sends each notification once otherwise.

Errors: a missing Secret or key and a URL that is not http(s) are the operator's to fix
(non-retryable: retrying changes nothing); a connection failure, a timeout, 429 and 5xx are
retryable; another 4xx is non-retryable (the webhook refuses this payload).
"""

from __future__ import annotations

import base64
from typing import Literal

import aiohttp
from temporalio import activity

from activities.errors import classify_kube, not_found, permanent, retryable
from api.notifications import Notification, NotificationResult
from kube.client import KubeApi

WEBHOOK_TIMEOUT = aiohttp.ClientTimeout(total=15)
MISCONFIGURED = "NotificationMisconfigured"


class NotificationActivities:
    def __init__(
        self,
        kube: KubeApi,
        cluster: str,
        *,
        secret: str | None = None,
        key: str = "url",
        format: Literal["slack", "json"] = "slack",
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.secret = secret
        self.key = key
        self.format: Literal["slack", "json"] = format

    async def _url(self) -> str:
        assert self.secret is not None
        namespace, _, name = self.secret.partition("/")
        try:
            secret = await self.kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except Exception as err:
            if not_found(err):
                raise permanent(f"webhook Secret {self.secret} not found", MISCONFIGURED) from None
            raise classify_kube(err, f"read webhook Secret {self.secret}") from err
        encoded = (secret.get("data") or {}).get(self.key)
        if not encoded:
            raise permanent(f"webhook Secret {self.secret} has no key {self.key!r}", MISCONFIGURED)
        url = base64.b64decode(encoded).decode().strip()
        if not url.startswith(("https://", "http://")):
            raise permanent(f"webhook Secret {self.secret}: {self.key} is not an http(s) URL", MISCONFIGURED)
        return url

    @activity.defn(name="send_notification")
    async def send_notification(self, notification: Notification) -> NotificationResult:
        if not self.secret:
            return NotificationResult(sent=False, why="no webhook configured (--notify-webhook-secret)")
        url = await self._url()
        body = notification.payload(self.format, self.cluster)
        try:
            async with (
                aiohttp.ClientSession(timeout=WEBHOOK_TIMEOUT) as session,
                session.post(url, json=body) as response,
            ):
                status, text = response.status, (await response.text())[:200]
        except (TimeoutError, aiohttp.ClientError) as err:
            why = str(err) or type(err).__name__
            raise retryable(f"webhook unreachable: {why}", "WebhookUnavailable") from None
        if status == 429 or status >= 500:
            raise retryable(f"webhook answered {status}: {text}", "WebhookUnavailable")
        if status >= 400:
            raise permanent(f"webhook refused the notification ({status}): {text}", "WebhookRefused")
        return NotificationResult(sent=True, status=status)
