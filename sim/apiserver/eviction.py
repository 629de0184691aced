"""PodDisruptionBudget arithmetic and the policy/v1 Eviction API.

Two halves:

- `compute_pdb_status(pdb, pods, scale_of, now)`: pure. What the disruption controller in
  kube-controller-manager writes into a PDB's status: expectedPods, desiredHealthy,
  currentHealthy, disruptionsAllowed, disruptedPods, the DisruptionAllowed condition. The PDB
  status controller in `sim/controllers/` calls it; the eviction handler calls it too when the
  store runs with `pdb_status="inline"` (so evictions work without that controller).
- `evict(store, namespace, name, ...)`: what kube-apiserver's `pods/eviction` does, in its order:
  404 when the pod is gone; preconditions (uid/resourceVersion → 409); terminal, Pending or
  already terminating pods are deleted without looking at PDBs; more than one matching PDB → 500;
  an unready pod may go without spending budget (AlwaysAllow, or IfHealthyBudget while the budget
  is healthy); otherwise `disruptionsAllowed` must be > 0 and is decremented at once, with the pod
  recorded in `status.disruptedPods`, so two quick evictions cannot both pass a budget of 1;
  else 429 with a DisruptionBudget cause. The pod gets a DisruptionTarget condition and is deleted
  (gracefully when on a node).

Rounding follows the disruption controller: both minAvailable and maxUnavailable percentages are
scaled with round-up (`intstr.GetScaledValueFromIntOrPercent(..., roundUp=true)`), and an integer
minAvailable counts the matching pods as expected, while percentages and maxUnavailable use the
replicas of the pods' controllers (Deployment through its ReplicaSet, ReplicaSet, StatefulSet).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sim.apiserver.errors import Conflict, InternalError, NotFound, TooManyRequests
from sim.apiserver.selectors import selector_from_label_selector

if TYPE_CHECKING:
    from sim.apiserver.store import Store

# A pod recorded in disruptedPods but not deleted within this long counts as healthy again.
DELETION_TIMEOUT = timedelta(minutes=2)
MORE_THAN_ONE_PDB = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
)
EVICTION_BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."

ScaleOf = Callable[[dict[str, Any]], tuple[str, int] | None]
_SCALED_KINDS = {"ReplicaSet": "replicasets", "Deployment": "deployments"}


class PdbSyncError(ValueError):
    """The expected pod count cannot be worked out (a pod without a scalable controller, a bad value)."""


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def scaled_value(value: int | str, total: int, *, round_up: bool = True) -> int:
    """`intstr.GetScaledValueFromIntOrPercent`: an int as is, "N%" of total rounded (up by default)."""
    if isinstance(value, bool):
        raise PdbSyncError(f"invalid value {value!r}: must be an integer or a percentage")
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        raise PdbSyncError(
            f"invalid value for IntOrString: invalid type: string is not a percentage: {text!r}"
        )
    try:
        percent = int(text[:-1])
    except ValueError:
        raise PdbSyncError(f"invalid value for IntOrString: {text!r}") from None
    exact = percent * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def pdb_selects(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """policy/v1: same namespace and the selector matches (null selects nothing, {} everything)."""
    if (pdb.get("metadata") or {}).get("namespace") != (pod.get("metadata") or {}).get("namespace"):
        return False
    try:
        selector = selector_from_label_selector((pdb.get("spec") or {}).get("selector"))
    except ValueError:
        return False  # an invalid selector matches nothing, as in the eviction handler
    return selector.matches((pod.get("metadata") or {}).get("labels"))


def controller_ref(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def expected_count(
    pdb: Mapping[str, Any], pods: list[Mapping[str, Any]], scale_of: ScaleOf
) -> tuple[int, int]:
    """(expectedPods, desiredHealthy) for the PDB's matching `pods`. Raises PdbSyncError."""
    spec = pdb.get("spec") or {}
    max_unavailable, min_available = spec.get("maxUnavailable"), spec.get("minAvailable")
    if max_unavailable is not None:
        expected = _expected_scale(pods, scale_of)
        desired = max(0, expected - scaled_value(max_unavailable, expected))
        return expected, desired
    if min_available is not None:
        if isinstance(min_available, int) and not isinstance(min_available, bool):
            return len(pods), min_available
        expected = _expected_scale(pods, scale_of)
        return expected, scaled_value(min_available, expected)
    return 0, 0


