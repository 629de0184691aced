"""The simulated kube-scheduler's default profile, written from kubernetes/kubernetes (read at the
v1.33-v1.35 sources; the plugins' behaviour these modules reproduce has not changed across them):

- pkg/scheduler/apis/config/v1/default_plugins.go — the plugins and their score weights;
- pkg/scheduler/framework/plugins/nodeunschedulable, tainttoleration, nodeaffinity, nodeports,
  noderesources/fit.go — the node-local filters (sim/controllers/predicates.py);
- pkg/scheduler/framework/plugins/interpodaffinity/{filtering,scoring,plugin}.go (interpod.py);
- pkg/scheduler/framework/plugins/podtopologyspread/{common,filtering,scoring,plugin}.go and
  plugins/helper/spread.go (spread.py, terms.py);
- pkg/scheduler/framework/plugins/noderesources/{least_allocated,balanced_allocation,
  resource_allocation}.go, tainttoleration/taint_toleration.go, nodeaffinity/node_affinity.go,
  helper/normalize_score.go (scores.py);
- pkg/scheduler/framework/types.go — AffinityTerm, NodeInfo, the FitError message (terms.py,
  cache.py, group.py).

The modules:
  terms.py      pod (anti-)affinity terms, spread constraints, the default spread selector
  cache.py      the pods that count on nodes, indexed by node, namespace, label and affinity terms;
                the change log of a pass
  snapshot.py   one pass's nodes as arrays, label values as ids
  context.py    what the groups of a pass share (memos of the node-local filters)
  spread.py     PodTopologySpread's filter and score for one group
  interpod.py   InterPodAffinity's filter and score for one group
  scores.py     the score arithmetic and normalizations
  group.py      one group of identical pending pods: filters, scores, the chosen node, the message
sim/controllers/scheduler.py is the controller that feeds them and binds.

The simulator is the referee: none of this shares code with karpflow's planner (planner/scheduling/)
or kube/selectors.py; label selectors are the emulator's own (sim/apiserver/selectors.py).
"""
