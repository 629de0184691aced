import pytest

from sim.controllers.kubelet_flags import (
    FlagSyntaxError,
    format_node_labels,
    format_taints,
    parse_node_labels,
    parse_taints,
    refused_node_labels,
)


def test_labels_parse_like_the_kubelet_flag():
    assert parse_node_labels("karpenter.sh/nodepool=default, team=a,empty=") == {
        "karpenter.sh/nodepool": "default",
        "team": "a",
        "empty": "",
    }
    assert parse_node_labels(None) == {}
    assert parse_node_labels(" , ") == {}


@pytest.mark.parametrize("bad", ["novalue", "bad key=v", "k=bad value", "-k=v", "k=v!"])
def test_bad_labels_name_the_item(bad):
    with pytest.raises(FlagSyntaxError, match="--node-labels"):
        parse_node_labels(bad)


def test_taints_parse_with_and_without_value():
    assert parse_taints("dedicated=gpu:NoSchedule,example.com/startup:NoExecute") == [
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
        {"key": "example.com/startup", "effect": "NoExecute"},
    ]
    assert parse_taints("") == []


@pytest.mark.parametrize("bad", ["k=v", "k=v:Sometimes", ":NoSchedule", "bad key:NoSchedule"])
def test_bad_taints_are_refused(bad):
    with pytest.raises(FlagSyntaxError, match="taint"):
        parse_taints(bad, source="tag karpflow.io/node-taints")


def test_format_round_trips():
    labels = {"b": "2", "a": "1"}
    taints = [{"key": "a", "value": "x", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]
    assert format_node_labels(labels) == "a=1,b=2"
    assert parse_node_labels(format_node_labels(labels)) == labels
    assert parse_taints(format_taints(taints)) == taints


def test_the_kubelet_refuses_kubernetes_io_labels_outside_its_own():
    """kubernetes/kubernetes cmd/kubelet/app/options/options_test.go and
    plugin/pkg/admission/noderestriction/admission_test.go's label cases."""
    accepted = [
        "cloud.google.com/metadata-proxy-ready",
        "kubelet.kubernetes.io/foo",
        "foo.kubelet.kubernetes.io/foo",
        "node.kubernetes.io/foo",
        "foo.node.kubernetes.io/foo",
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "team",
        "notkubernetes.io/x",
    ]
    refused = [
        "beta.kubernetes.io/metadata-proxy-ready",
        "node-restriction.kubernetes.io/foo",
        "foo.node-restriction.kubernetes.io/foo",
        "other.kubernetes.io/foo",
        "other.k8s.io/foo",
        "node-role.kubernetes.io/worker",
    ]
    assert refused_node_labels(accepted) == []
    assert refused_node_labels(accepted + refused) == sorted(refused)