def _expected_scale(pods: list[Mapping[str, Any]], scale_of: ScaleOf) -> int:
    seen: dict[str, int] = {}
    for pod in pods:
        ref = controller_ref(pod)
        if ref is None:
            name = (pod.get("metadata") or {}).get("name")
            raise PdbSyncError(f"found no controller ref for pod {name!r}")
        found = scale_of(ref | {"namespace": (pod.get("metadata") or {}).get("namespace")})
        if found is None:
            raise PdbSyncError(f"found no controllers for pod {(pod.get('metadata') or {}).get('name')!r}")
        uid, replicas = found
        seen[uid] = replicas
    return sum(seen.values())


def compute_pdb_status(
    pdb: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    scale_of: ScaleOf,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The status the disruption controller would write for `pdb`.

    `pods`: candidate pods (the PDB's selector and namespace are applied here). `scale_of(ref)`:
    for a pod's controller ownerReference (plus "namespace"), the (uid, replicas) of the workload
    that owns the scale — a Deployment for a ReplicaSet it owns — or None when there is none
    (then, as in Kubernetes, the sync fails safe: disruptionsAllowed 0, condition SyncFailed).
    """
    now = now or datetime.now(UTC)
    meta = pdb.get("metadata") or {}
    previous = dict(pdb.get("status") or {})
    matching = [p for p in pods if pdb_selects(pdb, p)]
    generation = meta.get("generation", 0)
    try:
        expected, desired = expected_count(pdb, matching, scale_of)
    except PdbSyncError as err:
        status = previous | {"disruptionsAllowed": 0, "observedGeneration": generation}
        status["conditions"] = _condition(previous, "False", "SyncFailed", str(err), generation, now)
        return status

    old_disrupted = previous.get("disruptedPods") or {}
    disrupted: dict[str, str] = {}
    for pod in matching:
        name = pod["metadata"]["name"]
        if name not in old_disrupted or pod["metadata"].get("deletionTimestamp"):
            continue
        if _parse(old_disrupted[name]) + DELETION_TIMEOUT > now:
            disrupted[name] = old_disrupted[name]
    healthy = sum(
        1
        for p in matching
        if not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["name"] not in disrupted
        and is_pod_ready(p)
    )
    allowed = healthy - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    if allowed > 0:
        cond = _condition(previous, "True", "SufficientPods", "", generation, now)
    else:
        cond = _condition(previous, "False", "InsufficientPods", "", generation, now)
    status["conditions"] = cond
    return status


def _condition(
    previous: Mapping[str, Any], status: str, reason: str, message: str, generation: int, now: datetime
) -> list[dict[str, Any]]:
    others = [c for c in previous.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    changed = old is None or old.get("status") != status
    since = _rfc3339(now) if changed or old is None else old.get("lastTransitionTime", _rfc3339(now))
    condition = {
        "type": "DisruptionAllowed",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    }
    return [*others, condition]


# --- using the store ---------------------------------------------------------------------------------


def scale_finder(get: Callable[[str, str, str], Mapping[str, Any] | None]) -> ScaleOf:
    """`scale_of` reading workloads through `get(plural, name, namespace)` (None when absent): a
    ReplicaSet counts its owning Deployment's scale when it has one, else its own; a Deployment, its own.
    Shared by the Eviction API (over the store) and the PDB status controller (over its informer)."""

    def find(ref: dict[str, Any]) -> tuple[str, int] | None:
        kind, name, ns = ref.get("kind"), ref.get("name"), ref.get("namespace") or ""
        plural = _SCALED_KINDS.get(str(kind))
        if plural is None:
            return None
        obj = get(plural, str(name), ns)
        if obj is None or obj["metadata"]["uid"] != ref.get("uid"):
            return None
        if kind == "ReplicaSet":
            owner = controller_ref(obj)
            if owner and owner.get("kind") == "Deployment":
                found = find(owner | {"namespace": ns})
                if found is not None:
                    return found
        return obj["metadata"]["uid"], int((obj.get("spec") or {}).get("replicas", 1))

    return find


def _store_get(store: Store) -> Callable[[str, str, str], dict[str, Any] | None]:
    def get(plural: str, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return store.get(plural, name, namespace)
        except NotFound:
            return None

    return get


def matching_pdbs(store: Store, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    ns = pod["metadata"]["namespace"]
    return [pdb for pdb in store.list("poddisruptionbudgets", ns).items if pdb_selects(pdb, pod)]


def refresh_pdb_status(store: Store, pdb: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """Recompute one PDB's status from the store and write it if it changed. Returns the PDB."""
    ns = pdb["metadata"]["namespace"]
    pods = store.list("pods", ns).items
    status = compute_pdb_status(pdb, pods, scale_finder(_store_get(store)), now)
    if status == pdb.get("status"):
        return pdb
    return store.update_status("poddisruptionbudgets", {**pdb, "status": status}, ns)


def _can_ignore_pdb(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(pod["metadata"].get("deletionTimestamp"))


def _success() -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}


def evict(
    store: Store,
    namespace: str,
    name: str,
    *,
    preconditions: Mapping[str, Any] | None = None,
    grace_period_seconds: int | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Evict one pod; the caller holds the store lock. Returns a Success Status or raises."""
    pod = store.get("pods", name, namespace)
    pre = dict(preconditions or {})
    uid, rv = pre.get("uid"), pre.get("resourceVersion")
    if uid and uid != pod["metadata"]["uid"]:
        raise Conflict(
            f'Operation cannot be fulfilled on Pod "{name}": the UID in the precondition ({uid}) does not '
            f"match the UID in record ({pod['metadata']['uid']}). The object might have been deleted and "
            "then recreated",
            name=name,
            kind="Pod",
        )
    if rv and str(rv) != pod["metadata"]["resourceVersion"]:
        raise Conflict(
            f'Operation cannot be fulfilled on Pod "{name}": the ResourceVersion in the precondition ({rv}) '
            f"does not match the ResourceVersion in record ({pod['metadata']['resourceVersion']}). The "
            "object might have been modified",
            name=name,
            kind="Pod",
        )
    if _can_ignore_pdb(pod):
        if not dry_run:
            _delete_evicted(store, pod, grace_period_seconds)
        return _success()

    pdbs = matching_pdbs(store, pod)
    if len(pdbs) > 1:
        raise InternalError(MORE_THAN_ONE_PDB)
    if pdbs:
        pdb = pdbs[0]
        if store.pdb_status == "inline":
            pdb = refresh_pdb_status(store, pdb)
        status = pdb.get("status") or {}
        spend_budget = True
        if not is_pod_ready(pod):
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
            healthy_budget = status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0
            if policy == "AlwaysAllow" or healthy_budget:
                spend_budget = False  # an unready pod is no disruption to a healthy application
        if spend_budget:
            _check_and_decrement(store, pdb, name, dry_run)
    if not dry_run:
        _delete_evicted(store, pod, grace_period_seconds)
    return _success()


def _check_and_decrement(store: Store, pdb: dict[str, Any], pod_name: str, dry_run: bool) -> None:
    status = dict(pdb.get("status") or {})
    pdb_name = pdb["metadata"]["name"]
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 0):
        raise TooManyRequests(
            EVICTION_BLOCKED,
            retry_after=10,
            causes=[
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {pdb_name} is still being processed by the server.",
                }
            ],
        )
    if status.get("disruptionsAllowed", 0) <= 0:
        raise TooManyRequests(
            EVICTION_BLOCKED,
            causes=[
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {pdb_name} needs {status.get('desiredHealthy', 0)} "
                    f"healthy pods and has {status.get('currentHealthy', 0)} currently",
                }
            ],
        )
    if dry_run:
        return
    status["disruptionsAllowed"] -= 1
    status["disruptedPods"] = dict(status.get("disruptedPods") or {}) | {
        pod_name: _rfc3339(datetime.now(UTC))
    }
    if status["disruptionsAllowed"] == 0:
        status["conditions"] = _condition(
            status, "False", "InsufficientPods", "", pdb["metadata"].get("generation", 0), datetime.now(UTC)
        )
    store.update_status("poddisruptionbudgets", {**pdb, "status": status}, pdb["metadata"]["namespace"])


def _delete_evicted(store: Store, pod: dict[str, Any], grace: int | None) -> None:
    meta = pod["metadata"]
    ns, name = meta["namespace"], meta["name"]
    if not meta.get("deletionTimestamp"):
        conditions = [
            c
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("type") != "DisruptionTarget"
        ]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastTransitionTime": _rfc3339(datetime.now(UTC)),
            }
        )
        store.patch("pods", name, {"status": {"conditions": conditions}}, ns, subresource="status")
    store.delete("pods", name, ns, grace_period_seconds=grace)
