"""karpflow's bootstrap writer (launch/userdata.py) read back by the simulator's own reader
(sim/controllers/bootstrap.py), which is written apart from it: what one family writes, the other
understands as the AMI would, or the test fails."""

from __future__ import annotations

import pytest

from launch.userdata import ClusterInfo, NodeBootstrap, generate
from sim.controllers.bootstrap import BootError, read

CLUSTER = ClusterInfo("prod", "https://api.prod.example", "Q0EtREFUQQ==", "172.20.0.0/16")
NODE = NodeBootstrap(
    nodepool="general",
    labels={"team": "web", "karpenter.sh/capacity-type": "spot"},
    taints=["dedicated=web:NoSchedule"],
    startup_taints=["agent.example.com/not-ready:NoExecute"],
    kubelet={"maxPods": 58},
)
USER_DATA = {
    "AL2023": "#!/bin/bash\necho 'the user was here'\n",
    "AL2": "#!/bin/bash\necho 'the user was here'\n",
    "Bottlerocket": (
        '[settings.host-containers.admin]\nenabled = true\n[settings.kubernetes]\ncluster-name = "other"\n'
    ),
}


@pytest.mark.parametrize("family", ["AL2023", "AL2", "Bottlerocket"])
@pytest.mark.parametrize("with_user_data", [False, True])
def test_every_family_boots_a_kubelet_with_the_nodepools_labels_and_taints(family, with_user_data):
    written = generate(family, CLUSTER, NODE, USER_DATA[family] if with_user_data else None)
    boot = read(written, cluster="prod", endpoint="https://api.prod.example")
    assert (boot.cluster, boot.endpoint, boot.ca) == ("prod", "https://api.prod.example", "Q0EtREFUQQ==")
    assert boot.labels == {
        "team": "web",
        "karpenter.sh/capacity-type": "spot",
        "karpenter.sh/nodepool": "general",
    }
    assert sorted((t["key"], t.get("value", ""), t["effect"]) for t in boot.taints) == [
        ("agent.example.com/not-ready", "", "NoExecute"),
        ("dedicated", "web", "NoSchedule"),
        ("karpenter.sh/unregistered", "", "NoExecute"),
    ]


def test_custom_user_data_is_the_users_alone():
    with pytest.raises(BootError, match="names no cluster"):
        read(generate("Custom", CLUSTER, NODE, USER_DATA["AL2"]), cluster="prod")


@pytest.mark.parametrize(
    ("cluster", "endpoint", "why"),
    [
        ("other", None, "joins cluster 'prod', not 'other'"),
        ("prod", "https://elsewhere", "not this cluster's"),
    ],
)
def test_a_node_joins_only_the_cluster_and_endpoint_it_is_told(cluster, endpoint, why):
    with pytest.raises(BootError, match=why):
        read(generate("AL2023", CLUSTER, NODE, None), cluster=cluster, endpoint=endpoint)


def test_no_user_data_boots_nothing():
    with pytest.raises(BootError, match="no user data"):
        read(None, cluster="prod")


@pytest.mark.parametrize("family", ["AL2023", "AL2", "Bottlerocket"])
def test_a_secure_cluster_takes_only_nodes_given_its_own_ca(family):
    """CLUSTER's bundle is base64 of b"CA-DATA": the kubelet trusts that CA and no other."""
    written = generate(family, CLUSTER, NODE, None)
    assert read(written, cluster="prod", ca_pem=b"CA-DATA").ca == "Q0EtREFUQQ=="
    with pytest.raises(BootError, match="did not sign the API server's certificate"):
        read(written, cluster="prod", ca_pem=b"ANOTHER CA")
