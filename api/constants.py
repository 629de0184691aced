"""Well-known Kubernetes names, kept identical to Karpenter v1 so YAML, dashboards and habits carry over."""

from __future__ import annotations

from typing import Final

# Groups and versions of the custom resources.
KARPENTER_GROUP = "karpenter.sh"
KARPENTER_VERSION = "v1"
AWS_GROUP = "karpenter.k8s.aws"
AWS_VERSION = "v1"
# karpflow's own custom resources (deploy/crds/): MaintenanceWindow and NodeDisruptionBudget.
KARPFLOW_GROUP = "karpflow.dev"
KARPFLOW_VERSION = "v1alpha1"
MAINTENANCE_WINDOW_KIND = "MaintenanceWindow"
NODE_DISRUPTION_BUDGET_KIND = "NodeDisruptionBudget"

# Taints.
DISRUPTED_TAINT_KEY = "karpenter.sh/disrupted"
# karpflow's own disruption taint, in place of Karpenter's when the worker runs beside Karpenter
# (--karpenter-coexistence): Karpenter strips `karpenter.sh/disrupted` from every node with a NodeClaim
# outside its own queue, and karpflow's crash cleanup then strips only its own key, so neither
# controller removes the other's (docs/running-beside-karpenter.md).
KARPFLOW_DISRUPTED_TAINT_KEY = "karpflow.dev/disrupted"
# Either key says a disruption is in flight, whoever holds it.
DISRUPTION_TAINT_KEYS = (DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY)
# v1beta1's disruption taint (`karpenter.sh/disruption=disrupting`), which an older controller may have
# left: it says the same (kube/disruption.py reads all three).
LEGACY_DISRUPTION_TAINT_KEY = "karpenter.sh/disruption"
LEGACY_DISRUPTION_TAINT_VALUE = "disrupting"
UNREGISTERED_TAINT_KEY = "karpenter.sh/unregistered"
NOT_READY_TAINT_KEY = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT_KEY = "node.kubernetes.io/unreachable"
# Taints the kubelet / cloud provider put on new nodes and remove themselves (not startup taints
# of the NodePool): a node is not initialized while it carries one.
KNOWN_EPHEMERAL_TAINT_KEYS = (
    NOT_READY_TAINT_KEY,
    UNREACHABLE_TAINT_KEY,
    "node.kubernetes.io/network-unavailable",
    "node.cloudprovider.kubernetes.io/uninitialized",
)

