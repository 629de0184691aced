"""Where the node lifecycle controller learns which instances exist: two interchangeable sources.

Both return the cluster's instances (ownership tag `kubernetes.io/cluster/<name>=owned`) in the
states a Node cares about, as DescribeInstances-shaped dicts (InstanceId, InstanceType, State,
Placement, PrivateIpAddress, PrivateDnsName, LaunchTime, InstanceLifecycle, Architecture, Tags).

`detect_source` picks one (`ec2_source="auto"`, the default): it creates a throw-away key pair over
HTTP and looks for it in this process's moto backend.

- `ApiInstanceSource` (`ec2_source="api"`): the EC2 API over HTTP, so it works against
  any moto (or EC2 itself). moto serialises about 15-20 ms of XML per instance in DescribeInstances,
  so a full listing of 1,000 instances costs ~20 s; the source therefore lists only states each
  poll (DescribeInstanceStatus, a few ms per instance) and describes each instance once, when it
  first appears. Launch tags must be set at launch (TagSpecifications, as Karpenter does): a tag
  added later is not seen for an instance already described.
- `MotoInstanceSource` (`ec2_source="moto"`): reads moto's backend objects directly, for a moto
  served by this very process (`ThreadedMotoServer`, as the dev stack runs it). Microseconds per
  instance and always current tags. A real kubelet does not call EC2 at all — it simply boots on
  its instance — so reading the state in process changes nothing karpflow can observe.

Both judge ownership once, when an instance first appears: a kubelet already running goes on running
when someone takes the ownership tag off its instance (the chaos run's `ownership-removed` fault), so
its Node stays Ready and no NoExecute taint evicts its pods.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable
from datetime import UTC
from typing import Any, Protocol

from api.constants import CLUSTER_TAG_VALUE, cluster_tag

log = logging.getLogger(__name__)

LISTED_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
DESCRIBE_CHUNK = 200


class InstanceSource(Protocol):
    def list_instances(self) -> list[dict[str, Any]]:
        """The cluster's instances in LISTED_STATES (blocking; called from a worker thread)."""
        ...


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class ApiInstanceSource:
    def __init__(self, ec2: Any, cluster_name: str) -> None:
        self.ec2 = ec2
        self.tag = cluster_tag(cluster_name)
        self.known: dict[str, dict[str, Any]] = {}
        self.foreign: set[str] = set()

    def _states(self) -> dict[str, str]:
        states: dict[str, str] = {}
        paginator = self.ec2.get_paginator("describe_instance_status")
        for page in paginator.paginate(
            IncludeAllInstances=True,
            Filters=[{"Name": "instance-state-name", "Values": list(LISTED_STATES)}],
            PaginationConfig={"PageSize": 1000},
        ):
            for status in page.get("InstanceStatuses", ()):
                states[status["InstanceId"]] = (status.get("InstanceState") or {}).get("Name", "")
        return states

    def _describe(self, ids: list[str]) -> list[dict[str, Any]]:
        try:
            response = self.ec2.describe_instances(
                InstanceIds=ids, Filters=[{"Name": f"tag:{self.tag}", "Values": [CLUSTER_TAG_VALUE]}]
            )
        except Exception as err:
            if len(ids) == 1:
                log.debug("DescribeInstances %s failed: %s", ids[0], err)
                return []
            # One id vanished between the two calls: fall back to describing them one by one.
            return [i for one in ids for i in self._describe([one])]
        return [i for r in response.get("Reservations", ()) for i in r.get("Instances", ())]

    def _user_data(self, instance_id: str) -> str | None:
        """What the instance boots with (DescribeInstances does not return it)."""
        try:
            value = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        except Exception as err:
            log.debug("DescribeInstanceAttribute %s failed: %s", instance_id, err)
            return None
        encoded = (value.get("UserData") or {}).get("Value")
        return base64.b64decode(encoded).decode(errors="replace") if encoded else None

    def list_instances(self) -> list[dict[str, Any]]:
        states = self._states()
        new = [i for i in states if i not in self.known and i not in self.foreign]
        for chunk in _chunks(new, DESCRIBE_CHUNK):
            owned = self._describe(chunk)
            for instance in owned:
                instance["UserData"] = self._user_data(instance["InstanceId"])
                self.known[instance["InstanceId"]] = instance
            self.foreign.update(set(chunk) - {i["InstanceId"] for i in owned})
        for instance_id in [i for i in self.known if i not in states]:
            del self.known[instance_id]  # terminated (or gone): not listed any more
        self.foreign &= set(states)
        out = []
        for instance_id, instance in self.known.items():
            instance["State"] = {**(instance.get("State") or {}), "Name": states[instance_id]}
            out.append(instance)
        return out


