"""MaintenanceWindows: which windows match a node, and whether an action on it is blocked at a time,
and until when (docs/operator-controls.md).

Rules:
- A window matches a node when every requirement of its `selector` does (no selector: every node).
- A schedule is active from each cron hit for `duration` (elapsed time), exactly as a scheduled
  NodePool budget. The cron is read in the window's `timeZone` (IANA, default UTC), with cron(8)'s
  rules at a daylight-saving change: a wall-clock time the change skips opens the window when the
  clocks jump (02:30 on a spring-forward night opens at 03:00), one it repeats opens it once, at its
  first occurrence.
- A window blocks (is "active") in mode Block while any of its schedules is active, and in mode
  Allow while none is; in both modes during each of its one-off `exclusions` (start to end). A Block
  window without schedules or exclusions is always active: that is how a pause is written as an
  object.
- An active window blocks its `actions` on the nodes it matches. A disruption proceeds only if every
  matching window allows its action (AND, as the v1 deprovisioning proposal says): the action is
  blocked until the last of the windows blocking it closes (windows that overlap or follow each
  other without a gap are one block).
- A window that does not fit its schema (a bad cron or time zone, an unknown action, a selector
  that cannot be read) fails closed: always active, for every node when its selector cannot be
  read, and for every action when its actions cannot be read or name an unknown one. It is reported
  as a problem.

The actions of karpflow's methods: emptiness → Emptiness, drift → Drift, multi- and single-node
consolidation → Consolidation, expiration → Expiration, repair → Repair. Rebalance belongs to the
interruption handler; interruption itself is never blocked.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter
from pydantic import ValidationError

from api.constants import NODEPOOL_LABEL
from api.cron import cron_expression
from api.duration import parse_duration
from api.maintenance_window import WINDOW_ACTIONS, MaintenanceWindow, zone
from kube.selectors import Requirement
from kube.times import rfc3339

ALL_ACTIONS = frozenset(WINDOW_ACTIONS)
# The budget reason of a planner method's commands -> the window action that covers it.
ACTION_OF_REASON = {"Empty": "Emptiness", "Underutilized": "Consolidation", "Drifted": "Drift"}
# How far ahead "until when" is worked out; a block that lasts longer is reported as indefinite.
HORIZON = timedelta(days=366)
UTC_ZONE = ZoneInfo("UTC")


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: cheap keys for the caches below
class Window:
    """A MaintenanceWindow as the planner applies it (fail-closed when the object is broken).
    "Active" means blocking its actions, in either mode."""

    name: str
    actions: frozenset[str]
    # None: every node (no selector, or one that cannot be read).
    selector: tuple[Requirement, ...] | None
    # (five-field cron, duration); empty: always active (mode Block without exclusions).
    schedules: tuple[tuple[str, timedelta], ...]
    problems: tuple[str, ...] = ()
    # Not an object but an operator's pause of the controller (what it covers, by whom, why):
    # always active until resumed (`pause_window`).
    pause: str = ""
    # Mode Allow: blocks while no schedule is active.
    allow: bool = False
    # The zone the cron is read in.
    zone: ZoneInfo = UTC_ZONE
    # One-off (start, end) periods that block, in either mode.
    exclusions: tuple[tuple[datetime, datetime], ...] = ()
    # Not an object but the open cluster-health breaker (planner/health_breaker.py), described:
    # always active while the pass finds the cluster sick.
    breaker: str = ""

    @property
    def broken(self) -> bool:
        return bool(self.problems)

    @property
    def mode(self) -> str:
        return "Allow" if self.allow else "Block"

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.selector is None or all(r.matches(labels) for r in self.selector)

    def active_at(self, when: datetime) -> bool:
        return _active_at(self, _utc(when))

    @property
    def _always(self) -> bool:
        return self.broken or not (self.schedules or self.exclusions or self.allow)

    def active_end(self, when: datetime) -> datetime | None:
        """While active at `when` through a schedule, an exclusion or (mode Allow) the wait for a
        schedule: when that stretch ends (the windows' chaining continues from there). None when not
        active that way (see `active_at`)."""
        return _active_end(self, _utc(when))

    def next_start(self, when: datetime) -> datetime | None:
        """When the window next becomes active after `when`, while it is not (None: always active,
        or nothing ahead)."""
        if self._always:
            return None
        when = _utc(when)
        starts = [start for start, _ in self.exclusions if start > when]
        if self.allow:
            allowed_until = _allowed_until(self, when)
            if allowed_until is not None:
                starts.append(allowed_until)
        else:
            hits = (next_hit(cron, when, self.zone) for cron, _ in self.schedules)
            starts += [hit for hit in hits if hit is not None]
        return min(starts, default=None)


@dataclass(frozen=True)
class WindowBlock:
    """Windows that block `action` on a node at a time, and when the block ends. `until` is None
    when it does not end by itself: a window without schedule (`unscheduled`), a broken one
    (`broken`), or schedules that follow each other without a gap for more than a year."""

    action: str
    windows: tuple[str, ...]
    until: datetime | None
    broken: tuple[str, ...] = ()
    unscheduled: tuple[str, ...] = ()
    paused: tuple[str, ...] = ()  # the pauses among them, described
    breaker: str = ""  # the open cluster-health breaker among them, described

    def ends(self) -> str:
        """When the block ends, for people: a time, or what has to happen first."""
        if self.paused:
            return "when resumed (karpflow resume)"
        if self.breaker:
            return "when the cluster recovers (cluster-health breaker)"
        if self.broken:
            return f"when {', '.join(self.broken)} {'is' if len(self.broken) == 1 else 'are'} fixed (invalid)"
        if self.unscheduled:
            which = ", ".join(self.unscheduled)
            return f"when {which} {'is' if len(self.unscheduled) == 1 else 'are'} deleted (no schedule)"
        if self.until is None:
            return "not within a year (its schedules leave no gap)"
        return rfc3339(self.until)

    def message(self) -> str:
        if self.paused:
            return f"paused ({'; '.join(self.paused)}): {self.action} waits until resumed"
        if self.breaker:
            waits = f"{self.action} waits until the cluster recovers"
            return f"cluster-health breaker open ({self.breaker}): {waits}"
        noun = "MaintenanceWindow" if len(self.windows) == 1 else "MaintenanceWindows"
        ends = self.ends()
        until = f"until {ends}" if self.until is not None else ends.replace("when ", "until ", 1)
        if self.until is None and not (self.broken or self.unscheduled):
            until = "for more than a year (its schedules leave no gap)"
        return f"{noun} {', '.join(self.windows)} blocks {self.action} {until}"


@functools.lru_cache(maxsize=4096)
def _active_at(window: Window, when: datetime) -> bool:
    if window._always or any(start <= when < end for start, end in window.exclusions):
        return True
    in_schedule = _schedule_end(window, when) is not None
    return not in_schedule if window.allow else in_schedule


@functools.lru_cache(maxsize=4096)
def _active_end(window: Window, when: datetime) -> datetime | None:
    # A pass asks this for every candidate and method at the same instant: cron arithmetic once.
    ends = [end for start, end in window.exclusions if start <= when < end]
    if window.allow:
        if _schedule_end(window, when) is None:  # outside every schedule: blocked until the next hit
            hits = [hit for cron, _ in window.schedules if (hit := next_hit(cron, when, window.zone))]
            if hits:
                ends.append(min(hits))
    elif (end := _schedule_end(window, when)) is not None:
        ends.append(end)
    return max(ends) if ends else None


def _schedule_end(window: Window, when: datetime) -> datetime | None:
    """The latest end of the window's schedules active at `when` (None: none is)."""
    ends = []
    for cron, duration in window.schedules:
        hit = last_hit(cron, when, window.zone)
        if hit is not None and when < hit + duration:
            ends.append(hit + duration)
    return max(ends) if ends else None


def _allowed_until(window: Window, when: datetime) -> datetime | None:
    """Mode Allow: when the schedules active at `when` stop allowing (following schedules that
    chain without a gap), or None when none is active."""
    end = _schedule_end(window, when)
    for _ in range(1000):
        if end is None or end - when > HORIZON:
            return end
        following = _schedule_end(window, end)
        if following is None:
            return end
        end = following
    return end


def last_hit(cron: str, when: datetime, tz: ZoneInfo = UTC_ZONE) -> datetime | None:
    """The latest cron hit at or before `when` (cron hits fall on whole minutes), the cron read in
    `tz`; a wall-clock time a daylight-saving change repeats counts once, at its first occurrence."""
    local = _utc(when).astimezone(tz)
    start = local.replace(second=0, microsecond=0) + timedelta(minutes=1)
    try:
        hit: datetime = croniter(cron, start).get_prev(datetime)
    except (ValueError, KeyError):  # a date croniter cannot go back to (e.g. 30 February only)
        return None
    if _repeated(hit):
        hit = hit.replace(fold=0)  # the first occurrence, an hour earlier
    return hit.astimezone(UTC)


def next_hit(cron: str, when: datetime, tz: ZoneInfo = UTC_ZONE) -> datetime | None:
    """The first cron hit after `when`, the cron read in `tz` (a repeated wall-clock time once)."""
    iterator = croniter(cron, _utc(when).astimezone(tz))
    try:
        for _ in range(3):
            hit: datetime = iterator.get_next(datetime)
            if not _repeated(hit):
                return hit.astimezone(UTC)
    except (ValueError, KeyError):
        return None
    return None


def _repeated(hit: datetime) -> bool:
    """Whether `hit` is the second occurrence of a wall-clock time (the hour a change to winter
    time repeats)."""
    return hit.fold == 1 and hit.replace(fold=0).utcoffset() != hit.utcoffset()


def schedule_active(cron: str, duration: timedelta, when: datetime) -> bool:
    """Whether a schedule is active at `when`: its latest cron hit lies within `duration` (the rule
    of scheduled NodePool budgets too, which are UTC)."""
    hit = last_hit(cron, _utc(when))
    return hit is not None and _utc(when) < hit + duration


def _utc(when: datetime) -> datetime:
    return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)


