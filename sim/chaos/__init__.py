"""The chaos harness: karpflow's controller on a fragmented cluster while everything fails around it.

    karpflow sim chaos --seed 7 --minutes 2        # or tests/integration/chaos/test_chaos.py

A run (runner.py) starts a Temporal dev server on a database file, the simulated cluster (world.py:
drift, expiry, spot nodes, PDBs that never allow, pods that ignore eviction) with its interruption
queue in moto, and `karpflow worker` processes; then, for the fault phase, injects:

- processes (runner.py, processes.py): a worker SIGKILLed at random moments (at least 10 per run)
  and started again, a second worker for part of the run, the Temporal dev server restarted;
- continuous faults (faults.py): Kubernetes API 500/429/409 on about 10 % of the calls, latency,
  watches cut, 410 on re-watch; EC2 throttling, InsufficientInstanceCapacity on some offerings,
  replacements that do not become Ready while the faults last;
- discrete events (actions.py): instances that vanish without notice, spot interruptions with
  duplicated and reordered rebalance/warning messages, workload churn, a NodePool edit (drift);
- permanent faults (permanent.py), each for a hold of its own, each with its own expectation:
  evictions denied (400) for a while, the ownership tag taken off the instance of a node karpflow
  is terminating (karpflow refuses; the tag comes back), and beside Karpenter a NodeClaim whose
  deletion a foreign finalizer holds.

With `karpenter=True` (`--karpenter`) the stack runs the simulated Karpenter
(sim/controllers/karpenter/) and the workers run in coexistence mode: replacements are NodeClaims,
terminations are handed to Karpenter, and convergence also asks that no NodeClaim is left deleting
or without its node.

Then it lifts the faults and waits until the cluster converges: the controller's status is quiet,
no workflow but the controller runs, no node carries the disrupted taint, every instance has its
node and every node its instance. The invariant checker (sim/invariants.py) judges the whole run.
The report (report.py) gives commands started / completed / rolled back, faults injected by kind,
every invariant counter, the time to converge and the seed: the timeline (schedule.py) and every
choice come from the seed, so a failure replays (`karpflow sim chaos --seed N`).
"""
