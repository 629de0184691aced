"""The kubelet's rule for `--node-labels` (launch/kubelet_labels.py), on the kubelet's own cases.

From kubernetes/kubernetes cmd/kubelet/app/options/options_test.go `TestValidateKubeletFlags` and
plugin/pkg/admission/noderestriction/admission_test.go (`setAllowedCreateLabels`: every kubelet
label, each allowed prefix and a subdomain of it; `setForbiddenCreateLabels` /
`setForbiddenUpdateLabels`: node-restriction.kubernetes.io and other kubernetes.io / k8s.io keys).
"""

from __future__ import annotations

import pytest

from launch.kubelet_labels import KUBELET_LABEL_KEYS, for_kubelet, kubelet_may_set

ACCEPTED = [
    # options_test.go: outside kubernetes.io and k8s.io
    "cloud.google.com/metadata-proxy-ready",
    # admission_test.go: the allowed prefixes and their subdomains
    "kubelet.kubernetes.io/foo",
    "foo.kubelet.kubernetes.io/foo",
    "node.kubernetes.io/foo",
    "foo.node.kubernetes.io/foo",
    *sorted(KUBELET_LABEL_KEYS),
    # no prefix, another domain, a domain that only looks like kubernetes.io
    "team",
    "example.com/x",
    "karpenter.sh/nodepool",
    "karpenter.k8s.aws/instance-family",
    "notkubernetes.io/x",
    "kubernetes.io.example.com/x",
]
REFUSED = [
    # options_test.go
    "beta.kubernetes.io/metadata-proxy-ready",
    # admission_test.go
    "node-restriction.kubernetes.io/foo",
    "foo.node-restriction.kubernetes.io/foo",
    "other.kubernetes.io/foo",
    "other.k8s.io/foo",
    # what NodePools carry and kubelets refuse
    "node-role.kubernetes.io/worker",
    "kubernetes.io/role",
    "k8s.io/x",
    "kops.k8s.io/instancegroup",
    "topology.kubernetes.io/rack",
]


@pytest.mark.parametrize("key", ACCEPTED)
def test_the_kubelet_accepts(key):
    assert kubelet_may_set(key)


@pytest.mark.parametrize("key", REFUSED)
def test_the_kubelet_refuses(key):
    assert not kubelet_may_set(key)


def test_for_kubelet_keeps_what_the_kubelet_accepts():
    labels = {
        "node-restriction.kubernetes.io/team": "a",
        "example.com/x": "y",
        "node.kubernetes.io/pool": "b",
    }
    assert for_kubelet(labels) == {"example.com/x": "y", "node.kubernetes.io/pool": "b"}