def windows_for(
    windows: Iterable[Window], action: str, labels: Mapping[str, str], when: datetime
) -> list[Window]:
    """The windows that block `action` on a node with `labels` at `when`."""
    return [w for w in windows if action in w.actions and w.matches(labels) and w.active_at(when)]


def blocked(
    windows: Iterable[Window], action: str, labels: Mapping[str, str], when: datetime
) -> WindowBlock | None:
    """Whether `action` is blocked on a node with `labels` at `when`, by what and until when."""
    blocking = [w for w in windows if action in w.actions]
    # Activity does not depend on the node (and is cached): look at labels only when something is on.
    if not any(w.active_at(when) for w in blocking):
        return None
    relevant = tuple(w for w in blocking if w.matches(labels))
    active = [w for w in relevant if w.active_at(when)]
    if not active:
        return None
    return WindowBlock(
        action,
        tuple(sorted(w.name for w in active)),
        _block_end(relevant, _utc(when)),
        tuple(sorted(w.name for w in active if w.broken)),
        tuple(
            sorted(
                w.name
                for w in active
                if not w.broken and not w.schedules and not w.exclusions and not w.pause and not w.breaker
            )
        ),
        tuple(sorted(w.pause for w in active if w.pause)),
        "; ".join(w.breaker for w in active if w.breaker),
    )


