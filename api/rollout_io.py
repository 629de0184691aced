"""What `karpflow rollout` and the RolloutWorkflow speak: its input (also what a continue-as-new
carries), its activities' requests, and the progress its `status` query and memo show."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.rollout_policy import RolloutPolicy

RolloutPhase = Literal[
    "Marking",
    "Rolling",
    "Soaking",
    "Halted",
    "Succeeded",
    "Aborted",
    "Superseded",
    "Canceling",
    "Canceled",
    "Failed",
]
# `requested`: `karpflow rollout` (the pool's nodes created before the request); `drift`: started by
# the controller for a pool with a rollout policy whose nodes drifted toward a new target.
RolloutMode = Literal["requested", "drift"]

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
    zone: str = Field(default="", description="topology.kubernetes.io/zone (zone-by-zone waves)")


class WaveState(BaseModel):
    """Where a rollout with a policy is: carried by a continue-as-new, so a rollout survives worker
    restarts and months of history. `marked` is the wave in progress (none: between waves)."""

    wave: int = Field(default=0, ge=0, description="waves begun")
    began: datetime | None = None
    marked: list[RolloutNode] = Field(default_factory=list)
    soak_started: datetime | None = None
    halted: str = Field(default="", description="why the gate failed ('' while it has not)")
    gate: list[str] = Field(default_factory=list, description="the gate's last reasons (Waiting/Failed)")
    launched: list[RolloutNode] = Field(
        default_factory=list, description="the new nodes the gate judged, every wave (abort --rollback)"
    )
    zones_done: list[str] = Field(default_factory=list, description="zones rolled (zoneByZone)")


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
    mode: RolloutMode = "requested"
    target: str = Field(default="", description="drift: the pool's target (api/hashes.py rollout_target)")
    policy: RolloutPolicy | None = Field(
        default=None, description="waves and gate (NodePool karpflow.dev/rollout-policy); None: at once"
    )
    waves: WaveState = Field(default_factory=WaveState)

    @field_validator("selector")
    @classmethod
    def _labels(cls, selector: dict[str, str]) -> dict[str, str]:
        for key, value in selector.items():
            if not _LABEL_KEY.match(key):
                raise ValueError(f"{key!r} is not a label key")
            if not _LABEL_VALUE.match(value):
                raise ValueError(f"{value!r} (label {key}) is not a label value")
        return selector


class DriftRollout(BaseModel):
    """A pass's request to start a pool's drift rollout toward a target (planner/rollout_holds.py)."""

    nodepool: str
    target: str
    policy: RolloutPolicy
    nodes: list[RolloutNode]


class MarkRequest(BaseModel):
    rollout_id: str
    nodepool: str
    selector: dict[str, str] = Field(default_factory=dict)
    requested_at: datetime
    mark: bool = Field(default=True, description="False: only list them (waves mark them one by one)")


class MarkWaveRequest(BaseModel):
    rollout_id: str
    nodepool: str
    nodes: list[RolloutNode]


class StateRequest(BaseModel):
    """`sync_rollout_state`: write the pool's `karpflow.dev/rollout-state` (drift rollouts) and record
    an Event when the phase changed; `target` '' (a requested rollout) writes no state."""

    rollout_id: str
    nodepool: str
    target: str = ""
    phase: str
    wave: int = 0
    reason: str = ""
    event: bool = Field(default=False, description="record an Event on the NodePool for this phase")


class StateAnswer(BaseModel):
    target: str = Field(description="the pool's target now ('' when it cannot be computed)")
    superseded: bool = Field(default=False, description="the pool moved on to another target")
    written: bool = False


class AbortRequest(BaseModel):
    """The `abort` signal's input: `rollback` marks the nodes the rollout launched for replacement."""

    rollback: bool = False
    by: str = Field(default="", max_length=200)


class RemainingRequest(BaseModel):
    rollout_id: str
    nodepool: str
    nodes: list[RolloutNode]
    remark: list[str] | None = Field(
        default=None,
        description="UIDs whose lost mark is written again (None: all; waves: the wave's)",
    )


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
    mode: RolloutMode = "requested"
    target: str = ""
    policy: RolloutPolicy | None = None
    wave: int = Field(default=0, description="the wave in progress or last done (0: no waves)")
    wave_nodes: list[str] = Field(default_factory=list, description="the wave's nodes still to go")
    soak_until: datetime | None = None
    gate: list[str] = Field(default_factory=list, description="the gate's last reasons")
    halted: str = Field(default="", description="why the gate halted the rollout")
