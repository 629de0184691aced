"""EC2 activities against moto in process: idempotent launch, capacity errors, the ownership check."""

from __future__ import annotations

import base64
import email
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError
from moto import mock_aws
from temporalio.exceptions import ApplicationError

from activities import errors
from activities.cluster_endpoint import ClusterEndpoint
from activities.ec2 import EC2Activities, client_token, launch_tags
from api.activity_io import AmiChoice, InstanceRequest, LaunchRequest, LaunchTemplate
from api.constants import TAG_CAPACITY_TYPE, TAG_COMMAND_ID
from api.workflow_io import Offering, TaintSpec

REGION = "us-west-2"


API = "https://prod.example.eks.amazonaws.com"


def aws(ec2: Any, cluster: str = "prod", **options: Any) -> EC2Activities:
    endpoint = ClusterEndpoint(cluster, endpoint=API, ca_bundle="UFJPRC1DQQ==", service_cidr="172.20.0.0/16")
    return EC2Activities(ec2, cluster, endpoint=endpoint, **options)


@pytest.fixture
def ec2() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def template(ec2: Any) -> LaunchTemplate:
    subnet = ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": ["us-west-2a"]}])[
        "Subnets"
    ][0]
    return LaunchTemplate(
        nodepool="default",
        nodeclass="default",
        subnets={"us-west-2a": subnet["SubnetId"]},
        security_group_ids=[],
        amis=[
            AmiChoice(id="ami-arm", architectures=["arm64"]),
            AmiChoice(id="ami-x86", architectures=["amd64"]),
        ],
        labels={"karpenter.sh/nodepool": "default", "team": "web"},
        taints=[TaintSpec(key="dedicated", value="web", effect="NoSchedule")],
        startup_taints=[TaintSpec(key="agent-not-ready", effect="NoExecute")],
    )


def request(
    ec2: Any, index: int = 0, instance_type: str = "m5.large", command: str = "disruption/x"
) -> LaunchRequest:
    offering = Offering(instance_type=instance_type, zone="us-west-2a")
    return LaunchRequest(command_id=command, index=index, offering=offering, template=template(ec2))


def user_data(ec2: Any, instance_id: str) -> str:
    value = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
    return base64.b64decode(value).decode()


def nodeconfig_of(ec2: Any, instance_id: str) -> dict[str, Any]:
    """The last NodeConfig of the AL2023 MIME document, parsed as nodeadm would."""
    message = email.message_from_string(user_data(ec2, instance_id))
    parts = [p for p in message.walk() if p.get_content_type() == "application/node.eks.aws"]
    return yaml.safe_load(parts[-1].get_payload(decode=True))


def tags(ec2: Any, instance_id: str) -> dict[str, str]:
    instance = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in instance["Tags"]}


async def test_a_retried_launch_adopts_the_instance_it_already_launched(ec2):
    activities = aws(ec2, "prod")
    first = await activities.launch_instance(request(ec2))
    again = await activities.launch_instance(request(ec2))
    other = await activities.launch_instance(request(ec2, index=1))

    assert again.instance_id == first.instance_id and again.adopted and not first.adopted
    assert other.instance_id != first.instance_id
    assert first.provider_id == f"aws:///us-west-2a/{first.instance_id}"
    assert [i.index for i in await activities.find_command_instances("disruption/x")] == [0, 1]


async def test_launch_tags_carry_ownership_and_provenance_and_the_user_data_the_kubelet_flags(ec2):
    launched = await aws(ec2, "prod").launch_instance(request(ec2))
    found = tags(ec2, launched.instance_id)

    assert found["kubernetes.io/cluster/prod"] == "owned"
    assert found[TAG_COMMAND_ID] == "disruption/x" and found["karpflow.io/replacement-index"] == "0"
    assert found[TAG_CAPACITY_TYPE] == "on-demand"
    assert not any("label" in key or "taint" in key for key in found)  # not tags: user data
    config = nodeconfig_of(ec2, launched.instance_id)
    assert config["spec"]["cluster"] == {
        "name": "prod",
        "apiServerEndpoint": API,
        "certificateAuthority": "UFJPRC1DQQ==",
        "cidr": "172.20.0.0/16",
    }
    flags = dict(f.split("=", 1) for f in config["spec"]["kubelet"]["flags"])
    assert set(flags["--node-labels"].split(",")) == {
        "karpenter.sh/capacity-type=on-demand",
        "karpenter.sh/nodepool=default",
        "team=web",
    }
    assert flags["--register-with-taints"].split(",") == [
        "dedicated=web:NoSchedule",
        "agent-not-ready:NoExecute",
        "karpenter.sh/unregistered:NoExecute",
    ]
    image = ec2.describe_instances(InstanceIds=[launched.instance_id])["Reservations"][0]["Instances"][0][
        "ImageId"
    ]
    assert image == "ami-x86"  # m5.large is x86_64


