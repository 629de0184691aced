"""kube-scheduler's score arithmetic, in the integers and floats it uses (kubernetes/kubernetes
v1.33-v1.35, pkg/scheduler/framework/plugins/), for one node (Python ints) or many (numpy arrays).

- NodeResourcesFit, LeastAllocated (noderesources/least_allocated.go): per resource with
  allocatable > 0, `(allocatable - requested) * 100 / allocatable` (0 once over), averaged over cpu
  and memory (weights 1), in integers. `requested` is the node's non-zero requests plus the pod's.
- NodeResourcesBalancedAllocation (noderesources/balanced_allocation.go): the fractions
  requested/allocatable (actual requests, capped at 1), `(1 - |f_cpu - f_mem| / 2) * 100` truncated;
  skipped for a pod that requests neither (issue 129138).
- TaintToleration (tainttoleration/taint_toleration.go): the count of untolerated PreferNoSchedule
  taints, normalized reversed (helper/normalize_score.go `DefaultNormalizeScore`): `100 - 100 * c /
  max`, all 100 when no node has any.
- NodeAffinity (nodeaffinity/node_affinity.go): the matched preferred weights, `100 * s / max`.
- PodTopologySpread (podtopologyspread/scoring.go): normalized `100 * (max + min - s) / max` over the
  nodes not ignored, which score 0 (all 100 when max is 0).
- InterPodAffinity (interpodaffinity/scoring.go): `int(100 * ((s - min) / (max - min)))`, 0 when all
  are equal.
The weighted sum is the default profile's (apis/config/v1/default_plugins.go): TaintToleration 3,
NodeAffinity 2, NodeResourcesFit 1, PodTopologySpread 2, InterPodAffinity 2, BalancedAllocation 1.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

MAX_NODE_SCORE = 100
WEIGHT_TAINT_TOLERATION = 3
WEIGHT_NODE_AFFINITY = 2
WEIGHT_FIT = 1
WEIGHT_SPREAD = 2
WEIGHT_INTER_POD = 2
WEIGHT_BALANCED = 1


# --- node resources ------------------------------------------------------------------------------------


def least_allocated(alloc_cpu: int, alloc_mem: int, requested_cpu: int, requested_mem: int) -> int:
    total = weights = 0
    for alloc, requested in ((alloc_cpu, requested_cpu), (alloc_mem, requested_mem)):
        if alloc == 0:
            continue
        total += 0 if requested > alloc else (alloc - requested) * MAX_NODE_SCORE // alloc
        weights += 1
    return total // weights if weights else 0


def least_allocated_many(alloc_cpu: Ints, alloc_mem: Ints, requested_cpu: Ints, requested_mem: Ints) -> Ints:
    total = np.zeros(alloc_cpu.shape, dtype=np.int64)
    weights = np.zeros(alloc_cpu.shape, dtype=np.int64)
    for alloc, requested in ((alloc_cpu, requested_cpu), (alloc_mem, requested_mem)):
        has = alloc > 0
        free = np.where(requested > alloc, 0, (alloc - requested) * MAX_NODE_SCORE // np.where(has, alloc, 1))
        total += np.where(has, free, 0)
        weights += has
    out: Ints = np.where(weights > 0, total // np.maximum(weights, 1), 0)
    return out


def balanced_allocation(alloc_cpu: int, alloc_mem: int, requested_cpu: int, requested_mem: int) -> int:
    fractions = [
        min(float(requested) / float(alloc), 1.0)
        for alloc, requested in ((alloc_cpu, requested_cpu), (alloc_mem, requested_mem))
        if alloc != 0
    ]
    std = abs((fractions[0] - fractions[1]) / 2) if len(fractions) == 2 else 0.0
    return int((1 - std) * float(MAX_NODE_SCORE))


def balanced_allocation_many(
    alloc_cpu: Ints, alloc_mem: Ints, requested_cpu: Ints, requested_mem: Ints
) -> Ints:
    has_cpu, has_mem = alloc_cpu != 0, alloc_mem != 0
    f_cpu = np.minimum(requested_cpu / np.where(has_cpu, alloc_cpu, 1), 1.0)
    f_mem = np.minimum(requested_mem / np.where(has_mem, alloc_mem, 1), 1.0)
    std = np.where(has_cpu & has_mem, np.abs((f_cpu - f_mem) / 2), 0.0)
    out: Ints = ((1 - std) * float(MAX_NODE_SCORE)).astype(np.int64)
    return out


# --- normalizations ------------------------------------------------------------------------------------


def taint_toleration_normalized(raw: Ints) -> Ints:
    top = int(raw.max()) if raw.size else 0
    if top == 0:
        return np.full(raw.shape, MAX_NODE_SCORE, dtype=np.int64)
    out: Ints = MAX_NODE_SCORE - MAX_NODE_SCORE * raw // top
    return out


def node_affinity_normalized(raw: Ints) -> Ints:
    top = int(raw.max()) if raw.size else 0
    if top == 0:
        return raw
    out: Ints = MAX_NODE_SCORE * raw // top
    return out


def go_round(values: Floats) -> Ints:
    """Go's math.Round (half away from zero) for values >= 0; numpy's rounds half to even."""
    floor = np.floor(values)
    out: Ints = (floor + (values - floor >= 0.5)).astype(np.int64)
    return out


def spread_normalized(raw: Ints, ignored: npt.NDArray[np.bool_] | None) -> Ints:
    """`ignored` nodes (missing a key of the pod's own constraints) score 0 and count for nothing."""
    counted = raw if ignored is None else raw[~ignored]
    if counted.size == 0:
        return np.zeros(raw.shape, dtype=np.int64)
    low, top = int(counted.min()), int(counted.max())
    if top == 0:
        scores = np.full(raw.shape, MAX_NODE_SCORE, dtype=np.int64)
    else:
        scores = MAX_NODE_SCORE * (top + low - raw) // top
    if ignored is None:
        return scores
    out: Ints = np.where(ignored, 0, scores)
    return out


def inter_pod_normalized(raw: Ints) -> Ints:
    if raw.size == 0:
        return raw
    low, top = int(raw.min()), int(raw.max())
    if top == low:
        return np.zeros(raw.shape, dtype=np.int64)
    out: Ints = (float(MAX_NODE_SCORE) * ((raw - low) / float(top - low))).astype(np.int64)
    return out
