"""Golden tests: the bootstrap user data, parsed back the way each AMI would read it."""

import email
import re
import shlex
import tomllib

import pytest
import yaml

from launch.userdata import ClusterInfo, NodeBootstrap, generate
from sim.controllers import bootstrap as sim_bootstrap

CLUSTER = ClusterInfo(
    name="prod", endpoint="https://ABC.eks.amazonaws.com", ca_bundle="Q0EK", service_cidr="172.20.0.0/16"
)
NODE = NodeBootstrap(
    nodepool="general",
    labels={"team": "web", "tier": "front"},
    taints=["dedicated=web:NoSchedule"],
    startup_taints=["node.cilium.io/agent-not-ready:NoExecute"],
    kubelet={"maxPods": 58, "clusterDNS": ["172.20.0.10"]},
)
TAINTS = [
    "dedicated=web:NoSchedule",
    "node.cilium.io/agent-not-ready:NoExecute",
    "karpenter.sh/unregistered:NoExecute",
]


NODECONFIG = (
    "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    config:\n      maxPods: 10"
)


def _parts(user_data: str) -> list[tuple[str, str]]:
    message = email.message_from_string(user_data)
    assert message.is_multipart()
    return [
        (p.get_content_type(), p.get_payload(decode=True).decode())
        for p in message.walk()
        if not p.is_multipart()
    ]


def _flags(flags: list[str]) -> dict[str, str]:
    return dict(f.removeprefix("--").split("=", 1) for f in flags)


def test_al2023_nodeconfig_carries_cluster_labels_taints_and_kubelet_config():
    parts = _parts(generate("AL2023", CLUSTER, NODE, None))
    assert [t for t, _ in parts] == ["application/node.eks.aws"]
    config = yaml.safe_load(parts[0][1])
    assert config["kind"] == "NodeConfig"
    assert config["spec"]["cluster"] == {
        "name": "prod",
        "apiServerEndpoint": "https://ABC.eks.amazonaws.com",
        "certificateAuthority": "Q0EK",
        "cidr": "172.20.0.0/16",
    }
    assert config["spec"]["kubelet"]["config"] == {"maxPods": 58, "clusterDNS": ["172.20.0.10"]}
    flags = _flags(config["spec"]["kubelet"]["flags"])
    assert flags["node-labels"] == "karpenter.sh/nodepool=general,team=web,tier=front"
    assert flags["register-with-taints"].split(",") == TAINTS


@pytest.mark.parametrize(
    "user_data, expected",
    [
        ("#!/bin/bash\necho hello\n", [("text/x-shellscript", "#!/bin/bash\necho hello\n")]),
        (
            'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="B"\n\n--B\n'
            "Content-Type: text/x-shellscript\n\necho one\n--B\nContent-Type: application/node.eks.aws\n\n"
            f"{NODECONFIG}\n--B--\n",
            [
                ("text/x-shellscript", "echo one"),
                (
                    "application/node.eks.aws",
                    NODECONFIG,
                ),
            ],
        ),
    ],
)
def test_al2023_user_parts_come_first_and_survive(user_data, expected):
    parts = _parts(generate("AL2023", CLUSTER, NODE, user_data))
    assert [(t, p.strip()) for t, p in parts[:-1]] == [(t, p.strip()) for t, p in expected]
    assert yaml.safe_load(parts[-1][1])["spec"]["cluster"]["name"] == "prod"


def test_bottlerocket_settings_kubernetes_and_user_toml_survives():
    user = (
        '[settings.kubernetes]\ncluster-name = "wrong"\nallowed-unsafe-sysctls = ["net.core.somaxconn"]\n'
        "\n[settings.host-containers.admin]\nenabled = true\n"
    )
    settings = tomllib.loads(generate("Bottlerocket", CLUSTER, NODE, user))["settings"]
    kube = settings["kubernetes"]
    assert kube["cluster-name"] == "prod"
    assert kube["api-server"] == "https://ABC.eks.amazonaws.com"
    assert kube["cluster-certificate"] == "Q0EK"
    assert kube["max-pods"] == 58
    assert kube["node-labels"] == {"karpenter.sh/nodepool": "general", "team": "web", "tier": "front"}
    assert kube["node-taints"] == {
        "dedicated": ["web:NoSchedule"],
        "node.cilium.io/agent-not-ready": [":NoExecute"],
        "karpenter.sh/unregistered": [":NoExecute"],
    }
    assert kube["allowed-unsafe-sysctls"] == ["net.core.somaxconn"]
    assert settings["host-containers"]["admin"]["enabled"] is True


