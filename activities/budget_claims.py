"""NodeDisruptionBudget claims: the one place where "may this node go down now?" is decided for every
worker at once (docs/operator-controls.md).

The planner reads budgets from the worker's cache, which lags, and several workers (and the
node-deletion watcher, and a person with `temporal workflow start`) act at the same time. So a
termination that a budget governs claims its nodes in the budget's own status before its first
change (`claim`), and a claim is granted only while the budget's unavailable nodes plus its claims
stay within what it allows:

- the claim is written read-modify-write on the NodeDisruptionBudget's status with its
  resourceVersion, so two writers that read the same version cannot both take the last slot (the
  second gets 409 Conflict, reads again and counts the first's claim);
- unavailable is what the cluster shows now: selected nodes NotReady or carrying a
  disruption taint, either controller's (`karpenter.sh/disrupted`, or karpflow's own
  `karpflow.dev/disrupted` beside Karpenter: draining, or held by a command), plus the budget's
  claims; the planner's rule (kube/disruption.py), but for a node that is only deleting (a
  `kubectl delete node` whose termination waits here): it is not down yet, its pods still run, and
  counting it would make two deletions wait for each other for ever;
- a node already unavailable (NotReady, tainted, claimed by the same holder) is granted at once, so
  a retry, or the repair of a node that is already down, never waits;
- when several budgets select a node, they are claimed in name order, and a refusal releases the
  claims already taken (never holding one while waiting for another: no deadlock);
- claims are released when the node's termination ends (`remove_finalizer`; beside Karpenter, once
  Karpenter is done with a node handed to it: activities/nodeclaims.py `await_karpenter_termination`),
  when a command rolls back (`untaint_disrupted`), and by the controller's sweep when their node is
  gone or their holder stopped before tainting it (`sweep`).

The nodes come from the worker's informer cache (cluster/reads.py; the API server without one): a
claim attempt, a gate poll and the sweep each read every Node, a full LIST per call at 10,000 nodes.
The claims themselves, the one thing two writers race on, are read and written on the budget's
resourceVersion. What the cache may not show yet is a node that went NotReady or was tainted within
one watch delay; every disruption karpflow starts claims before it taints, so only a change from
outside (a kubelet, Karpenter) can be that late, and it is counted by the next claim.

A budget whose spec is broken allows nothing for the nodes it selects (planner/node_disruption_budgets.py
reads it, failing closed); a cluster without the CRD has no budgets.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from api.constants import KARPFLOW_GROUP, KARPFLOW_VERSION
from api.node_disruption_budget import BudgetClaim
from cluster.reads import ClusterReads
from kube.client import Json, KubeApi, KubeError
from kube.disruption import RawNodeState, is_disrupting, raw_disruption_taint
from kube.times import rfc3339
from planner.node_disruption_budgets import Ndb, read_ndb

PLURAL = "nodedisruptionbudgets"
ATTEMPTS = 8


@dataclass(frozen=True)
class Denied:
    """A budget that has no room: its name and why, for the refusal, the Event and the status query."""

    budget: str
    message: str
    allowed: int
    unavailable: int


# -- reading nodes as budgets see them ----------------------------------------------------------------


def _meta(obj: Json) -> Json:
    return obj.get("metadata") or {}


def name_of(obj: Json) -> str:
    return str(_meta(obj).get("name") or "")


def labels_of(node: Json) -> dict[str, str]:
    return dict(_meta(node).get("labels") or {})


def is_tainted(node: Json) -> bool:
    """A disruption in flight holds it (either controller's taint)."""
    return raw_disruption_taint(node) is not None


def is_down(node: Json) -> bool:
    """Unavailable by the cluster's own state: NotReady, or tainted by a disruption (draining or held);
    a node only deleting is not (kube/disruption.py `is_disrupting`)."""
    return is_disrupting(RawNodeState.of(node), counting_deleting=False)


def _claims(obj: Json) -> list[BudgetClaim]:
    status = obj.get("status")
    if not isinstance(status, dict):
        status = {}
    out = []
    for item in status.get("claims") or ():
        try:
            out.append(BudgetClaim.model_validate(item))
        except ValueError:
            continue  # unreadable: dropped at the next write
    return out


def _live(claims: list[BudgetClaim], nodes: dict[str, Json]) -> list[BudgetClaim]:
    """The claims whose node still exists (the same incarnation when the claim names its UID)."""
    out = []
    for claim in claims:
        node = nodes.get(claim.node)
        if node is not None and (not claim.uid or _meta(node).get("uid") == claim.uid):
            out.append(claim)
    return out


def _wire(claims: list[BudgetClaim]) -> list[Json]:
    return [c.to_wire() for c in claims]


# -- the API calls --------------------------------------------------------------------------------------


async def budgets(kube: KubeApi, reads: ClusterReads | None = None) -> list[Json]:
    """Every NodeDisruptionBudget, in name order; with `reads`, as the worker's cache holds them (which
    budgets select a node: each claim is then read and written on the budget's own version)."""
    if reads is None:
        listed = await kube.list_cluster_custom(KARPFLOW_GROUP, KARPFLOW_VERSION, PLURAL)
    else:
        listed = await reads.cluster_custom("NodeDisruptionBudget", KARPFLOW_GROUP, KARPFLOW_VERSION, PLURAL)
    return sorted(listed, key=name_of)


async def _get(kube: KubeApi, name: str) -> Json | None:
    try:
        return await kube.get_cluster_custom(KARPFLOW_GROUP, KARPFLOW_VERSION, PLURAL, name)
    except KubeError as err:
        if err.status == 404:
            return None
        raise


async def _write_claims(kube: KubeApi, obj: Json, claims: list[BudgetClaim]) -> None:
    status = dict(obj.get("status") or {})
    status["claims"] = _wire(claims)
    body = {**obj, "status": status}
    await kube.replace_cluster_custom_status(KARPFLOW_GROUP, KARPFLOW_VERSION, PLURAL, name_of(obj), body)


async def _nodes(kube: KubeApi, reads: ClusterReads | None) -> dict[str, Json]:
    return {name_of(n): n for n in await (reads or ClusterReads(kube)).nodes()}


async def _backoff(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))


