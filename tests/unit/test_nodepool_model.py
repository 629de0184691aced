import pytest
import yaml
from pydantic import ValidationError

from api.nodepool import EC2NodeClass, NodePool
from api.nodepool_reader import pool_expire_after, pool_termination_grace_period, read_nodepool

NODEPOOL = """
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: default}
spec:
  template:
    metadata: {labels: {team: web}}
    spec:
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements:
      - {key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}
      - {key: karpenter.k8s.aws/instance-cpu, operator: Gt, values: ["1"]}
      startupTaints: [{key: example.com/agent-not-ready, effect: NoExecute}]
      expireAfter: 720h
      terminationGracePeriod: 48h
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 1m
    budgets:
    - nodes: "10%"
    - nodes: "0"
      schedule: "0 9 * * mon-fri"
      duration: 8h
      reasons: [Underutilized]
  limits: {cpu: 1000, memory: 1000Gi}
  futureField: ignored
"""


def test_a_karpenter_v1_nodepool_loads_unchanged():
    pool = NodePool.model_validate(yaml.safe_load(NODEPOOL))
    assert pool.name == "default"
    assert pool.spec.template.spec.termination_grace_period_delta.total_seconds() == 48 * 3600
    assert pool.spec.disruption.consolidate_after_delta.total_seconds() == 60
    assert [b.nodes for b in pool.spec.disruption.budgets] == ["10%", "0"]
    assert pool.spec.limits == {"cpu": "1000", "memory": "1000Gi"}
    assert pool.to_wire()["spec"]["template"]["spec"]["startupTaints"][0]["effect"] == "NoExecute"


def test_defaults_match_karpenter():
    pool = NodePool.model_validate({"metadata": {"name": "p"}})
    assert pool.spec.template.spec.expire_after == "720h"
    assert pool.spec.disruption.consolidation_policy == "WhenEmptyOrUnderutilized"
    assert [b.nodes for b in pool.spec.disruption.budgets] == ["10%"]


def test_v1beta1_policy_name_is_accepted():
    pool = NodePool.model_validate(
        {"metadata": {"name": "p"}, "spec": {"disruption": {"consolidationPolicy": "WhenUnderutilized"}}}
    )
    assert pool.spec.disruption.consolidation_policy == "WhenEmptyOrUnderutilized"


@pytest.mark.parametrize(
    ("disruption", "message"),
    [
        ({"budgets": [{"nodes": "110%"}]}, "percentage"),
        ({"budgets": [{"nodes": "ten"}]}, "non-negative integer"),
        ({"budgets": [{"nodes": "1", "schedule": "@daily"}]}, "together"),
        ({"budgets": [{"nodes": "1", "reasons": ["Expired"]}]}, "Underutilized"),
        ({"consolidateAfter": "soon"}, "consolidateAfter"),
        ({"consolidateAfter": "-5m"}, "must not be negative"),
        ({"budgets": [{"nodes": "0", "schedule": "@daily", "duration": "-1h"}]}, "must not be negative"),
    ],
)
def test_bad_disruption_settings_are_refused_with_a_reason(disruption, message):
    with pytest.raises(ValidationError, match=message):
        NodePool.model_validate({"metadata": {"name": "p"}, "spec": {"disruption": disruption}})


def test_ec2nodeclass_status_is_read():
    nodeclass = EC2NodeClass.model_validate(
        {
            "metadata": {"name": "default"},
            "spec": {"role": "KarpenterNodeRole", "amiSelectorTerms": [{"alias": "al2023@latest"}]},
            "status": {
                "amis": [{"id": "ami-123", "name": "al2023"}],
                "subnets": [{"id": "subnet-a", "zone": "us-west-2a"}],
                "securityGroups": [{"id": "sg-1"}],
            },
        }
    )
    assert nodeclass.status.subnets[0].zone == "us-west-2a"
    assert nodeclass.spec.ami_selector_terms[0].alias == "al2023@latest"


def _pool(template_spec=None, disruption=None, annotations=None):
    return {
        "metadata": {"name": "arm", "annotations": annotations or {}},
        "spec": {"template": {"spec": template_spec or {}}, "disruption": disruption or {}},
    }


def test_read_nodepool_reads_each_invalid_duration_as_the_value_that_disrupts_nothing():
    pool, problems = read_nodepool(
        _pool(
            {"expireAfter": "-1h", "terminationGracePeriod": "-1h"},
            {"consolidateAfter": "-5m", "budgets": [{"nodes": "1"}, {"nodes": "0", "schedule": "@daily"}]},
        )
    )
    assert pool.spec.template.spec.expire_after == "Never"
    assert pool.spec.template.spec.termination_grace_period is None
    assert pool.spec.disruption.consolidate_after == "Never"
    assert [b.nodes for b in pool.spec.disruption.budgets] == ["1"]
    assert [p.split(":")[0] for p in problems] == [
        "spec.template.spec.expireAfter",
        "spec.template.spec.terminationGracePeriod",
        "spec.disruption.consolidateAfter",
        "spec.disruption.budgets[1]",
    ]
    assert "'-1h': must not be negative (read as Never: no node of the pool expires)" in problems[0]