@functools.lru_cache(maxsize=1024)
def _block_end(relevant: tuple[Window, ...], when: datetime) -> datetime | None:
    """When no relevant window is active any more, following windows that chain without a gap
    (nodes matched by the same windows share the answer: cached). None: a window active with no end
    of its own (always active, or an Allow window none of whose schedules comes again)."""
    end = when
    for _ in range(1000):
        if end - when > HORIZON:
            break
        active = [w for w in relevant if w.active_at(end)]
        if not active:
            return end
        ends = [w.active_end(end) for w in active]
        if any(stop is None for stop in ends):
            return None
        end = max(stop for stop in ends if stop is not None)
    return None


def pause_window(
    name: str, description: str, action: str | None = None, nodepool: str | None = None
) -> Window:
    """An operator's pause of the controller as a window of the pass: every action (or one), on every
    node (or a NodePool's), until resumed. Blocked reasons and soft expiration come with it."""
    selector = (Requirement(NODEPOOL_LABEL, "In", frozenset({nodepool})),) if nodepool else None
    actions = frozenset({action}) if action else ALL_ACTIONS
    return Window(name=name, actions=actions, selector=selector, schedules=(), pause=description)


# --- Reading the object (fail closed) -------------------------------------------------------------


def read_window(raw: Mapping[str, Any]) -> Window:
    """The window an object describes. An object that does not fit the schema gives a window that
    fails closed, with its problems (never raises)."""
    name = _name(raw)
    try:
        model = MaintenanceWindow.model_validate(raw)
    except ValidationError as err:
        return _broken(name, raw, [_message(e) for e in err.errors()])
    spec = model.spec
    return Window(
        name=name,
        actions=frozenset(spec.actions),
        selector=tuple(Requirement(r.key, r.operator, frozenset(r.values)) for r in spec.selector) or None,
        schedules=tuple((cron_expression(s.cron), parse_duration(s.duration)) for s in spec.schedules),
        allow=spec.mode == "Allow",
        zone=zone(spec.time_zone),
        exclusions=tuple((_utc(e.start), _utc(e.end)) for e in spec.exclusions),
    )


def _broken(name: str, raw: Mapping[str, Any], problems: list[str]) -> Window:
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    actions = spec.get("actions")
    if isinstance(actions, list) and actions and all(a in ALL_ACTIONS for a in actions):
        blocked_actions = frozenset(actions)
    else:  # unreadable, empty or naming an unknown action: we cannot tell what it protects
        blocked_actions = ALL_ACTIONS
    selector: tuple[Requirement, ...] | None = None
    raw_selector = spec.get("selector")
    if isinstance(raw_selector, list):
        try:
            selector = (
                tuple(Requirement.from_dict(r, f"spec.selector[{i}]") for i, r in enumerate(raw_selector))
                or None
            )
        except (ValueError, AttributeError):
            selector = None  # every node
    return Window(name, blocked_actions, selector, (), tuple(problems))


def _name(raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return str(name) if name else "<no name>"


def _message(error: Any) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    text = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"{where}: {text}" if where else text
