"""Golden tests: the bootstrap user data, parsed back the way each AMI would read it."""

import email
import re
import shlex
import tomllib

import pytest
import yaml

from launch.userdata import ClusterInfo, NodeBootstrap, generate

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


def test_metadata_options_default_as_karpenter_and_take_the_nodeclass_spelling():
    from activities.ec2 import metadata_options

    assert metadata_options(None) == {
        "HttpEndpoint": "enabled",
        "HttpProtocolIpv6": "disabled",
        "HttpPutResponseHopLimit": 1,
        "HttpTokens": "required",
    }
    given = metadata_options(
        {"httpTokens": "optional", "httpPutResponseHopLimit": 2, "httpProtocolIPv6": "enabled"}
    )
    assert given["HttpTokens"] == "optional"
    assert given["HttpPutResponseHopLimit"] == 2
    assert given["HttpProtocolIpv6"] == "enabled"
    assert given["HttpEndpoint"] == "enabled"