def test_the_client_token_is_stable_and_short():
    offering = Offering(instance_type="m5.large", zone="us-west-2a")
    token = client_token("disruption/default/Drifted/abc", 0, offering)
    assert token == client_token("disruption/default/Drifted/abc", 0, offering) and len(token) <= 64
    assert token != client_token("disruption/default/Drifted/abc", 1, offering)
    # A relaunch (issue 30) gets a token of its own; the first attempt keeps the one it always had.
    assert client_token("disruption/default/Drifted/abc", 0, offering, 0) == token
    relaunch = client_token("disruption/default/Drifted/abc", 0, offering, 1)
    assert relaunch != token and len(relaunch) <= 64


def test_a_tag_too_long_for_ec2_is_refused_with_its_key_named(ec2):
    launch = request(ec2)
    launch.template.instance_tags = {"team.example.com/owner": "x" * 300}
    with pytest.raises(ApplicationError) as refused:
        launch_tags("prod", launch)
    assert refused.value.non_retryable and "team.example.com/owner" in refused.value.message


async def test_insufficient_capacity_is_final_and_remembered(ec2, monkeypatch):
    activities = aws(ec2, "prod", unavailable_ttl_seconds=60)
    calls = []

    def run_instances(**kwargs: Any) -> Any:
        calls.append(kwargs["InstanceType"])
        raise ClientError(
            {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "none left"}}, "RunInstances"
        )

    monkeypatch.setattr(activities.ec2, "run_instances", run_instances)
    with pytest.raises(ApplicationError) as first:
        await activities.launch_instance(request(ec2))
    with pytest.raises(ApplicationError) as second:
        await activities.launch_instance(request(ec2))

    assert first.value.type == errors.INSUFFICIENT_CAPACITY and first.value.non_retryable
    assert second.value.type == errors.OFFERING_UNAVAILABLE  # skipped without asking EC2 again
    assert calls == ["m5.large"]


async def test_a_zone_without_a_subnet_is_an_unavailable_offering(ec2):
    launch = request(ec2)
    launch.offering = Offering(instance_type="m5.large", zone="us-west-2c")
    with pytest.raises(ApplicationError) as refused:
        await aws(ec2, "prod").launch_instance(launch)
    assert (
        refused.value.type == errors.OFFERING_UNAVAILABLE
        and "no subnet in zone us-west-2c" in refused.value.message
    )


async def test_terminate_refuses_an_instance_of_another_cluster(ec2):
    launched = await aws(ec2, "other").launch_instance(request(ec2))
    with pytest.raises(ApplicationError) as refused:
        await aws(ec2, "prod").terminate_instance(
            InstanceRequest(instance_id=launched.instance_id, node="n1")
        )

    assert refused.value.type == errors.NOT_OWNED and refused.value.non_retryable
    assert f"instance {launched.instance_id} of node n1" in refused.value.message
    assert "kubernetes.io/cluster/prod" in refused.value.message
    state = await aws(ec2, "other").describe_instance(InstanceRequest(instance_id=launched.instance_id))
    assert state.state == "running" and state.owned


async def test_terminate_is_idempotent(ec2):
    activities = aws(ec2, "prod", poll_interval=0.01)
    launched = await activities.launch_instance(request(ec2))
    first = await activities.terminate_instance(InstanceRequest(instance_id=launched.instance_id))
    again = await activities.terminate_instance(InstanceRequest(instance_id=launched.instance_id))
    gone = await activities.terminate_instance(InstanceRequest(instance_id="i-0123456789abcdef0"))
    assert first.state == again.state == "terminated" and not gone.found
    assert await activities.find_command_instances("disruption/x") == []


