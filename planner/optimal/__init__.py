"""Optimal consolidation: plan toward the cheapest fleet, not only the next cheaper step.

Karpenter's consolidation is greedy and local: each pass deletes or replaces what one simulation
probe finds strictly cheaper. This opt-in strategy (a NodePool annotated
`karpflow.dev/consolidation-strategy: Optimal`) decides the whole target first, lays it out pod by
pod, and walks toward it in ordinary, budgeted commands, one plan held across passes on the nodes
themselves. Each pass (docs/optimal-consolidation.md has the whole story):

1. `fleet.py`: the problem, read off the scheduling simulation's prepared view: the pods that may
   move, grouped; the room of the nodes that may take them; what new nodes may be launched.
2. `held.py`: the plan the nodes hold (`karpflow.io/optimal-plan` markers on its leaving and launched
   nodes), and its ledger: what it has added to the cluster's cost so far, never above zero.
3. `solver.py`: the programs (HiGHS), under `PlanOptions.optimal_time_limit`: the **target** (which
   candidates to keep, which instance types to launch, at the least hourly cost plus a price per pod
   moved; a held plan's removals are fixed), its **layout** (which node each pod goes to, whole
   pods), and this pass's **move** (the leaving nodes to remove now within budgets, PDB allowances
   and the ledger, and the new nodes their pods need).
4. `layout.py`: the rest of the plan placed at once by the simulation, each pod preferring its
   planned node: one destination per pod that stays, so pods move once.
5. `moves.py`: the move checked by the simulation on its own: one command (delete or replace with
   several new nodes), whose new nodes carry the plan's marker.
6. `leaving.py`: the leaving nodes are tainted `karpflow.io/leaving:PreferNoSchedule`, so the
   kube-scheduler does not put evicted pods on them.
7. `method.py`: the Method (`OptimalConsolidation`) in the pass, before Karpenter's multi- and
   single-node consolidation, which run when it holds or finds no plan; its validation after the
   15 s wait.

The plan is checked again every pass on what really happened (the kube-scheduler, not the plan,
places evicted pods): its launches are re-solved and the whole rest placed again; a plan whose rest
no longer fits or saves is dropped, and the next one starts from where the pods landed.
"""