def test_al2_bootstrap_flags_and_user_script_first():
    parts = _parts(generate("AL2", CLUSTER, NODE, "#!/bin/bash\necho mine\n"))
    assert parts[0] == ("text/x-shellscript", "#!/bin/bash\necho mine\n")
    line = next(x for x in parts[-1][1].splitlines() if x.startswith("/etc/eks/bootstrap.sh"))
    argv = shlex.split(line)
    assert argv[1] == "prod"
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert opts["--apiserver-endpoint"] == "https://ABC.eks.amazonaws.com"
    assert opts["--b64-cluster-ca"] == "Q0EK"
    assert opts["--dns-cluster-ip"] == "172.20.0.10"
    extra = dict(re.findall(r"--([\w-]+)=(\S+)", opts["--kubelet-extra-args"]))
    assert extra["node-labels"] == "karpenter.sh/nodepool=general,team=web,tier=front"
    assert extra["register-with-taints"].split(",") == TAINTS
    assert extra["max-pods"] == "58"


def test_custom_is_untouched():
    assert generate("Custom", CLUSTER, NODE, "anything at all") == "anything at all"


def test_unknown_family_is_refused():
    with pytest.raises(ValueError):
        generate("Windows2022", CLUSTER, NODE, None)


FULL_KUBELET = {
    "podsPerCore": 4,
    "systemReserved": {"cpu": "100m", "memory": "100Mi"},
    "kubeReserved": {"cpu": "200m", "memory": "1Gi"},
    "evictionHard": {"memory.available": "5%"},
    "evictionSoft": {"memory.available": "10%"},
    "evictionSoftGracePeriod": {"memory.available": "1m0s"},
    "evictionMaxPodGracePeriod": 60,
    "imageGCHighThresholdPercent": 85,
    "imageGCLowThresholdPercent": 80,
    "cpuCFSQuota": False,
}


def _al2_extra_args(node: NodeBootstrap) -> tuple[dict[str, str], dict[str, str]]:
    script = _parts(generate("AL2", CLUSTER, node, None))[-1][1]
    argv = shlex.split(next(x for x in script.splitlines() if x.startswith("/etc/eks/bootstrap.sh")))
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    return opts, dict(f.removeprefix("--").split("=", 1) for f in opts["--kubelet-extra-args"].split())


def test_al2_tells_the_kubelet_the_instance_types_max_pods_with_use_max_pods_false():
    opts, extra = _al2_extra_args(NodeBootstrap(nodepool="general", max_pods=29))
    assert opts["--use-max-pods"] == "false" and extra["max-pods"] == "29"
    # Knowing no max pods, bootstrap.sh is left to compute them (never 110 by omission).
    opts, extra = _al2_extra_args(NodeBootstrap(nodepool="general"))
    assert "--use-max-pods" not in opts and "max-pods" not in extra


def test_al2_passes_every_kubelet_setting_as_a_kubelet_flag():
    opts, extra = _al2_extra_args(NodeBootstrap(nodepool="general", kubelet=FULL_KUBELET, max_pods=29))
    assert extra["system-reserved"] == "cpu=100m,memory=100Mi"
    assert extra["kube-reserved"] == "cpu=200m,memory=1Gi"
    assert extra["eviction-hard"] == "memory.available<5%"
    assert extra["eviction-soft"] == "memory.available<10%"
    assert extra["eviction-soft-grace-period"] == "memory.available=1m0s"
    assert extra["eviction-max-pod-grace-period"] == "60"
    assert (extra["image-gc-high-threshold"], extra["image-gc-low-threshold"]) == ("85", "80")
    assert extra["cpu-cfs-quota"] == "false" and extra["pods-per-core"] == "4"
    assert opts["--dns-cluster-ip"] == "172.20.0.10"


def test_bottlerocket_merges_the_users_node_labels_and_takes_every_kubelet_setting():
    user = '[settings.kubernetes.node-labels]\n"example.com/rack" = "r1"\nteam = "theirs"\n'
    node = NodeBootstrap(nodepool="general", labels={"team": "web"}, kubelet=FULL_KUBELET, max_pods=29)
    kube = tomllib.loads(generate("Bottlerocket", CLUSTER, node, user))["settings"]["kubernetes"]
    assert kube["node-labels"] == {
        "example.com/rack": "r1",
        "team": "web",
        "karpenter.sh/nodepool": "general",
    }
    assert kube["max-pods"] == 29
    assert kube["cluster-dns-ip"] == "172.20.0.10"
    assert kube["system-reserved"] == {"cpu": "100m", "memory": "100Mi"}
    assert kube["kube-reserved"] == {"cpu": "200m", "memory": "1Gi"}
    assert kube["eviction-hard"] == {"memory.available": "5%"}
    assert kube["eviction-soft"] == {"memory.available": "10%"}
    assert kube["eviction-soft-grace-period"] == {"memory.available": "1m0s"}
    assert kube["eviction-max-pod-grace-period"] == 60
    assert kube["image-gc-high-threshold-percent"] == "85"
    assert kube["cpu-cfs-quota-enforced"] is False


