"""MaintenanceWindow (karpflow.dev/v1alpha1, cluster-scoped): while it is active, karpflow takes none
of its `actions` on the nodes its `selector` matches.

    apiVersion: karpflow.dev/v1alpha1
    kind: MaintenanceWindow
    metadata:
      name: business-hours
    spec:
      mode: Block                # Block (default): blocks while a schedule is active;
                                 # Allow: allows only while a schedule is active
      timeZone: Europe/Berlin    # IANA zone of the schedules' cron (default UTC)
      schedules:                 # cron (5 fields or @macro) + duration; none: always active
        - cron: "0 9 * * 1-5"
          duration: 8h
      exclusions:                # one-off periods that block, in either mode
        - start: "2026-11-26T00:00:00-05:00"
          end: "2026-11-30T23:59:00-05:00"
          reason: Black Friday freeze
      actions: [Consolidation, Drift]
      selector:                  # node selector requirements; none: every node
        - key: karpenter.sh/nodepool
          operator: In
          values: [default]

The object of the v1 deprovisioning proposal (docs/operator-controls.md says what each field means
and how windows combine). This module is the wire shape only; the schema in
deploy/crds/maintenancewindows.karpflow.dev.yaml says the same, and planner/maintenance_windows.py
decides what a window blocks, also for an object that does not fit this shape.
"""

from __future__ import annotations

from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AwareDatetime, Field, field_validator, model_validator

from api.conditions import ControlStatus
from api.cron import cron_expression
from api.duration import parse_duration
from api.nodepool import KubeModel, NodeSelectorRequirement, ObjectMeta

# What a window can block. Interruption is not among them: a spot instance goes in two minutes
# whatever a window says. Rebalance is the interruption handler's proactive replacement.
WINDOW_ACTIONS = ("Expiration", "Drift", "Emptiness", "Consolidation", "Rebalance", "Repair")
WindowAction = Literal["Expiration", "Drift", "Emptiness", "Consolidation", "Rebalance", "Repair"]


class WindowSchedule(KubeModel):
    """Active from each cron hit for `duration`."""

    cron: str
    duration: str

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        cron_expression(value)  # raises ValueError naming what is wrong
        return value

    @field_validator("duration")
    @classmethod
    def _positive_duration(cls, value: str) -> str:
        if parse_duration(value).total_seconds() <= 0:
            raise ValueError(f"duration {value!r}: must be longer than 0s")
        return value


class WindowExclusion(KubeModel):
    """A one-off period (RFC 3339 times with their offset) during which the window blocks."""

    start: AwareDatetime
    end: AwareDatetime
    reason: str = ""

    @model_validator(mode="after")
    def _ends_after_start(self) -> WindowExclusion:
        if self.end <= self.start:
            raise ValueError(
                f"exclusion end {self.end.isoformat()} is not after its start {self.start.isoformat()}"
            )
        return self


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; ValueError when the tz database does not know it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"timeZone {name!r}: not an IANA time zone (e.g. Europe/Berlin, UTC)") from err


class MaintenanceWindowSpec(KubeModel):
    # Block: active (blocking) while a schedule is; Allow: allows only while a schedule is.
    mode: Literal["Block", "Allow"] = "Block"
    time_zone: str = "UTC"
    schedules: list[WindowSchedule] = Field(default_factory=list)
    exclusions: list[WindowExclusion] = Field(default_factory=list)
    actions: list[WindowAction] = Field(min_length=1)
    selector: list[NodeSelectorRequirement] = Field(default_factory=list)

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone(value)
        return value

    @model_validator(mode="after")
    def _allow_needs_schedules(self) -> MaintenanceWindowSpec:
        if self.mode == "Allow" and not self.schedules:
            raise ValueError("mode Allow needs at least one schedule (it allows only while one is active)")
        return self


class MaintenanceWindow(KubeModel):
    api_version: Literal["karpflow.dev/v1alpha1"] = "karpflow.dev/v1alpha1"
    kind: Literal["MaintenanceWindow"] = "MaintenanceWindow"
    metadata: ObjectMeta
    spec: MaintenanceWindowSpec
    status: ControlStatus = Field(default_factory=ControlStatus)

    @property
    def name(self) -> str:
        return self.metadata.name
