"""Where a new node's kubelet finds the API server: the cluster endpoint, its CA and the service CIDR
that go into the bootstrap user data (launch/userdata.py).

From the settings when given (`--cluster-endpoint`, `--cluster-ca-bundle`, `--service-cidr`), and
what they leave out from EKS `DescribeCluster`, asked once per worker (Karpenter's AWS provider does
the same at start). The service CIDR is never guessed: EKS picks 10.100.0.0/16 or 172.20.0.0/16
depending on the VPC, and a wrong one gives every pod on the node a DNS server that is not there.
"""

from __future__ import annotations

import asyncio
from typing import Any

from activities import errors
from activities.errors import classify_ec2, permanent
from launch.userdata import ClusterInfo


class ClusterEndpoint:
    def __init__(
        self,
        cluster: str,
        *,
        endpoint: str | None = None,
        ca_bundle: str | None = None,
        service_cidr: str | None = None,
        eks: Any = None,
    ) -> None:
        self.cluster = cluster
        self.eks = eks
        self._given = (endpoint, ca_bundle, service_cidr)
        self._info: ClusterInfo | None = None
        if endpoint and ca_bundle and service_cidr:
            self._info = ClusterInfo(cluster, endpoint, ca_bundle, service_cidr)
        self._lock = asyncio.Lock()

    async def get(self) -> ClusterInfo:
        if self._info is not None:
            return self._info
        async with self._lock:
            if self._info is None:
                self._info = await self._describe()
        return self._info

    async def _describe(self) -> ClusterInfo:
        endpoint, ca_bundle, service_cidr = self._given
        if self.eks is None:
            missing = ", ".join(
                flag
                for flag, value in zip(
                    ("--cluster-endpoint", "--cluster-ca-bundle", "--service-cidr"), self._given, strict=True
                )
                if not value
            )
            raise permanent(
                f"where new nodes of cluster {self.cluster} join is unknown: set {missing}, or let the "
                "worker call eks:DescribeCluster",
                errors.INVALID,
            )
        try:
            found = (await asyncio.to_thread(self.eks.describe_cluster, name=self.cluster))["cluster"]
        except Exception as err:
            failure = classify_ec2(err, f"EKS DescribeCluster {self.cluster}")
            if failure.type == errors.NOT_FOUND or "ResourceNotFound" in str(failure.message):
                raise permanent(
                    f"{failure.message} (set --cluster-endpoint, --cluster-ca-bundle and --service-cidr "
                    "for a cluster that is not an EKS cluster of this account and region)",
                    errors.NOT_FOUND,
                ) from None
            raise failure from None
        network = found.get("kubernetesNetworkConfig") or {}
        cidr = service_cidr or network.get("serviceIpv4Cidr") or network.get("serviceIpv6Cidr")
        if not cidr:
            raise permanent(
                f"EKS DescribeCluster {self.cluster} names no service CIDR: set --service-cidr",
                errors.INVALID,
            )
        return ClusterInfo(
            self.cluster,
            endpoint or found["endpoint"],
            ca_bundle or (found.get("certificateAuthority") or {}).get("data", ""),
            cidr,
        )