class MotoInstanceSource:
    def __init__(self, cluster_name: str, region: str, account_id: str | None = None) -> None:
        from moto.core.models import DEFAULT_ACCOUNT_ID

        self.tag = cluster_tag(cluster_name)
        self.region = region
        self.account_id = account_id or DEFAULT_ACCOUNT_ID
        # Decoded once per instance; its keys are the cluster's instances listed last time.
        self.user_data: dict[str, str | None] = {}

    def list_instances(self) -> list[dict[str, Any]]:
        from moto.ec2.models import ec2_backends

        backend = ec2_backends[self.account_id][self.region]
        for _ in range(10):
            try:  # moto's server threads may be adding instances while we copy
                reservations = list(backend.reservations.values())
                instances = [i for r in reservations for i in list(r.instances)]
                tags = {i.id: dict(backend.tags.get(i.id) or {}) for i in instances}
                break
            except RuntimeError:
                continue
        else:
            raise RuntimeError("moto's instance table kept changing while being read")
        out = []
        for inst in instances:
            inst_tags = tags[inst.id]
            state = inst.state
            if state not in LISTED_STATES:
                continue
            if inst_tags.get(self.tag) != CLUSTER_TAG_VALUE and inst.id not in self.user_data:
                continue  # never the cluster's; one seen before stays (ownership judged once)
            if inst.id not in self.user_data:
                self.user_data[inst.id] = inst.user_data.decode() if inst.user_data else None
            launched = inst.launch_time
            if launched.tzinfo is None:
                launched = launched.replace(tzinfo=UTC)
            out.append(
                {
                    "InstanceId": inst.id,
                    "InstanceType": inst.instance_type,
                    # What the instance booted from, as DescribeInstances says: a bad-AMI fault keys
                    # on it (sim/ec2_faults.py), in both sources alike.
                    "ImageId": inst.image_id,
                    "State": {"Name": state},
                    "Placement": {"AvailabilityZone": inst.placement.zone},
                    "PrivateIpAddress": inst.private_ip,
                    "PrivateDnsName": inst.private_dns_name,
                    "LaunchTime": launched,
                    "InstanceLifecycle": inst.lifecycle,
                    "Architecture": inst.architecture,
                    "Tags": [{"Key": k, "Value": v} for k, v in inst_tags.items()],
                    "UserData": self.user_data[inst.id],
                }
            )
        listed = {i["InstanceId"] for i in out}
        self.user_data = {k: v for k, v in self.user_data.items() if k in listed}
        return out


def moto_serves_this_process(ec2: Any, region: str, account_id: str | None = None) -> bool:
    """True when the moto behind `ec2` (a boto3 client) keeps its state in this very process."""
    import uuid

    try:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends
    except ImportError:
        return False
    name = f"karpflow-sim-probe-{uuid.uuid4().hex[:12]}"
    try:
        ec2.create_key_pair(KeyName=name)
    except Exception:
        return False
    try:
        return name in ec2_backends[account_id or DEFAULT_ACCOUNT_ID][region].key_pairs
    finally:
        try:
            ec2.delete_key_pair(KeyName=name)
        except Exception as err:
            log.debug("could not delete probe key pair %s: %s", name, err)


def detect_source(ec2: Any, cluster_name: str, region: str, wanted: str = "auto") -> InstanceSource:
    """The instance source for `ec2_source` "api", "moto" or "auto" (moto when it is in process)."""
    if wanted not in ("auto", "api", "moto"):
        raise ValueError(f"ec2_source must be 'auto', 'api' or 'moto', got {wanted!r}")
    if wanted == "moto" or (wanted == "auto" and moto_serves_this_process(ec2, region)):
        return MotoInstanceSource(cluster_name, region)
    return ApiInstanceSource(ec2, cluster_name)