# -- claim ------------------------------------------------------------------------------------------------


def selecting(raw_budgets: Iterable[Json], node: Json) -> list[str]:
    """The budgets (names, in order) that select `node`."""
    return [name_of(raw) for raw in raw_budgets if read_ndb(raw).selects(labels_of(node))]


async def claim(
    kube: KubeApi,
    candidates: list[Json],
    holder: str,
    reason: str,
    now: datetime | None = None,
    reads: ClusterReads | None = None,
) -> Denied | None:
    """Claim every candidate in every budget that selects it, or none of them: the first budget
    without room for its candidates is returned (and what was claimed here is released). `reads`:
    where the nodes are read (the worker's cache); without, the API server."""
    if not candidates:
        return None
    claimed: list[str] = []
    everyone = _names(candidates)
    for raw in await budgets(kube, reads):
        ndb = read_ndb(raw)
        mine = [c for c in candidates if ndb.selects(labels_of(c))]
        if not mine:
            continue
        denied = await _claim_in(kube, name_of(raw), mine, holder, reason, now or datetime.now(UTC), reads)
        if denied is not None:
            for name in claimed:
                await _release_in(kube, name, lambda c: c.holder == holder and c.node in everyone)
            return denied
        claimed.append(name_of(raw))
    return None


def _names(nodes: list[Json]) -> set[str]:
    return {name_of(n) for n in nodes}


async def _claim_in(
    kube: KubeApi,
    budget: str,
    mine: list[Json],
    holder: str,
    reason: str,
    now: datetime,
    reads: ClusterReads | None = None,
) -> Denied | None:
    for attempt in range(ATTEMPTS):
        obj = await _get(kube, budget)
        if obj is None:
            return None  # deleted meanwhile: it limits nothing any more
        ndb = read_ndb(obj)
        nodes = await _nodes(kube, reads)
        existing = _claims(obj)
        claims = _live(existing, nodes)
        denied = room(ndb, nodes, claims, mine)
        if denied is not None:
            return denied
        wanted = [
            BudgetClaim(
                node=name_of(node),
                uid=str(_meta(node).get("uid") or ""),
                holder=holder,
                reason=reason,
                since=rfc3339(now),
            )
            for node in mine
            if not any(c.node == name_of(node) and c.holder == holder for c in claims)
        ]
        if not wanted and len(claims) == len(existing):
            return None  # a retry: already claimed
        try:
            await _write_claims(kube, obj, claims + wanted)
            return None
        except KubeError as err:
            if err.status == 404:
                return None
            if err.status != 409 or attempt == ATTEMPTS - 1:
                raise
        await _backoff(attempt)
    raise AssertionError("unreachable")


