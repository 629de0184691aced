import pytest

from sim.controllers.kubelet_flags import (
    FlagSyntaxError,
    format_node_labels,
    format_taints,
    parse_node_labels,
    parse_taints,
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
