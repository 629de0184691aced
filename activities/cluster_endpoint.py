"""Where a new node's kubelet finds the API server: the cluster endpoint, its CA and the service CIDR
that go into the bootstrap user data (launch/userdata.py).

From the settings when given (`--cluster-endpoint`, `--cluster-ca-bundle`, `--service-cidr`), else
from EKS `DescribeCluster`, asked once per worker (Karpenter's AWS provider does the same at start).
"""

from __future__ import annotations

import asyncio
from typing import Any

from activities import errors
from activities.errors import classify_ec2, permanent
from launch.userdata import ClusterInfo

DEFAULT_SERVICE_CIDR = "10.100.0.0/16"  # EKS's default when the cluster does not say


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
        if endpoint and ca_bundle:
            self._info = ClusterInfo(cluster, endpoint, ca_bundle, service_cidr or DEFAULT_SERVICE_CIDR)
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
            raise permanent(
                f"the API endpoint of cluster {self.cluster} is unknown: set --cluster-endpoint and "
                "--cluster-ca-bundle, or let the worker call eks:DescribeCluster",
                errors.INVALID,
            )
        try:
            found = (await asyncio.to_thread(self.eks.describe_cluster, name=self.cluster))["cluster"]
        except Exception as err:
            failure = classify_ec2(err, f"EKS DescribeCluster {self.cluster}")
            if failure.type == errors.NOT_FOUND or "ResourceNotFound" in str(failure.message):
                raise permanent(
                    f"{failure.message} (set --cluster-endpoint and --cluster-ca-bundle for a cluster "
                    "that is not an EKS cluster of this account and region)",
                    errors.NOT_FOUND,
                ) from None
            raise failure from None
        network = found.get("kubernetesNetworkConfig") or {}
        return ClusterInfo(
            self.cluster,
            endpoint or found["endpoint"],
            ca_bundle or (found.get("certificateAuthority") or {}).get("data", ""),
            service_cidr or network.get("serviceIpv4Cidr") or DEFAULT_SERVICE_CIDR,
        )
