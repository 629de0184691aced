"""The cluster-health breaker: voluntary disruption pauses while the cluster is sick, and resumes
on its own when it recovers (issue 35 item 5; docs/operator-controls.md "Cluster-health breaker").

Taking nodes away from a cluster that is already losing them, or whose pods cannot be placed,
makes an outage worse: Cluster Autoscaler stops scaling down then for the same reason
(kubernetes/autoscaler cluster-autoscaler/clusterstate/clusterstate.go `IsClusterHealthy`, with
`--max-total-unready-percentage` 45 and `--ok-total-unready-count` 3). The breaker opens when
either holds, at the pass's time:

- **NotReady nodes**: more than `breaker_ok_unready` nodes *and* more than `breaker_max_unready`
  of all nodes are not Ready (CA's rule and defaults). Not counted, as CA does not: a node younger
  than `breaker_node_startup` (15 min, CA's `--max-node-startup-time`) that never became Ready
  (it is still starting), and nodes being deleted or carrying a disruption taint (karpflow or
  Karpenter is taking them away on purpose).
- **Pending pods**: more than `breaker_max_pending_pods` pods have been pending (not bound to a
  node, not finished, not deleting) for longer than `breaker_pending_for` (10 min): whatever
  provisions nodes is not keeping up, and every drained pod would join them.

While open it is a window of the pass that blocks the voluntary actions (Emptiness,
Consolidation, Drift, which `karpflow rollout` uses, and Rebalance) on every node: commands it
covers are not planned, a planned one fails its validation and a waiting one its re-check, each
saying why. Commands in flight finish. Forceful methods (expiration, repair, interruption, NodePool
deletion) go on: repair has its own per-pool rule (planner/repair.py). Pure: it reads the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.maintenance_windows import Window
from planner.model import PlanOptions
from planner.snapshot import Snapshot

BREAKER_WINDOW = "cluster-health-breaker"
BREAKER_ACTIONS = frozenset({"Emptiness", "Consolidation", "Drift", "Rebalance"})


@dataclass(frozen=True)
class ClusterHealth:
    nodes: int
    unready: int
    pending_pods: int
    trips: tuple[str, ...]  # why the breaker is open; empty: closed

    @property
    def open(self) -> bool:
        return bool(self.trips)

    def describe(self) -> str:
        return "; ".join(self.trips)


def cluster_health(snapshot: Snapshot, options: PlanOptions) -> ClusterHealth:
    """How sick the cluster is at `snapshot.now`, and whether that opens the breaker."""
    now = snapshot.now
    counted = unready = 0
    for node in snapshot.nodes.values():
        if node.is_deleting or node.has_disrupted_taint:
            continue
        counted += 1
        if node.ready:
            continue
        created = node.creation_timestamp
        if created is not None and now - created < options.breaker_node_startup:
            continue  # still starting, not unready
        unready += 1
    pending = sum(
        1
        for pod in snapshot.pending_pods
        if pod.creation_timestamp is not None and now - pod.creation_timestamp > options.breaker_pending_for
    )
    trips = []
    share = options.breaker_max_unready
    if options.breaker and unready > options.breaker_ok_unready and unready > share * counted:
        trips.append(
            f"{unready} of {counted} nodes NotReady (more than {options.breaker_ok_unready} and {share:.0%})"
        )
    limit = options.breaker_max_pending_pods
    if options.breaker and limit > 0 and pending > limit:
        minutes = int(options.breaker_pending_for.total_seconds() // 60)
        trips.append(f"{pending} pods pending for more than {minutes} min (more than {limit})")
    return ClusterHealth(counted, unready, pending, tuple(trips))


def breaker_window(health: ClusterHealth) -> Window:
    """The open breaker as a window of the pass: every node, the voluntary actions, until it closes."""
    return Window(
        name=BREAKER_WINDOW,
        actions=BREAKER_ACTIONS,
        selector=None,
        schedules=(),
        breaker=health.describe(),
    )


def with_health_breaker(snapshot: Snapshot, options: PlanOptions) -> tuple[Snapshot, ClusterHealth]:
    """The snapshot with the breaker's window when it is open (a view: the snapshot itself is not
    changed), and the health it judged."""
    health = cluster_health(snapshot, options)
    if not health.open:
        return snapshot, health
    view = snapshot.at(snapshot.now)
    view.maintenance_windows = {**snapshot.maintenance_windows, BREAKER_WINDOW: breaker_window(health)}
    return view, health
