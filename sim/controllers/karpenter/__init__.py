"""A simulated Karpenter beside karpflow: off by default, on with `SimStack(karpenter=True)` or
`karpflow dev up --karpenter-neighbour`.

It is the simulator's own implementation of the Karpenter behaviour that matters to a controller
running beside Karpenter, written from Karpenter's code (kubernetes-sigs/karpenter and
aws/karpenter-provider-aws) and not from karpflow's, so that it can judge karpflow:

    neighbour.py    the loop; instance and NodeClaim garbage collection; the disruption loop's
                    crash cleanup of `karpenter.sh/disrupted`
    nodeclaims.py   the NodeClaim lifecycle: finalizer, launch, registration, initialization,
                    liveness, and the NodeClaim's own termination
    conditions.py   status conditions as operatorpkg sets them (Ready from Launched, Registered,
                    Initialized)
    launch.py       what a NodeClaim is launched on, and how (offerings, AMI, tags)
    userdata.py     the bootstrap user data per AMI family
    termination.py  node termination: drain through the Eviction API, instance, finalizer
    seed.py         NodeClaims for a scenario's nodes, as Karpenter would have launched them

What it does that karpflow must survive (an instance garbage-collected, a disruption taint removed
while a karpflow command held it) is also reported to the invariant checker.
"""

from sim.controllers.karpenter.neighbour import KarpenterNeighbour, KarpenterTimings
from sim.controllers.karpenter.userdata import ClusterBootstrap

__all__ = ["ClusterBootstrap", "KarpenterNeighbour", "KarpenterTimings"]
