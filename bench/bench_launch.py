"""RunInstances per offering vs one CreateFleet (instant) in moto: milliseconds per launch.

Prints figures only; the decision they informed is in docs/launch.md.
"""

import statistics
import time

import boto3
from moto import mock_aws

ROUNDS = 30


def _setup(ec2):
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    template = ec2.create_launch_template(
        LaunchTemplateName="bench", LaunchTemplateData={"ImageId": "ami-12c6146b"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    return subnet, template


def run_instances(ec2, subnet: str, i: int) -> None:
    ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        SubnetId=subnet,
        ClientToken=f"bench-{i}",
        MetadataOptions={"HttpTokens": "required", "HttpPutResponseHopLimit": 1},
    )


def create_fleet(ec2, subnet: str, template: str, offerings: int) -> None:
    ec2.create_fleet(
        Type="instant",
        TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
        OnDemandOptions={"AllocationStrategy": "lowest-price"},
        LaunchTemplateConfigs=[
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
                "Overrides": [
                    {"InstanceType": t, "SubnetId": subnet}
                    for t in ["m5.large", "m5.xlarge", "c5.large"][:offerings]
                ],
            }
        ],
    )


def measure(name: str, fn) -> None:
    samples = []
    for i in range(ROUNDS):
        start = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - start) * 1000)
    p90 = sorted(samples)[int(ROUNDS * 0.9)]
    print(f"{name:45s} median {statistics.median(samples):6.1f} ms  p90 {p90:6.1f} ms")


def main() -> None:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-west-2")
        subnet, template = _setup(ec2)
        measure("RunInstances (1 offering, 1 call)", lambda i: run_instances(ec2, subnet, i))
        measure("CreateFleet instant (3 overrides, 1 call)", lambda i: create_fleet(ec2, subnet, template, 3))
        # Two offerings out of capacity cost RunInstances two failed calls before the third succeeds.
        measure(
            "RunInstances (2 ICE + 1 ok, 3 calls)",
            lambda i: [run_instances(ec2, subnet, 1000 + 3 * i + k) for k in range(3)],
        )


if __name__ == "__main__":
    main()