def test_a_spot_launch_tags_its_spot_request_as_this_clusters():
    """A tag-conditioned IAM policy (deploy/iam-policy.json) only lets a spot request be created
    with the ownership tag in the request."""
    from api.activity_io import AmiChoice, LaunchRequest, LaunchTemplate
    from api.workflow_io import Offering

    activities = aws(None, "prod", unavailable_ttl_seconds=0)
    request = LaunchRequest(
        command_id="disruption/default/Drifted/abc",
        index=0,
        offering=Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="spot"),
        template=LaunchTemplate(
            nodepool="default",
            nodeclass="default",
            subnets={"us-west-2a": "subnet-a"},
            security_group_ids=["sg-1"],
            amis=[AmiChoice(id="ami-1")],
        ),
    )
    params = activities._run_params(request, "subnet-a", "ami-1", "", None)
    by_type = {
        spec["ResourceType"]: {t["Key"]: t["Value"] for t in spec["Tags"]}
        for spec in params["TagSpecifications"]
    }
    assert set(by_type) == {"instance", "volume", "network-interface", "spot-instances-request"}
    assert all(tags["kubernetes.io/cluster/prod"] == "owned" for tags in by_type.values())


async def test_launch_sends_karpenters_metadata_defaults_and_tags_volumes_and_interfaces(ec2):
    launched = await aws(ec2, "prod").launch_instance(request(ec2))
    instance = ec2.describe_instances(InstanceIds=[launched.instance_id])["Reservations"][0]["Instances"][0]

    metadata = instance["MetadataOptions"]
    assert metadata["HttpTokens"] == "required"
    assert metadata["HttpPutResponseHopLimit"] == 1
    assert metadata["HttpEndpoint"] == "enabled"
    assert tags(ec2, launched.instance_id)["eks:eks-cluster-name"] == "prod"
    volumes = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [launched.instance_id]}]
    )
    assert volumes["Volumes"]
    for volume in volumes["Volumes"]:
        volume_tags = {t["Key"]: t["Value"] for t in volume.get("Tags", [])}
        assert volume_tags["eks:eks-cluster-name"] == "prod"
        assert volume_tags["kubernetes.io/cluster/prod"] == "owned"
        assert volume_tags["karpenter.sh/nodepool"] == "default"


async def test_the_launch_surface_public_ip_monitoring_and_a_profile_made_for_the_role(ec2):
    iam = boto3.client("iam", region_name=REGION)
    iam.create_role(RoleName="KarpenterNodeRole-prod", AssumeRolePolicyDocument="{}")
    launch = request(ec2)
    launch.template.role = "KarpenterNodeRole-prod"
    launch.template.associate_public_ip_address = False
    launch.template.detailed_monitoring = True
    launch.template.block_device_mappings = [
        {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "80Gi", "volumeType": "gp3", "encrypted": True}}
    ]
    activities = aws(ec2, "prod", iam=iam)
    launched = await activities.launch_instance(launch)
    instance = ec2.describe_instances(InstanceIds=[launched.instance_id])["Reservations"][0]["Instances"][0]

    assert instance["Monitoring"]["State"] in ("enabled", "pending")
    assert instance["SubnetId"] == launch.template.subnets["us-west-2a"]  # via the network interface
    assert not instance.get("PublicIpAddress")
    volumes = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [launched.instance_id]}]
    )["Volumes"]
    assert [(v["Size"], v["VolumeType"], v["Encrypted"]) for v in volumes] == [(80, "gp3", True)]
    profile_arn = instance["IamInstanceProfile"]["Arn"]
    name = profile_arn.rsplit("/", 1)[-1]
    profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == ["KarpenterNodeRole-prod"]
    assert {t["Key"]: t["Value"] for t in profile["Tags"]}["kubernetes.io/cluster/prod"] == "owned"
    # Another launch for the same role reuses the profile.
    second = request(ec2, index=1)
    second.template.role = "KarpenterNodeRole-prod"
    await activities.launch_instance(second)
    assert len(iam.list_instance_profiles()["InstanceProfiles"]) == 1


