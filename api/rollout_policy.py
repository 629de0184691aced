"""A NodePool's rollout policy: waves with a health gate for drift and `karpflow rollout` (issue 35).

Written by the operator on the NodePool as JSON in one annotation, in the shape of Karpenter's own
fields (counts or percents, Go durations):

    metadata:
      annotations:
        karpflow.dev/rollout-policy: |
          {"canary": 1, "soak": "2m", "growth": 2, "zoneByZone": true, "maxRestarts": 3}

Without the annotation a pool rolls as Karpenter does (drift within the budgets, no gate). With it,
a RolloutWorkflow per change (drift: one per target, the replacement's template) marks the pool's
nodes wave by wave: the canary first, each next wave `growth` times the last (at most `maxWave`),
one zone at a time after the canary when `zoneByZone`; after each wave the gate checks the new nodes
and their pods through the soak (api/rollout_health_io.py). A failed gate halts the change for that
pool and target until the operator resumes or aborts it.

The state the planner needs (which target rolls, halted or not) is the RolloutWorkflow's, written
on the NodePool as `karpflow.dev/rollout-state` (RolloutState) so the planner stays pure and a
worker restart loses nothing.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_serializer,
    field_validator,
)

from api.duration import DurationError, format_duration, parse_duration

ROLLOUT_POLICY_ANNOTATION = "karpflow.dev/rollout-policy"
ROLLOUT_STATE_ANNOTATION = "karpflow.dev/rollout-state"

_ISO_DURATION = TypeAdapter(timedelta)
_COUNT_OR_PERCENT = re.compile(r"^(\d+)%?$")


def _count_or_percent(value: object) -> str:
    text = str(value).strip()
    if isinstance(value, bool) or not _COUNT_OR_PERCENT.match(text):
        raise ValueError(f"{value!r} is not a node count or a percent such as 10%")
    if text.endswith("%") and not 0 < int(text[:-1]) <= 100:
        raise ValueError(f"{value!r}: a percent is between 1% and 100%")
    if not text.endswith("%") and int(text) < 1:
        raise ValueError(f"{value!r}: a wave holds at least one node")
    return text


CountOrPercent = Annotated[str, Field(description="a node count (3) or a percent of the pool (10%)")]


def resolve_count(value: str, total: int) -> int:
    """Nodes meant by `value` among `total` (a percent rounds up, as Karpenter's budgets do)."""
    if value.endswith("%"):
        return max(1, math.ceil(total * int(value[:-1]) / 100))
    return int(value)


class PrometheusCheck(BaseModel):
    """An extra gate for users who have Prometheus: the gate fails when the query's first sample is
    above `max` (an instant query against `<url>/api/v1/query`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    url: str = Field(pattern=r"^https?://", description="Prometheus base URL")
    query: str = Field(min_length=1)
    max: float = Field(description="highest healthy value")


class RolloutPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    canary: CountOrPercent = "1"
    soak: timedelta = Field(
        default=timedelta(minutes=5), description="how long each wave's nodes must stay healthy"
    )
    growth: float = Field(default=2.0, ge=1.0, le=100.0, description="next wave = last wave x growth")
    max_wave: CountOrPercent | None = Field(default=None, alias="maxWave")
    zone_by_zone: bool = Field(default=False, alias="zoneByZone")
    max_restarts: int = Field(
        default=3, ge=0, alias="maxRestarts", description="container restarts on a new node that fail it"
    )
    ready_timeout: timedelta = Field(
        default=timedelta(minutes=10),
        alias="readyTimeout",
        description="how long a new node, its pods, or a displaced pending pod may take to be Ready",
    )
    prometheus: PrometheusCheck | None = None

    @field_validator("canary", "max_wave", mode="before")
    @classmethod
    def _counts(cls, value: object) -> str | None:
        return None if value is None else _count_or_percent(value)

    @field_validator("soak", "ready_timeout", mode="before")
    @classmethod
    def _durations(cls, value: object) -> timedelta:
        if isinstance(value, timedelta):
            return value
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"{value!r} is not a duration such as 2m")
        if isinstance(value, str) and value.startswith("P"):
            return _ISO_DURATION.validate_python(value)  # pydantic's own JSON form, from an older dump
        try:
            found = parse_duration(value)
        except DurationError as err:
            raise ValueError(str(err)) from None
        if found < timedelta(0):
            raise ValueError(f"{value!r} is negative")
        return found

    @field_serializer("soak", "ready_timeout")
    def _go_durations(self, value: timedelta) -> str:
        # As the user writes them (and as the validator reads them back): 2m, not PT2M.
        return format_duration(value)

    def wave_sizes(self, total: int) -> list[int]:
        """How many nodes each wave takes of a change of `total` nodes, zones aside."""
        sizes: list[int] = []
        cap = resolve_count(self.max_wave, total) if self.max_wave else total
        size = min(resolve_count(self.canary, total), total, cap)
        left = total
        while left > 0:
            take = min(size, left)
            sizes.append(take)
            left -= take
            size = min(max(size + 1, math.ceil(size * self.growth)) if self.growth > 1 else size, cap)
        return sizes


class PolicyError(ValueError):
    """The annotation is not a valid policy: the text says where."""


def parse_policy(text: str | None) -> RolloutPolicy | None:
    """The policy an annotation holds (None: no annotation). PolicyError names what is wrong."""
    if text is None or not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        where = f"{err.msg} at column {err.colno}"
        raise PolicyError(f"{ROLLOUT_POLICY_ANNOTATION} is not JSON: {where}") from None
    if not isinstance(raw, dict):
        raise PolicyError(f"{ROLLOUT_POLICY_ANNOTATION} must be a JSON object")
    try:
        return RolloutPolicy.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'policy'}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        )
        raise PolicyError(f"{ROLLOUT_POLICY_ANNOTATION}: {problems}") from None


RolloutStatePhase = Literal["Rolling", "Soaking", "Halted", "Aborted", "Succeeded", "Superseded"]


class RolloutState(BaseModel):
    """What the NodePool's `karpflow.dev/rollout-state` says: the newest rollout of the pool."""

    model_config = ConfigDict(extra="ignore")

    rollout_id: str = Field(alias="id")
    target: str = ""
    phase: RolloutStatePhase
    wave: int = 0
    reason: str = ""
    at: datetime | None = None

    def annotation(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)


def parse_state(text: str | None) -> RolloutState | None:
    """The state an annotation holds; None when absent or unreadable (a hand edit): the planner then
    starts the target's rollout again, whose deterministic id makes that a no-op if it runs."""
    if not text:
        return None
    try:
        return RolloutState.model_validate_json(text)
    except ValidationError:
        return None
