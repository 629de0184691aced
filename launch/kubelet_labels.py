"""Which NodePool labels a replacement's kubelet may be told, and which wait for registration.

A kubelet given `--node-labels` (nodeadm's `kubelet.flags`, bootstrap.sh's `--kubelet-extra-args`,
Bottlerocket's `settings.kubernetes.node-labels`) checks them before it starts
(kubernetes/kubernetes cmd/kubelet/app/options/options.go `ValidateKubeletFlags`): a key whose
prefix is `kubernetes.io` or `k8s.io`, or a subdomain of either, is refused unless the kubelet may
set it on its own Node (staging/src/k8s.io/kubelet/pkg/apis/well_known_labels.go `IsKubeletLabel`:
a fixed set of keys, and the `kubelet.kubernetes.io` and `node.kubernetes.io` prefixes with their
subdomains). One refused key and the kubelet exits: the node never registers. So
`node-restriction.kubernetes.io/team` (the prefix the NodeRestriction admission plugin keeps for
labels only an administrator sets) and `node-role.kubernetes.io/worker` must not be in user data.

Karpenter's AWS provider leaves such labels out of user data (pkg/providers/amifamily/resolver.go
`RejectForbiddenLabels`, which drops every `kubernetes.io`/`k8s.io` label, the kubelet's own too)
and its registration writes all of the NodeClaim's labels on the Node
(kubernetes-sigs/karpenter pkg/controllers/nodeclaim/lifecycle/registration.go `syncNode`).
karpflow keeps what the kubelet accepts in user data, so a node's labels are there from its first
moment when they can be, and `await_node_registered` (activities/node_registration.py) writes every
NodePool label, these included, before it removes `karpenter.sh/unregistered`.
"""

from __future__ import annotations

from collections.abc import Mapping

# The keys a kubelet may set whatever their prefix (IsKubeletLabel's fixed set: k8s.io/api core/v1
# well_known_labels.go, and the two beta OS/arch keys of the kubelet's own apis package).
KUBELET_LABEL_KEYS = frozenset(
    {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    }
)
# Prefixes under which a kubelet may set any key: these domains and their subdomains.
KUBELET_LABEL_DOMAINS = ("kubelet.kubernetes.io", "node.kubernetes.io")
# Prefixes the kubelet guards: these domains and their subdomains.
KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io")


def _under(prefix: str, domain: str) -> bool:
    return prefix == domain or prefix.endswith("." + domain)


def kubelet_may_set(key: str) -> bool:
    """Whether a kubelet starts with this label key in `--node-labels`."""
    if key in KUBELET_LABEL_KEYS:
        return True
    prefix = key.split("/", 1)[0] if "/" in key else ""
    if not any(_under(prefix, domain) for domain in KUBERNETES_DOMAINS):
        return True
    return any(_under(prefix, domain) for domain in KUBELET_LABEL_DOMAINS)


def for_kubelet(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a kubelet may be told; the others are written at registration."""
    return {key: value for key, value in labels.items() if kubelet_may_set(key)}