async def test_a_role_that_does_not_exist_is_a_final_error_naming_it(ec2):
    launch = request(ec2)
    launch.template.role = "NoSuchRole"
    with pytest.raises(ApplicationError) as failed:
        await aws(ec2, "prod", iam=boto3.client("iam", region_name=REGION)).launch_instance(launch)
    assert failed.value.non_retryable and "NoSuchRole" in failed.value.message


async def test_without_an_endpoint_the_cluster_is_described_by_eks(ec2):
    eks = boto3.client("eks", region_name=REGION)
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(RoleName="eks", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    created = eks.create_cluster(name="prod", roleArn=role, resourcesVpcConfig={})["cluster"]
    activities = EC2Activities(ec2, "prod", endpoint=ClusterEndpoint("prod", eks=eks))
    launched = await activities.launch_instance(request(ec2))
    cluster = nodeconfig_of(ec2, launched.instance_id)["spec"]["cluster"]
    assert cluster["apiServerEndpoint"] == created["endpoint"]
    assert cluster["certificateAuthority"] == created["certificateAuthority"]["data"]

    unknown = EC2Activities(ec2, "missing", endpoint=ClusterEndpoint("missing", eks=eks))
    with pytest.raises(ApplicationError) as failed:
        await unknown.launch_instance(request(ec2))
    assert failed.value.non_retryable and "--cluster-endpoint" in failed.value.message


def volumes(ec2: Any, instance_id: str) -> list[tuple[str, int, str, bool]]:
    """(device, GiB, type, encrypted) of the volumes EC2 attached, by device."""
    found = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [instance_id]}])
    return sorted(
        (v["Attachments"][0]["Device"], v["Size"], v["VolumeType"], v["Encrypted"]) for v in found["Volumes"]
    )


