"""EC2 faults seen through boto3 over HTTP, exactly as karpflow's activities will see them."""

import botocore.exceptions
import pytest

from sim.ec2_faults import mark_sim_client

from .conftest import REGION

pytestmark = pytest.mark.integration

AMI = "ami-12345678"


def launch(ec2, instance_type, zone, spot=False):
    kwargs = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    return ec2.run_instances(
        ImageId=AMI,
        MinCount=1,
        MaxCount=1,
        InstanceType=instance_type,
        Placement={"AvailabilityZone": zone},
        **kwargs,
    )["Instances"][0]


def test_ice_refuses_only_the_exhausted_pool(ec2, faults):
    faults.add_insufficient_capacity("m5.large", f"{REGION}a", "on-demand")
    with pytest.raises(botocore.exceptions.ClientError) as err:
        launch(ec2, "m5.large", f"{REGION}a")
    assert err.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert "m5.large" in err.value.response["Error"]["Message"]
    assert launch(ec2, "c5.large", f"{REGION}a")["InstanceType"] == "c5.large"
    assert launch(ec2, "m5.large", f"{REGION}b")["Placement"]["AvailabilityZone"] == f"{REGION}b"
    assert launch(ec2, "m5.large", f"{REGION}a", spot=True)["InstanceLifecycle"] == "spot"
    assert faults.counters.insufficient_capacity == 1
    faults.remove_insufficient_capacity("m5.large", f"{REGION}a", "on-demand")
    assert launch(ec2, "m5.large", f"{REGION}a")["InstanceType"] == "m5.large"


def _fleet(ec2, template, overrides, capacity_type):
    response = ec2.create_fleet(
        Type="instant",
        LaunchTemplateConfigs=[
            {
                "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
                "Overrides": overrides,
            }
        ],
        TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": capacity_type},
    )
    return response.get("Instances", []), response.get("Errors", [])


def test_create_fleet_reports_ice_in_errors_and_launches_the_rest(ec2, faults, cluster_name):
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]}
    ec2.create_launch_template(LaunchTemplateName=cluster_name, LaunchTemplateData={"ImageId": AMI})
    faults.add_insufficient_capacity("m5.large", f"{REGION}a", "spot")
    m5a = {"InstanceType": "m5.large", "SubnetId": subnets[f"{REGION}a"]}
    c5a = {"InstanceType": "c5.large", "SubnetId": subnets[f"{REGION}a"]}

    instances, errors = _fleet(ec2, cluster_name, [m5a, c5a], "spot")
    assert [e["ErrorCode"] for e in errors] == ["InsufficientInstanceCapacity"]
    assert errors[0]["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"] == "m5.large"
    assert errors[0]["Lifecycle"] == "spot"
    assert [i["InstanceType"] for i in instances] == ["c5.large"]

    instances, errors = _fleet(ec2, cluster_name, [m5a], "spot")
    assert instances == [] and len(errors) == 1  # all exhausted: success with only Errors[]

    instances, errors = _fleet(ec2, cluster_name, [m5a], "on-demand")  # other capacity type
    assert errors == [] and instances[0]["InstanceType"] == "m5.large"


def test_throttling_hits_karpflow_but_not_the_simulator(ec2, faults, moto_endpoint):
    from .conftest import ec2_client

    faults.set_throttle(probability=1.0, actions=["DescribeInstances"])
    with pytest.raises(botocore.exceptions.ClientError) as err:
        ec2.describe_instances()
    assert err.value.response["Error"]["Code"] == "RequestLimitExceeded"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    ec2.describe_subnets()  # other actions are not throttled
    sim_client = mark_sim_client(ec2_client(moto_endpoint))
    sim_client.describe_instances()
    faults.set_throttle()
    ec2.describe_instances()


def test_throttled_calls_are_retried_by_botocore(moto_endpoint, faults):
    from .conftest import ec2_client

    # Seed 13 throttles the first call only: one retry (botocore backs off < 1 s) then success.
    faults.set_throttle(probability=0.5, actions=["DescribeInstances"], seed=13)
    patient = ec2_client(moto_endpoint, retries=3)
    patient.describe_instances()
    assert faults.counters.throttled == 1
