"""Optimal consolidation: plan toward the cheapest fleet, not only the next cheaper step.

Karpenter's consolidation is greedy and local: each pass deletes or replaces what one simulation
probe finds strictly cheaper. This opt-in strategy (a NodePool annotated
`karpflow.dev/consolidation-strategy: Optimal`) decides the whole target first, then walks toward it
in ordinary, budgeted commands. Each pass (docs/optimal-consolidation.md has the whole story):

1. `fleet.py`: the problem, read off the scheduling simulation's prepared view: the pods that may
   move, grouped; the room of the nodes that may take them; what new nodes may be launched.
2. `solver.py`: two mixed-integer programs (HiGHS), under `PlanOptions.optimal_time_limit`, each
   started from "change nothing" so it always has an answer: the **target** (which candidates to
   keep, which instance types to launch, at the least hourly cost), then this pass's **step** (the
   target's removals to start now within budgets and PDB allowances, and the launches they need,
   saving the most now). Two programs, because the target is what the fleet should become and the
   step is what may happen before the next pass re-plans on what really happened.
3. `moves.py`: the step checked by the simulation with its new nodes added and every node the target
   removes taken out, so pods are only planned onto nodes that stay: one command (delete or replace
   with several new nodes), strictly cheaper, and above the pools' savings floor.
4. `leaving.py`: the nodes the target removes in later passes are tainted
   `karpflow.io/leaving:PreferNoSchedule`, so the kube-scheduler does not put evicted pods on them.
5. `method.py`: the Method (`OptimalConsolidation`) in the pass, before Karpenter's multi- and
   single-node consolidation, which run when it finds nothing; its validation after the 15 s wait.

Re-planning every pass is what keeps it honest: the kube-scheduler, not the plan, places evicted
pods, and the next target starts from where they landed.
"""