def test_read_nodepool_leaves_a_valid_pool_alone():
    raw = yaml.safe_load(NODEPOOL)
    pool, problems = read_nodepool(raw)
    assert problems == [] and pool == NodePool.model_validate(raw)


def test_read_nodepool_treats_a_null_duration_as_unset():
    pool, problems = read_nodepool(_pool({"expireAfter": None}))
    assert problems == [] and pool.spec.template.spec.expire_after == "720h"


@pytest.mark.parametrize(
    ("annotations", "template", "expire_after", "grace"),
    [
        ({}, {"expireAfter": "24h", "terminationGracePeriod": "1h"}, 24 * 3600, 3600),
        (
            {"karpflow.dev/expire-after": "48h", "karpflow.dev/termination-grace-period": "2h"},
            {"expireAfter": "Never"},
            48 * 3600,
            7200,
        ),
        # An invalid annotation reads as nothing, not as the template's value (Karpenter's, beside it).
        (
            {"karpflow.dev/expire-after": "-1h", "karpflow.dev/termination-grace-period": "-1h"},
            {"expireAfter": "24h", "terminationGracePeriod": "1h"},
            None,
            None,
        ),
    ],
)
def test_the_expire_after_and_grace_period_karpflow_uses(annotations, template, expire_after, grace):
    pool, _ = read_nodepool(_pool(template, annotations=annotations))

    def seconds(delta):
        return delta.total_seconds() if delta is not None else None

    assert seconds(pool_expire_after(pool)) == expire_after
    assert seconds(pool_termination_grace_period(pool)) == grace


def nodeclass_spec(**spec):
    return EC2NodeClass.model_validate(
        {
            "metadata": {"name": "c"},
            "spec": {"role": "R", "amiSelectorTerms": [{"alias": "al2023@latest"}], **spec},
        }
    ).spec


BATCH_DEVICES = [
    {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100Gi", "volumeType": "gp3", "encrypted": True}},
    {"deviceName": "/dev/xvdb", "ebs": {"snapshotID": "snap-1", "kmsKeyID": "alias/k"}, "rootVolume": True},
]


def test_block_device_mappings_are_read_in_karpenters_spelling_and_written_back_as_given():
    spec = nodeclass_spec(blockDeviceMappings=BATCH_DEVICES)
    assert spec.block_device_mappings[0].ebs.volume_size == "100Gi"
    assert spec.block_device_mappings[1].ebs.kms_key_id == "alias/k"
    assert spec.block_device_mappings[1].root_volume is True
    # As written: the drift hash of a class is what it was when the field was a plain map.
    assert spec.to_wire()["blockDeviceMappings"] == BATCH_DEVICES


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({"": "x"}, "empty tag keys"),
        ({"eks:eks-cluster-name": "x"}, "restricted tag matching eks:eks-cluster-name"),
        ({"kubernetes.io/cluster/prod": "owned"}, "restricted tag matching kubernetes.io/cluster/"),
        ({"karpenter.sh/nodepool": "x"}, "restricted tag matching karpenter.sh/nodepool"),
        ({"karpenter.sh/nodeclaim": "x"}, "restricted tag matching karpenter.sh/nodeclaim"),
        ({"karpenter.k8s.aws/ec2nodeclass": "x"}, "restricted tag matching karpenter.k8s.aws/ec2nodeclass"),
    ],
)
def test_tags_karpenter_reserves_are_refused(tags, message):
    with pytest.raises(ValidationError, match=message):
        nodeclass_spec(tags=tags)
    assert nodeclass_spec(tags={"team": "batch"}).tags == {"team": "batch"}


def test_the_other_launch_fields():
    spec = nodeclass_spec(
        instanceStorePolicy="RAID0",
        ipPrefixCount=2,
        enclaveOptions={"enabled": True},
        metadataOptions={"httpProtocolIPv6": "enabled", "httpPutResponseHopLimit": 2},
        associatePublicIPAddress=False,
        detailedMonitoring=True,
    )
    assert spec.instance_store_policy == "RAID0" and spec.ip_prefix_count == 2
    assert spec.enclave_options.enabled is True
    assert spec.metadata_options.http_protocol_ipv6 == "enabled"
    assert spec.to_wire()["metadataOptions"] == {"httpProtocolIPv6": "enabled", "httpPutResponseHopLimit": 2}
    for bad in (
        {"instanceStorePolicy": "RAID5"},
        {"ipPrefixCount": -1},
        {"metadataOptions": {"httpTokens": "no"}},
    ):
        with pytest.raises(ValidationError):
            nodeclass_spec(**bad)