def test_al2023_defaults_max_pods_and_cluster_dns_in_the_kubelet_config():
    config = yaml.safe_load(
        _parts(generate("AL2023", CLUSTER, NodeBootstrap("general", max_pods=29), None))[0][1]
    )
    assert config["spec"]["kubelet"]["config"] == {"maxPods": 29, "clusterDNS": ["172.20.0.10"]}


def test_instance_store_raid0_in_each_familys_words():
    node = NodeBootstrap(nodepool="general", instance_store_policy="RAID0")
    nodeconfig = yaml.safe_load(_parts(generate("AL2023", CLUSTER, node, None))[-1][1])
    assert nodeconfig["spec"]["instance"] == {"localStorage": {"strategy": "RAID0"}}
    assert _al2_extra_args(node)[0]["--local-disks"] == "raid0"
    settings = tomllib.loads(generate("Bottlerocket", CLUSTER, node, None))["settings"]
    command = settings["bootstrap-commands"]["000-mount-instance-storage"]
    assert command["commands"][0] == ["apiclient", "ephemeral-storage", "init"] and command["essential"]


@pytest.mark.parametrize(
    "user_data",
    ['settings = "x"\n', "[settings]\nkubernetes = 1\n", '[settings.kubernetes]\nnode-labels = "a"\n'],
)
def test_bottlerocket_user_data_with_a_scalar_where_a_table_goes_is_refused_as_invalid(user_data):
    """Found by the fuzz tests: these raised AttributeError/TypeError, which the launch activity does
    not answer as a bad EC2NodeClass (ValueError: permanent INVALID) but retries."""
    with pytest.raises(ValueError, match="must be a TOML table"):
        generate("Bottlerocket", CLUSTER, NodeBootstrap(nodepool="p"), user_data)


@pytest.mark.parametrize(
    ("user_data", "key", "value"),
    [('"é" = 1\n', "é", 1), ('a = "x\\ny\\u0001\\u007f"\n', "a", "x\ny\x01\x7f"), ('"a\\n" = 2\n', "a\n", 2)],
)
def test_bottlerocket_keeps_the_users_keys_and_strings_valid_toml(user_data, key, value):
    """Found by the fuzz tests: a non-ASCII key was written bare and a string's newline raw, so the
    instance got user data Bottlerocket cannot parse."""
    settings = tomllib.loads(generate("Bottlerocket", CLUSTER, NodeBootstrap(nodepool="p"), user_data))
    assert settings[key] == value


# The kubelet refuses to start with node-restriction.kubernetes.io and node-role.kubernetes.io
# labels (launch/kubelet_labels.py); registration writes those. The others go to the kubelet.
GUARDED = NodeBootstrap(
    nodepool="general",
    labels={
        "node-restriction.kubernetes.io/team": "a",
        "node-role.kubernetes.io/worker": "",
        "example.com/x": "y",
        "node.kubernetes.io/lifecycle": "normal",
    },
)
TOLD = {"example.com/x": "y", "node.kubernetes.io/lifecycle": "normal", "karpenter.sh/nodepool": "general"}


def _node_labels(flag: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in flag.split(","))


def _kubelet_labels(family: str, user_data: str) -> dict[str, str]:
    """The labels the family's bootstrap hands the kubelet, read as that AMI reads them."""
    if family == "Bottlerocket":
        return tomllib.loads(user_data)["settings"]["kubernetes"]["node-labels"]
    if family == "AL2":
        _, extra = _al2_extra_args(GUARDED)
        return _node_labels(extra["node-labels"])
    config = yaml.safe_load(_parts(user_data)[-1][1])
    return _node_labels(_flags(config["spec"]["kubelet"]["flags"])["node-labels"])


@pytest.mark.parametrize("family", ["AL2023", "AL2", "Bottlerocket"])
def test_every_family_tells_the_kubelet_only_the_labels_it_accepts(family):
    user_data = generate(family, CLUSTER, GUARDED, None)
    assert _kubelet_labels(family, user_data) == TOLD
    assert "node-restriction.kubernetes.io" not in user_data and "node-role" not in user_data
    # The simulator's own reader (the referee) boots a kubelet from it.
    assert sim_bootstrap.read(user_data, cluster=CLUSTER.name).labels == TOLD


def test_bottlerocket_keeps_the_users_own_node_labels_as_written():
    """The user's TOML is theirs (Karpenter merges into it too): only karpflow's labels are filtered."""
    user = '[settings.kubernetes.node-labels]\n"mine.example.com/a" = "1"\n'
    kube = tomllib.loads(generate("Bottlerocket", CLUSTER, GUARDED, user))["settings"]["kubernetes"]
    assert kube["node-labels"] == {"mine.example.com/a": "1", **TOLD}


def test_custom_user_data_is_not_filtered():
    user = "#!/bin/bash\n/usr/bin/kubelet --node-labels=node-role.kubernetes.io/worker=\n"
    assert generate("Custom", CLUSTER, GUARDED, user) == user