def room(ndb: Ndb, nodes: dict[str, Json], claims: list[BudgetClaim], mine: list[Json]) -> Denied | None:
    """Whether taking `mine` keeps the budget within what it allows (None), else why not."""
    selected = [n for n in nodes.values() if ndb.selects(labels_of(n))]
    selected_names = _names(selected)
    down = {name_of(n) for n in selected if is_down(n)} | {c.node for c in claims if c.node in selected_names}
    want = _names(mine)
    after = down | want
    allowed = ndb.allowed_unavailable(len(selected))
    if want <= down or len(after) <= allowed:
        return None
    shown = ", ".join(sorted(down)[:5]) + (" ..." if len(down) > 5 else "")
    taking = ", ".join(sorted(want - down))
    message = (
        f"NodeDisruptionBudget {ndb.name} allows {allowed} unavailable ({ndb.describe()}); "
        f"{len(down)} of {len(selected)} selected nodes are{f' ({shown})' if down else ''}, "
        f"and taking {taking} would make {len(after)}"
    )
    return Denied(ndb.name, message, allowed, len(down))


# -- release ----------------------------------------------------------------------------------------------


async def release(
    kube: KubeApi,
    *,
    holder: str | None = None,
    nodes: Iterable[str] | None = None,
    uid: str | None = None,
    reads: ClusterReads | None = None,
) -> int:
    """Drop the claims that match every given filter (a holder's, a node's, a node incarnation's);
    returns how many were dropped. Idempotent. `reads`: the budgets whose claims to read and write
    are found in the worker's cache (each is still read from the server before it is written), for
    a release long after the claim, as a termination's end: a claim the cache does not show yet is
    left to the controller's sweep (`sweep`: its node is gone). Without, every budget is listed
    from the server: a rollback moments after its claim must find it."""
    names = set(nodes) if nodes is not None else None

    def matches(claim: BudgetClaim) -> bool:
        return (
            (holder is None or claim.holder == holder)
            and (names is None or claim.node in names)
            and (uid is None or not claim.uid or claim.uid == uid)
        )

    dropped = 0
    for raw in await budgets(kube, reads):
        if any(matches(c) for c in _claims(raw)):
            dropped += await _release_in(kube, name_of(raw), matches)
    return dropped


async def _release_in(kube: KubeApi, budget: str, matches: Callable[[BudgetClaim], bool]) -> int:
    for attempt in range(ATTEMPTS):
        obj = await _get(kube, budget)
        if obj is None:
            return 0
        claims = _claims(obj)
        kept = [c for c in claims if not matches(c)]
        if len(kept) == len(claims):
            return 0
        try:
            await _write_claims(kube, obj, kept)
            return len(claims) - len(kept)
        except KubeError as err:
            if err.status == 404:
                return 0
            if err.status != 409 or attempt == ATTEMPTS - 1:
                raise
        await _backoff(attempt)
    raise AssertionError("unreachable")


async def sweep(
    kube: KubeApi,
    running: set[str],
    older_than_seconds: float,
    now: datetime | None = None,
    reads: ClusterReads | None = None,
) -> int:
    """The controller's clean-up: drop claims whose node is gone, and claims whose holder no longer
    runs (`running`: workflow ids in flight) while their node is neither tainted nor deleting, once
    older than `older_than_seconds` (a claim is written a moment before its taint). Returns how many."""
    now = now or datetime.now(UTC)
    nodes = await _nodes(kube, reads)

    def stale(claim: BudgetClaim) -> bool:
        node = nodes.get(claim.node)
        if node is None or (claim.uid and _meta(node).get("uid") != claim.uid):
            return True
        if claim.holder.partition("@")[0] in running:
            return False
        if is_tainted(node) or _meta(node).get("deletionTimestamp"):
            return False
        try:
            since = datetime.fromisoformat(claim.since.replace("Z", "+00:00"))
        except ValueError:
            return True
        return (now - since).total_seconds() > older_than_seconds

    dropped = 0
    # From the cache: a claim written within its watch delay is swept (if stale) the next time.
    for raw in await budgets(kube, reads):
        if any(stale(c) for c in _claims(raw)):
            dropped += await _release_in(kube, name_of(raw), stale)
    return dropped
