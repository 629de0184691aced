"""The simulated Karpenter's user data (sim/controllers/karpenter/userdata.py) read back by the
simulator's bootstrap reader: every family registers the NodeClaim's labels and taints, and
`karpenter.sh/unregistered`, as the AMI would (AL2023 carries them in `registerWithTaints`)."""

from __future__ import annotations

import pytest

from sim.controllers.bootstrap import BootError, read
from sim.controllers.karpenter.userdata import ClusterBootstrap, ami_family, user_data

CLUSTER = ClusterBootstrap("prod", "https://api.prod.example", "Q0EtREFUQQ==", "172.20.0.0/16")
LABELS = {"karpenter.sh/nodepool": "general", "team": "web"}
TAINTS = [
    {"key": "dedicated", "value": "web", "effect": "NoSchedule"},
    {"key": "agent.example.com/not-ready", "effect": "NoExecute"},
]


@pytest.mark.parametrize("family", ["AL2023", "AL2", "Bottlerocket"])
def test_every_family_registers_the_nodeclaims_labels_and_taints(family):
    boot = read(user_data(family, CLUSTER, LABELS, TAINTS, 58, None), cluster="prod")
    assert boot.labels == LABELS
    assert sorted((t["key"], t.get("value", ""), t["effect"]) for t in boot.taints) == [
        ("agent.example.com/not-ready", "", "NoExecute"),
        ("dedicated", "web", "NoSchedule"),
        ("karpenter.sh/unregistered", "", "NoExecute"),
    ]


def test_a_malformed_register_with_taints_entry_boots_nothing():
    bad = user_data("AL2023", CLUSTER, LABELS, [{"key": "dedicated"}], None, None)  # no effect
    with pytest.raises(BootError, match="registerWithTaints"):
        read(bad, cluster="prod")


@pytest.mark.parametrize(
    ("spec", "family"),
    [
        ({"amiFamily": "AL2"}, "AL2"),
        ({"amiSelectorTerms": [{"alias": "bottlerocket@latest"}]}, "Bottlerocket"),
        ({"amiSelectorTerms": [{"alias": "al2023@v20240807"}]}, "AL2023"),
        ({"amiSelectorTerms": [{"id": "ami-123"}]}, "Custom"),
    ],
)
def test_the_family_comes_from_the_class(spec, family):
    assert ami_family({"spec": spec}) == family


@pytest.mark.parametrize("family", ["AL2023", "AL2", "Bottlerocket"])
def test_labels_under_kubernetes_io_are_left_for_registration(family):
    """Karpenter's RejectForbiddenLabels (pkg/providers/amifamily/resolver.go): none of them reach
    the kubelet, its own ones neither; the NodeClaim's registration writes them."""
    labels = {
        **LABELS,
        "node-restriction.kubernetes.io/team": "a",
        "node.kubernetes.io/lifecycle": "normal",
        "other.k8s.io/x": "y",
    }
    boot = read(user_data(family, CLUSTER, labels, TAINTS, 58, None), cluster="prod")
    assert boot.labels == LABELS
