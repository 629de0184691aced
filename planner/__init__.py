"""karpflow's decision engine: pure functions from cluster state to disruption commands (no I/O).

Where each rule lives (section numbers refer to the Karpenter behaviour notes):
- snapshot.py      the typed cluster view loaded from kubectl output or the API (slim objects)
- catalog.py       instance types, allocatable arithmetic and prices (catalog_live.py: from AWS);
                   node_overlay.py each NodePool's view of it under Karpenter's NodeOverlays
- candidates.py    which nodes may be disrupted, pod blocks, disruption cost, Consolidatable (§1.3-1.6)
- budgets.py       NodePool disruption budgets (§1.5); rate_budgets.py their karpflow `per` (a rate)
- maintenance_windows.py, node_disruption_budgets.py   the operator's controls, applied in a pass by
                   operator_controls.py (docs/operator-controls.md); controls_report.py and
                   windows_cli.py are `karpflow windows`
- expiration.py    expireAfter, forceful (§7.1)
- emptiness.py     empty-node deletion and its validation (§2.1)
- drift.py         drift detection, the NodePool hash, the Drift method (§6)
- consolidation.py multi- and single-node consolidation (§2.2-2.5); scheduling/ the simulation (§2.6)
                   (opt-in max_replacements extension: several new nodes, packed by scheduling/packing.py)
- plan.py          one pass: `plan(snapshot, catalog, options) -> Plan`; cli.py is `karpflow plan`
- model.py         the shared types: Candidate, Command, Replacement, BudgetMap, Method, Simulate
- legacy.py        Provisioner-era and v1beta1 settings mapped onto v1 NodePools
"""
