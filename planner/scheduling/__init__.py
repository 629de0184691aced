"""The scheduling simulation: where would these pods go if these nodes were removed?

Pure and built for repeated probing. A `Simulator` is prepared once per snapshot (existing nodes
with the free room left by their bound pods, NodePools, the instance catalog, DaemonSets); each
`simulate(remove=..., pods=...)` then only moves the given pods. Existing bound pods never move:
they are static used capacity, so a probe costs about the number of pods moved, not the cluster size.

Placement follows Karpenter's scheduler (behaviour notes §2.6):
- pods go in order of CPU then memory, largest first; each tries existing nodes (initialized ones
  first, then by name), then the new NodeClaims already opened (fewest pods first), then opens a new
  NodeClaim from the NodePools (highest weight first);
- resources against allocatable (minus DaemonSet overhead on new nodes), nodeSelector / required
  node affinity / NodePool requirements, taints (startup taints ignored on new nodes, PreferNoSchedule
  never blocks), host ports, required pod (anti-)affinity and topology spread over any key, NodePool
  limits;
- a new NodeClaim keeps the instance types that still fit everything put on it, in price order;
- preferences (preferred node/pod (anti-)affinity, ScheduleAnyway spreads) are required first and
  relaxed one at a time under `Respect`, or dropped under `Ignore`;
- a pod that lands on an uninitialized node fails (unless it comes from a node already deleting);
- in a consolidation's simulation (`run(consolidation=True)`, Karpenter v1.14's
  IsConsolidationSimulation), a moved pod never lands on an existing node inside its NodePool's
  consolidateAfter window (`settling_nodes`); pending pods and pods of deleting nodes may, and
  new NodeClaims are not held back. Drift, expiration, repair and interruption simulate without it.

Deliberate differences from Karpenter, each for a reason:
- Pods that move whatever is decided (pending pods, pods of nodes being deleted or already removed
  by this pass) are placed first, as "background"; the NodeClaims they open are capacity the
  provisioner launches anyway (Karpenter sees them as in-flight nodes), so they neither count as
  replacements nor take moved pods. Their placement is computed once per pass and shared by every
  probe; only those sitting on a probe's removed nodes are placed again.
- Required node-affinity terms are ORed on existing nodes (as the kube-scheduler does) and tried in
  order for new nodes; a relaxed preference is retried at once rather than after the queue.
- DaemonSet overhead is computed per NodePool and instance type, not per NodePool only.

Speed comes from signatures: pods of one workload share a `PodConstraints`, so compatibility with a
node class, the list of nodes with baseline room for a request, requirement merges and instance-type
lists are computed once per signature and reused across probes. Within a probe, a node that is too
full for a request stays too full (room only shrinks), so the scan for that request resumes where it
stopped.

The rooms:
- `adapter.py`: the planner's entry (`simulate`, `SnapshotSimulation`): snapshot objects to the
  simulator's inputs and its answers back to planner.model's `SchedulingResult`;
- `inputs.py`, `requirements.py`: the simulator's own pod, node and NodePool forms, and the
  requirement algebra (In/NotIn/Exists/Gt/Lt/Gte/Lte, merges, label matching);
- `simulator.py`: `Simulator`, the probe loop (background placement, forks, pod order, placement),
  and a small read-only view (signatures, node and NodePool admission, instance types) for planners
  that reason about the whole fleet at once (planner/optimal/), whose planned destination for a pod
  (`prefer`) is tried first and taken only when every rule allows it;
- `topology.py`: what a pod signature asks at each relaxation level, and topology groups;
- `nodepools.py`: what a NodePool can launch (instance types that fit requirements, domains);
- `existing_nodes.py`: placement on existing nodes;
- `new_nodes.py`, `packing.py`: new NodeClaims, and the cost-aware packing of several;
- `state.py`, `results.py`: the data they share, and what a simulation answers.
"""
