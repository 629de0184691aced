"""What karpflow tells operators on its webhook (docs/operator-controls.md "Notifications"): the
payload a workflow hands to its NotificationWorkflow, and the JSON the webhook receives."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

NotifyEvent = Literal["ApprovalPending", "CommandFailed", "DrainStuck", "RolloutFinished", "RolloutHalted"]
NOTIFY_EVENTS: tuple[str, ...] = (
    "ApprovalPending",
    "CommandFailed",
    "DrainStuck",
    "RolloutFinished",
    "RolloutHalted",
)


class Notification(BaseModel):
    event: NotifyEvent
    workflow_id: str = Field(description="the workflow the notification is about")
    text: str = Field(description="one line for people: what happened and what to do")
    nodes: list[str] = Field(default_factory=list)
    nodepool: str = ""
    details: dict[str, str] = Field(default_factory=dict)

    def payload(self, format: Literal["slack", "json"], cluster: str) -> dict[str, Any]:
        """The webhook's body: Slack's incoming-webhook shape (`text`, which Mattermost, Teams'
        Slack-compatible connectors and Discord's /slack endpoint read too), or karpflow's JSON."""
        text = f"[karpflow {cluster}] {self.text}"
        if format == "slack":
            return {"text": text}
        return {"text": text, "cluster": cluster, **self.model_dump(mode="json")}


class NotificationResult(BaseModel):
    sent: bool
    status: int = 0
    why: str = Field(default="", description="why nothing was sent (no webhook configured)")