async def test_block_devices_written_as_karpenter_documents_them_are_the_volumes_ec2_attaches(ec2):
    """The demo's `batch` class: `volumeSize: 100Gi`, gp3, in Karpenter's camelCase."""
    launch = request(ec2)
    launch.template.block_device_mappings = [
        {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100Gi", "volumeType": "gp3"}},
        {"deviceName": "/dev/xvdb", "ebs": {"volumeSize": "20G", "volumeType": "gp2", "encrypted": True}},
    ]
    launched = await aws(ec2, "prod").launch_instance(launch)
    assert volumes(ec2, launched.instance_id) == [
        ("/dev/xvda", 100, "gp3", False),
        ("/dev/xvdb", 19, "gp2", True),
    ]


async def test_a_class_without_block_devices_gets_its_families_root_volume(ec2):
    launched = await aws(ec2, "prod").launch_instance(request(ec2))
    assert volumes(ec2, launched.instance_id) == [("/dev/xvda", 20, "gp3", True)]


async def test_a_block_device_ec2_would_refuse_fails_the_launch_for_good_before_ec2_is_asked(
    ec2, monkeypatch
):
    launch = request(ec2)
    launch.template.block_device_mappings = [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100"}}]
    activities = aws(ec2, "prod")
    monkeypatch.setattr(activities.ec2, "run_instances", lambda **_: pytest.fail("EC2 was asked"))
    with pytest.raises(ApplicationError) as refused:
        await activities.launch_instance(launch)
    assert refused.value.type == errors.INVALID and refused.value.non_retryable
    assert "EC2NodeClass default: blockDeviceMappings[0]: ebs.volumeSize" in refused.value.message


def test_the_network_interface_takes_ip_prefixes_and_enclaves_are_enabled():
    launch = LaunchRequest(
        command_id="disruption/x",
        index=0,
        offering=Offering(instance_type="m5.large", zone="us-west-2a"),
        template=LaunchTemplate(
            nodepool="default",
            nodeclass="default",
            subnets={"us-west-2a": "subnet-a"},
            security_group_ids=["sg-1"],
            amis=[AmiChoice(id="ami-1")],
            ip_prefix_count=2,
            enclave_options={"enabled": True},
            instance_tags={"team": "batch"},
        ),
    )
    params = aws(None, "prod")._run_params(launch, "subnet-a", "ami-1", "", None)
    assert params["NetworkInterfaces"] == [
        {"DeviceIndex": 0, "SubnetId": "subnet-a", "Groups": ["sg-1"], "Ipv4PrefixCount": 2}
    ]
    assert "SubnetId" not in params and "SecurityGroupIds" not in params
    assert params["EnclaveOptions"] == {"Enabled": True}
    launch.template.instance_tags = {"aws:cloudformation:stack": "x"}
    with pytest.raises(ApplicationError, match="aws: prefix"):
        aws(None, "prod")._run_params(launch, "subnet-a", "ami-1", "", None)


async def test_the_launch_reports_karpenters_instance_labels_for_registration(ec2):
    launch = request(ec2, instance_type="c5d.large")
    launched = await aws(ec2, "prod").launch_instance(launch)
    labels = launched.labels
    subnet = ec2.describe_subnets(SubnetIds=[launch.template.subnets["us-west-2a"]])["Subnets"][0]
    assert labels["karpenter.k8s.aws/instance-category"] == "c"
    assert labels["karpenter.k8s.aws/instance-family"] == "c5d"
    assert labels["karpenter.k8s.aws/instance-generation"] == "5"
    assert labels["karpenter.k8s.aws/instance-size"] == "large"
    assert labels["karpenter.k8s.aws/instance-cpu"] == "2"
    assert labels["karpenter.k8s.aws/instance-memory"] == "4096"
    assert labels["karpenter.k8s.aws/instance-hypervisor"] == "nitro"
    assert labels["karpenter.k8s.aws/instance-encryption-in-transit-supported"] == "false"
    assert labels["karpenter.k8s.aws/instance-network-bandwidth"] == "750"
    assert labels["karpenter.k8s.aws/instance-local-nvme"] == "50"
    assert labels["karpenter.k8s.aws/instance-cpu-manufacturer"] == "intel"
    assert labels["karpenter.sh/capacity-type"] == "on-demand"
    assert labels["topology.kubernetes.io/zone"] == "us-west-2a"
    assert labels["topology.k8s.aws/zone-id"] == subnet["AvailabilityZoneId"]
    assert labels["kubernetes.io/arch"] == "amd64"
    # A retried launch adopts the instance and reports the same labels.
    assert (await aws(ec2, "prod").launch_instance(launch)).labels == labels


async def test_max_pods_default_to_the_instance_types_so_al2_never_falls_back_to_110(ec2):
    launch = request(ec2)
    launch.template.ami_family = "AL2"
    launched = await aws(ec2, "prod").launch_instance(launch)
    script = user_data(ec2, launched.instance_id)
    assert "--use-max-pods false" in script
    assert "--max-pods=29" in script  # m5.large: 3 ENIs x (10 - 1) + 2, what the planner counts


async def test_with_an_endpoint_and_ca_but_no_service_cidr_eks_says_it(ec2):
    eks = boto3.client("eks", region_name=REGION)
    role = boto3.client("iam", region_name=REGION).create_role(RoleName="eks", AssumeRolePolicyDocument="{}")
    eks.create_cluster(
        name="prod",
        roleArn=role["Role"]["Arn"],
        resourcesVpcConfig={},
        kubernetesNetworkConfig={"serviceIpv4Cidr": "172.20.0.0/16"},
    )
    endpoint = ClusterEndpoint("prod", endpoint=API, ca_bundle="UFJPRC1DQQ==", eks=eks)
    launched = await EC2Activities(ec2, "prod", endpoint=endpoint).launch_instance(request(ec2))
    config = nodeconfig_of(ec2, launched.instance_id)["spec"]
    assert config["cluster"]["cidr"] == "172.20.0.0/16"
    assert config["kubelet"]["config"]["clusterDNS"] == ["172.20.0.10"]
    # Without EKS to ask, the worker says which setting is missing rather than guessing.
    alone = EC2Activities(
        ec2, "prod", endpoint=ClusterEndpoint("prod", endpoint=API, ca_bundle="UFJPRC1DQQ==")
    )
    with pytest.raises(ApplicationError) as failed:
        await alone.launch_instance(request(ec2, index=1))
    assert failed.value.non_retryable and "--service-cidr" in failed.value.message
