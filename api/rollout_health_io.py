"""The rollout gate's boundary: what the RolloutWorkflow asks `check_wave_health` after (and while)
a wave replaces nodes, and what it answers (activities/rollout_health.py).

The gate judges the wave by Kubernetes itself: the pool's nodes created since the wave began (the
replacements, launched from the new target), the pods on them, and the pods created since then that
nothing has placed. Healthy: every such node Ready (and still Ready), every pod on them Ready, no
container restarted more than `max_restarts` times, no displaced pod pending past `ready_timeout`,
and the Prometheus query (if any) at or below its threshold. Failed names each reason. Waiting: not
decided yet (a node or pod still inside `ready_timeout`, Prometheus not answering)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from api.rollout_io import RolloutNode
from api.rollout_policy import RolloutPolicy

Verdict = Literal["Healthy", "Waiting", "Failed"]


class WaveHealthRequest(BaseModel):
    rollout_id: str
    nodepool: str
    since: datetime = Field(description="when the wave began: the pool's nodes created since are its own")
    policy: RolloutPolicy
    soak_started: datetime | None = Field(
        default=None, description="when the soak began (None: the wave still replaces nodes)"
    )


class WaveHealth(BaseModel):
    verdict: Verdict
    reasons: list[str] = Field(default_factory=list, description="why Failed or Waiting, one line each")
    nodes: list[RolloutNode] = Field(default_factory=list, description="the new nodes judged")
    ready_nodes: int = 0
    pods: int = Field(default=0, description="pods judged on the new nodes")
    checked_at: datetime | None = None
