"""Would the API server let this eviction through its PodDisruptionBudget? Read off the PDB the
worker's cache holds, so a drain waits for room in the budget instead of asking with each back-off
and being answered 429 (issue 34). (In bench_api_load's drift, whose PDBs all have room, the extra
evictions were 404s instead: pods this drain had evicted, shown by a cache a moment behind; the
drain now never evicts again a pod it evicted, activities/drain.py.)

kube-apiserver's eviction handler (kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go),
in its order:
- a pod that is Succeeded, Failed, Pending or already terminating is deleted without looking at any
  PDB (`canIgnorePDB`);
- more than one PDB selecting the pod: 500, whatever their status;
- an unready pod goes without spending budget when the PDB says `unhealthyPodEvictionPolicy:
  AlwaysAllow`, or (IfHealthyBudget, the default) while `currentHealthy >= desiredHealthy > 0`;
- else `checkAndDecrement`: 429 while the PDB controller has not observed the PDB's generation or
  `disruptionsAllowed` is 0; otherwise it decrements `disruptionsAllowed` in the PDB's status (an
  UpdateStatus) and the eviction goes on.

So the cache can say "no room" (`False`), "room" (`True`), or nothing useful (`None`: no PDB, several,
or one whose status the controller has not written yet): the caller asks the server then, as before.

The cache is one watch delay behind the server, and right after an eviction it still shows the budget
this worker just spent: `Spent` remembers what this worker's evictions took from each PDB at the
version the cache held, until the cache shows a newer version (the server's, which counts them).
A stale "room" costs one eviction answered 429; a stale "no room" costs a wait that ends when the
watch brings the PDB's change, or when the caller's back-off lets one request through anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Json = Mapping[str, Any]


def _meta(obj: Json) -> Json:
    meta: Json = obj.get("metadata") or {}
    return meta


def pod_ready(pod: Json) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ignores_pdbs(pod: Json) -> bool:
    """The eviction deletes the pod without looking at PDBs (kube-apiserver's `canIgnorePDB`)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(_meta(pod).get("deletionTimestamp"))


def version(pdb: Json) -> str:
    """The PDB's identity at this state: UID and resourceVersion."""
    meta = _meta(pdb)
    uid = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
    return f"{uid}@{meta.get('resourceVersion') or ''}"


def eviction_may_pass(pod: Json, pdbs: Sequence[Json], spent: int = 0) -> bool | None:
    """Would an eviction of `pod`, guarded by `pdbs` (those selecting it), pass the budget now, with
    `spent` disruptions this worker took from the single PDB since the version it is read at?
    None: the cached PDB cannot tell (no PDB, several, or no status yet)."""
    if ignores_pdbs(pod):
        return True
    if len(pdbs) != 1:
        return None  # none: nothing to wait for; several: the server answers 500 whatever the status
    pdb = pdbs[0]
    status = pdb.get("status")
    if not isinstance(status, Mapping):
        return None
    if int(status.get("observedGeneration") or 0) < int(_meta(pdb).get("generation") or 0):
        return False  # the PDB controller has not caught up with a change of the spec: 429
    if not pod_ready(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        desired = int(status.get("desiredHealthy") or 0)
        if policy == "AlwaysAllow" or int(status.get("currentHealthy") or 0) >= desired > 0:
            return True  # an unready pod spends no budget
    return int(status.get("disruptionsAllowed") or 0) - spent > 0


class Spent:
    """The disruptions this worker's evictions took from each PDB, counted against the version of
    the PDB the cache showed when they were made; a newer version in the cache is the server's and
    counts them already, so the count starts over."""

    def __init__(self) -> None:
        self._spent: dict[str, tuple[str, int]] = {}  # uid -> (resourceVersion, disruptions)

    def of(self, pdb: Json) -> int:
        uid, _, at = version(pdb).rpartition("@")
        found = self._spent.get(uid)
        if found is None:
            return 0
        if found[0] != at:
            del self._spent[uid]  # the cache moved on: the server's status counts them
            return 0
        return found[1]

    def spend(self, pdb: Json) -> None:
        uid, _, at = version(pdb).rpartition("@")
        self._spent[uid] = (at, self.of(pdb) + 1)
