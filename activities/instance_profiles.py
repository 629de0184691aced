"""Instance profiles for an EC2NodeClass that names a `role` instead of an `instanceProfile`.

Karpenter's AWS provider creates one profile per role and cluster, tagged as the cluster's, and
adds the role to it; so does this, idempotently (an existing profile is reused, a missing role is
added). IAM is eventually consistent: RunInstances may not know a new profile for a few seconds,
which activities/errors.py classifies as retryable.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from activities import errors
from activities.errors import classify_ec2, permanent
from api.constants import CLUSTER_TAG_VALUE, cluster_tag

NAME_MAX = 128


def profile_name(cluster: str, role: str) -> str:
    digest = hashlib.sha256(f"{cluster}\x00{role}".encode()).hexdigest()[:16]
    return f"karpflow_{cluster}_{digest}"[:NAME_MAX]


def role_name(role: str) -> str:
    """`role` may be a name or an ARN (`arn:aws:iam::123:role/path/Name`)."""
    return role.rsplit("/", 1)[-1] if role.startswith("arn:") else role


class InstanceProfiles:
    def __init__(self, iam: Any, cluster: str) -> None:
        self.iam = iam
        self.cluster = cluster
        self._ready: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def for_role(self, role: str) -> str:
        if role in self._ready:
            return self._ready[role]
        if self.iam is None:
            raise permanent(
                f"EC2NodeClass role {role}: no IAM client to create its instance profile "
                "(name an instanceProfile instead)",
                errors.INVALID,
            )
        async with self._lock:
            if role not in self._ready:
                self._ready[role] = await asyncio.to_thread(self._ensure, role)
        return self._ready[role]

    def _ensure(self, role: str) -> str:
        name, wanted = profile_name(self.cluster, role), role_name(role)
        what = f"instance profile {name} for role {wanted}"
        try:
            try:
                profile = self.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
            except self.iam.exceptions.NoSuchEntityException:
                profile = self.iam.create_instance_profile(
                    InstanceProfileName=name,
                    Tags=[
                        {"Key": cluster_tag(self.cluster), "Value": CLUSTER_TAG_VALUE},
                        {"Key": "eks:eks-cluster-name", "Value": self.cluster},
                    ],
                )["InstanceProfile"]
            roles = [r["RoleName"] for r in profile.get("Roles") or ()]
            if wanted not in roles:
                for other in roles:  # a profile holds one role: the EC2NodeClass changed its role
                    self.iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=other)
                self.iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=wanted)
        except self.iam.exceptions.NoSuchEntityException as err:
            raise permanent(f"{what}: {err}", errors.NOT_FOUND) from None
        except Exception as err:
            raise classify_ec2(err, what) from None
        return name
