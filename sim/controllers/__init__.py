"""The simulated cluster's controllers (kwok-like): what kubelets, kube-scheduler, kube-controller-manager
and the cloud node lifecycle controller would do, driven by EC2 instances in moto and the emulator's
object store.

Entry point: `runner.SimControllers(store, ec2_endpoint=..., cluster_name=..., region=..., timescale=...,
enabled=..., faults=..., node_timings=NodeTimings(...), pod_start_seconds=..., ec2_source="auto")`,
then `await .start()` / `await .stop()` on the emulator's loop.

One module per job:
    nodes.py        EC2 instance → Node: register, Ready, startup taints off; gone → NotReady → deleted
    noexecute_taints.py  the node lifecycle controller's not-ready / unreachable NoExecute taints
    taint_eviction.py    the taint manager: pods deleted after their NoExecute tolerationSeconds
    node_objects.py the Node a kubelet would post (names, labels, taints, capacity) — the conventions
    ec2_view.py     how instances are listed (EC2 API over HTTP, or moto's backend in process)
    scheduler.py    binds Pending pods (filters in predicates.py, LeastAllocated scoring)
    kubelet.py      bound pods on Ready nodes become Running and Ready
    podgc.py        pods of deleted nodes are marked Failed and force-deleted after a 40 s quarantine
    workloads.py    ReplicaSets and Deployments
    daemonsets.py   one pod per eligible node (a node being deleted is still eligible)
    pdb.py          PodDisruptionBudget status (the emulator's arithmetic)
    informer.py     the one cache they share;  timers.py  delayed actions
EC2 faults (ICE, throttling, never-ready) live in `sim/ec2_faults.py`.
"""