# Tolerations Kubernetes' DefaultTolerationSeconds admission plugin adds to every pod that lacks
# them: a pod stays 300 s on a node that turned NotReady or unreachable. Copy before changing one.
DEFAULT_POD_TOLERATIONS = (
    {"key": NOT_READY_TAINT_KEY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": UNREACHABLE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
)

# Finalizer.
TERMINATION_FINALIZER = "karpenter.sh/termination"

# Labels.
NODEPOOL_LABEL = "karpenter.sh/nodepool"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
INITIALIZED_LABEL = "karpenter.sh/initialized"
REGISTERED_LABEL = "karpenter.sh/registered"
DO_NOT_SYNC_TAINTS_LABEL = "karpenter.sh/do-not-sync-taints"
EXCLUDE_LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
HOSTNAME_LABEL = "kubernetes.io/hostname"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
ARCH_LABEL = "kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"
# Karpenter's NodeClass label (`<group>/<kind, lowercase>`): Karpenter's node termination controller
# acts on every deleting Node that carries it and the termination finalizer.
EC2NODECLASS_LABEL = "karpenter.k8s.aws/ec2nodeclass"
EC2NODECLASS_KIND = "EC2NodeClass"

# Annotations.
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"
LEGACY_DO_NOT_EVICT_ANNOTATION = "karpenter.sh/do-not-evict"  # v1alpha5, on pods
LEGACY_DO_NOT_CONSOLIDATE_ANNOTATION = "karpenter.sh/do-not-consolidate"  # v1alpha5, on nodes
NODEPOOL_HASH_ANNOTATION = "karpenter.sh/nodepool-hash"
NODEPOOL_HASH_VERSION_ANNOTATION = "karpenter.sh/nodepool-hash-version"
NODECLASS_HASH_ANNOTATION = "karpenter.k8s.aws/ec2nodeclass-hash"
NODECLASS_HASH_VERSION_ANNOTATION = "karpenter.k8s.aws/ec2nodeclass-hash-version"
TERMINATION_TIMESTAMP_ANNOTATION = "karpenter.sh/nodeclaim-termination-timestamp"
POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
# A node's own opt-out of node repair (its unhealthy conditions are left to the operator): karpflow's,
# not Karpenter's (its repair RFC #3192 leaves a veto's shape open; docs/karpenter-versions.md).
DO_NOT_REPAIR_ANNOTATION = "karpenter.sh/do-not-repair"
# karpflow's markers on nodes (written by karpflow only): who holds the disrupted taint and why.
HOLDER_ANNOTATION = "karpflow.io/disruption-command"
HOLDER_REASON_ANNOTATION = "karpflow.io/disruption-reason"
# The controller writes it when a MaintenanceWindow defers a node's expiration: once the window allows
# it, that node's expiration is paced by budgets and NodeDisruptionBudgets like a voluntary method.
EXPIRATION_DEFERRED_ANNOTATION = "karpflow.io/expiration-deferred"
# A RolloutWorkflow marks the nodes it replaces (<rollout workflow id>): drift takes them.
ROLLOUT_ANNOTATION = "karpflow.dev/rollout-requested"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

# Capacity types.
CAPACITY_SPOT: Final = "spot"
CAPACITY_ON_DEMAND: Final = "on-demand"
CAPACITY_RESERVED: Final = "reserved"
# A reserved node's reservation (aws/karpenter-provider-aws pkg/apis/v1/labels.go: the id since v1.3,
# the type, default or capacity-block, since v1.6, interruptible since v1.10); only reserved nodes
# carry them.
CAPACITY_RESERVATION_ID_LABEL: Final = "karpenter.k8s.aws/capacity-reservation-id"
CAPACITY_RESERVATION_TYPE_LABEL: Final = "karpenter.k8s.aws/capacity-reservation-type"
CAPACITY_RESERVATION_INTERRUPTIBLE_LABEL: Final = "karpenter.k8s.aws/capacity-reservation-interruptible"

# Disruption reasons that budgets may name, plus the forceful ones that they never gate.
REASON_UNDERUTILIZED = "Underutilized"
REASON_EMPTY = "Empty"
REASON_DRIFTED = "Drifted"
BUDGET_REASONS = (REASON_UNDERUTILIZED, REASON_EMPTY, REASON_DRIFTED)
REASON_EXPIRED = "Expired"
REASON_INTERRUPTED = "Interrupted"
REASON_UNHEALTHY = "Unhealthy"
# karpflow's finalizer on NodePools: a NodePool being deleted stays until its nodes are gone, so the
# controller can terminate them (Karpenter gets this cascade from NodeClaim owner references).
NODEPOOL_FINALIZER = "karpflow.io/nodepool-nodes"
REASON_NODEPOOL_DELETED = "NodePoolDeleted"
REASON_MANUAL = "Manual"

# Priority classes whose pods drain last.
CRITICAL_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")

# EC2 tags. Ownership is `kubernetes.io/cluster/<cluster-name>: owned` together with
# `karpenter.sh/nodepool` (the cluster tag alone is on EKS node groups' instances too), checked in
# code before any terminate, not only in IAM.
CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"
CLUSTER_TAG_VALUE = "owned"
TAG_NODEPOOL = "karpenter.sh/nodepool"
TAG_NODECLASS = "karpenter.k8s.aws/ec2nodeclass"
TAG_COMMAND_ID = "karpflow.io/command-id"
TAG_REPLACEMENT_INDEX = "karpflow.io/replacement-index"
TAG_NODE_NAME = "Name"
# What Karpenter's AWS provider lists its instances by (with the two tag keys above), and the tag its
# tagging controller adds once the NodeClaim has a Node.
TAG_EKS_CLUSTER_NAME = "eks:eks-cluster-name"
TAG_NODECLAIM = "karpenter.sh/nodeclaim"
# The capacity type asked for (spot requests are not always visible as InstanceLifecycle at once).
# Labels and taints are not tags: they travel in the bootstrap user data, as on a real node.
TAG_CAPACITY_TYPE = "karpflow.io/capacity-type"


def disrupted_taint_key(karpenter_coexistence: bool) -> str:
    """The disruption taint karpflow writes (and its crash cleanup removes) in its mode."""
    return KARPFLOW_DISRUPTED_TAINT_KEY if karpenter_coexistence else DISRUPTED_TAINT_KEY


def cluster_tag(cluster_name: str) -> str:
    return f"{CLUSTER_TAG_PREFIX}{cluster_name}"


def aws_provider_id(zone: str, instance_id: str) -> str:
    """A Node's spec.providerID for an EC2 instance, as the AWS cloud provider writes it."""
    return f"aws:///{zone}/{instance_id}"
