"""What `karpflow rollout` and the RolloutWorkflow speak: its input (also what a continue-as-new
carries), its activities' requests, and the progress its `status` query and memo show."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

RolloutPhase = Literal["Marking", "Rolling", "Succeeded", "Canceling", "Canceled", "Failed"]

# A label key (optional DNS prefix) and value as Kubernetes accepts them; anything else would make
# the activity's label selector mean something else (a comma or `!` in it).
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def parse_selector(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (what `--selector` takes) as a dict; ValueError names the bad term."""
    found: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, equals, value = term.partition("=")
        if not equals or not key:
            raise ValueError(f"selector term {term!r} is not key=value")
        found[key.strip()] = value.strip()
    return found


class RolloutNode(BaseModel):
    """A node the rollout replaces, pinned to its UID (a node name is not an identity)."""

    name: str
    uid: str


class RolloutInput(BaseModel):
    """The RolloutWorkflow's input. `nodes` is None until the nodes are marked; a continue-as-new
    carries the nodes still present (and `total`), so the marking is never done twice."""

    model_config = ConfigDict(extra="forbid")

    cluster: str = Field(min_length=1)
    nodepool: str = Field(min_length=1)
    selector: dict[str, str] = Field(default_factory=dict)
    requested_at: datetime
    requested_by: str = Field(default="", max_length=200)
    poll_interval: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
    polls_per_run: int = Field(default=200, ge=1, description="polls before a continue-as-new")
    nodes: list[RolloutNode] | None = None
    total: int = Field(default=0, ge=0)
    notify: bool = Field(default=False, description="tell the operator's webhook when the rollout finished")

    @field_validator("selector")
    @classmethod
    def _labels(cls, selector: dict[str, str]) -> dict[str, str]:
        for key, value in selector.items():
            if not _LABEL_KEY.match(key):
                raise ValueError(f"{key!r} is not a label key")
            if not _LABEL_VALUE.match(value):
                raise ValueError(f"{value!r} (label {key}) is not a label value")
        return selector


class MarkRequest(BaseModel):
    rollout_id: str
    nodepool: str
    selector: dict[str, str] = Field(default_factory=dict)
    requested_at: datetime


class RemainingRequest(BaseModel):
    rollout_id: str
    nodepool: str
    nodes: list[RolloutNode]


class UnmarkRequest(BaseModel):
    """`nodes` None: every node of the pool that carries this rollout's mark (a cancel that came
    while the marking ran, before the workflow knew its nodes)."""

    rollout_id: str
    nodepool: str
    nodes: list[RolloutNode] | None = None


class RolloutStatus(BaseModel):
    """Progress: `replaced` = nodes marked at the start that are gone now."""

    rollout_id: str = ""
    nodepool: str = ""
    selector: dict[str, str] = Field(default_factory=dict)
    requested_at: datetime | None = None
    phase: RolloutPhase = "Marking"
    total: int = 0
    replaced: int = 0
    remaining: list[str] = Field(default_factory=list, description="names of the nodes still to go")
    message: str = ""
