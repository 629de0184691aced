"""The instance catalog from AWS: DescribeInstanceTypes, DescribeInstanceTypeOfferings, spot price
history and the Pricing API, with a file cache and the bundled table as fallback.

This is the only module of planner/ that talks to AWS; it takes boto3 clients so callers (an
activity, a CLI) decide credentials and endpoints, and it returns the same `Catalog` the pure
planner uses. What comes from where:

- hardware (vCPU, memory, architecture, ENIs x IPv4 per ENI -> EKS max pods): DescribeInstanceTypes;
- zones a type is offered in: DescribeInstanceTypeOfferings (location type availability-zone);
- on-demand price: the Pricing API (Linux, shared tenancy, no pre-installed software); when it is
  unavailable (no client, an error, or an endpoint without it such as moto) the bundled table's price;
  a type priced by neither is left out, since the planner cannot reason about its cost;
- spot price: the latest DescribeSpotPriceHistory entry per (type, zone) for Linux/UNIX; a price
  below `MIN_PLAUSIBLE_SPOT_RATIO` of on-demand is treated as bogus (moto answers 0.00001 for
  everything) and replaced by the bundled estimate;
- reserved offerings: DescribeCapacityReservations for the EC2NodeClasses' capacityReservationSelectorTerms
  (planner/reservations_live.py), when the classes are given.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from api.constants import CAPACITY_ON_DEMAND, CAPACITY_SPOT
from api.nodepool import EC2NodeClass
from planner.catalog import (
    MIB,
    Catalog,
    CatalogError,
    InstanceType,
    Offering,
    bundled_catalog,
    catalog_from_dict,
    catalog_to_dict,
    eks_max_pods,
)
from planner.reservations import with_reservations
from planner.reservations_live import read_reservations

log = logging.getLogger(__name__)

MIN_PLAUSIBLE_SPOT_RATIO = 0.05
DEFAULT_CACHE_TTL = timedelta(hours=6)
_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
# Pricing API attributes of the plain Linux on-demand price (besides instanceType and regionCode).
_PRICING_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


def instance_type_from_describe(
    entry: Mapping[str, Any], offerings: tuple[Offering, ...] = ()
) -> InstanceType:
    """An InstanceType from one DescribeInstanceTypes entry (hardware only)."""
    network = entry.get("NetworkInfo") or {}
    arches = (entry.get("ProcessorInfo") or {}).get("SupportedArchitectures") or ["x86_64"]
    return InstanceType(
        name=str(entry["InstanceType"]),
        cpu=int((entry.get("VCpuInfo") or {})["DefaultVCpus"]) * 1000,
        memory=int((entry.get("MemoryInfo") or {})["SizeInMiB"]) * MIB,
        pods=eks_max_pods(
            int(network.get("MaximumNetworkInterfaces", 1)), int(network.get("Ipv4AddressesPerInterface", 2))
        ),
        arch=next((_ARCH[a] for a in arches if a in _ARCH), "amd64"),
        offerings=offerings,
    )


def describe_instance_types(ec2: Any, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    paginator = ec2.get_paginator("describe_instance_types")
    if names is not None:
        wanted = sorted(set(names))
        out: list[dict[str, Any]] = []
        for start in range(0, len(wanted), 100):  # the API takes at most 100 names per call
            for page in paginator.paginate(InstanceTypes=wanted[start : start + 100]):
                out.extend(page["InstanceTypes"])
        return out
    return [t for page in paginator.paginate() for t in page["InstanceTypes"]]


def type_zones(ec2: Any, names: Iterable[str]) -> dict[str, list[str]]:
    wanted = sorted(set(names))
    zones: dict[str, set[str]] = {}
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    for start in range(0, len(wanted), 100):
        pages = paginator.paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": wanted[start : start + 100]}],
        )
        for page in pages:
            for item in page["InstanceTypeOfferings"]:
                zones.setdefault(item["InstanceType"], set()).add(item["Location"])
    return {name: sorted(z) for name, z in zones.items()}


def latest_spot_prices(ec2: Any, names: Iterable[str]) -> dict[tuple[str, str], float]:
    """(instance type, zone) -> the most recent Linux/UNIX spot price."""
    wanted = sorted(set(names))
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    paginator = ec2.get_paginator("describe_spot_price_history")
    for start in range(0, len(wanted), 100):
        pages = paginator.paginate(
            InstanceTypes=wanted[start : start + 100],
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=datetime.now(UTC),
        )
        for page in pages:
            for item in page["SpotPriceHistory"]:
                key = (item["InstanceType"], item["AvailabilityZone"])
                stamp = item.get("Timestamp") or datetime.min.replace(tzinfo=UTC)
                if key not in latest or stamp > latest[key][0]:
                    latest[key] = (stamp, float(item["SpotPrice"]))
    return {key: price for key, (_, price) in latest.items()}


def parse_price_list(items: Iterable[str | Mapping[str, Any]]) -> dict[str, float]:
    """instance type -> on-demand USD/hour from Pricing API `PriceList` entries (JSON strings)."""
    prices: dict[str, float] = {}
    for item in items:
        product = json.loads(item) if isinstance(item, str) else item
        attributes = (product.get("product") or {}).get("attributes") or {}
        name = attributes.get("instanceType")
        if not name:
            continue
        for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                usd = (dimension.get("pricePerUnit") or {}).get("USD")
                if usd is not None and float(usd) > 0:
                    prices[name] = float(usd)
    return prices


def on_demand_prices(pricing: Any, region: str, names: Iterable[str]) -> dict[str, float]:
    """On-demand prices from the Pricing API (its endpoint lives in us-east-1 / ap-south-1)."""
    prices: dict[str, float] = {}
    for name in sorted(set(names)):
        filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": name}]
        filters.append({"Type": "TERM_MATCH", "Field": "regionCode", "Value": region})
        filters.extend({"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in _PRICING_FILTERS.items())
        paginator = pricing.get_paginator("get_products")
        for page in paginator.paginate(ServiceCode="AmazonEC2", Filters=filters):
            prices.update(parse_price_list(page.get("PriceList") or ()))
    return prices


def live_catalog(
    ec2: Any,
    pricing: Any | None = None,
    *,
    region: str | None = None,
    names: Iterable[str] | None = None,
    fallback: Catalog | None = None,
    nodeclasses: Iterable[EC2NodeClass] = (),
) -> Catalog:
    """Build the catalog from AWS. `names` restricts the instance types (all types when None);
    `nodeclasses`: the EC2NodeClasses whose selected capacity reservations become reserved offerings."""
    region = region or ec2.meta.region_name
    if fallback is None:
        try:
            fallback = bundled_catalog(region)
        except CatalogError:
            fallback = Catalog(region=region, types={}, source="empty")
    described = describe_instance_types(ec2, names)
    type_names = [d["InstanceType"] for d in described]
    zones = type_zones(ec2, type_names)
    on_demand: dict[str, float] = {}
    price_source = "bundled table"
    if pricing is not None:
        try:
            on_demand = on_demand_prices(pricing, region, type_names)
            price_source = "Pricing API"
        except Exception as err:  # the fallback is the documented behaviour for any pricing failure
            log.warning("Pricing API unavailable (%s); using the bundled on-demand prices", err)
    try:
        spot = latest_spot_prices(ec2, type_names)
    except Exception as err:
        log.warning("spot price history unavailable (%s); using the bundled spot estimates", err)
        spot = {}
    types: dict[str, InstanceType] = {}
    skipped = []
    for entry in described:
        name = entry["InstanceType"]
        known = fallback.get(name)
        od_price = on_demand.get(name)
        if od_price is None and known is not None:
            od_price = known.cheapest_price([CAPACITY_ON_DEMAND])
        if od_price is None:
            skipped.append(name)
            continue
        offerings = []
        for zone in zones.get(name, []):
            offerings.append(Offering(zone, CAPACITY_ON_DEMAND, od_price))
            spot_price = spot.get((name, zone))
            if spot_price is None or spot_price < od_price * MIN_PLAUSIBLE_SPOT_RATIO:
                estimate = known.price(zone, CAPACITY_SPOT) if known is not None else None
                if estimate is None and known is not None:
                    estimate = known.cheapest_price([CAPACITY_SPOT])
                spot_price = estimate
            if spot_price is not None:
                offerings.append(Offering(zone, CAPACITY_SPOT, round(spot_price, 6)))
        if offerings:
            types[name] = instance_type_from_describe(entry, tuple(offerings))
    if skipped:
        log.info("left %d instance type(s) without an on-demand price out of the catalog", len(skipped))
    catalog = Catalog(region=region, types=types, source=f"live EC2 ({price_source} on-demand prices)")
    classes = list(nodeclasses)
    if not classes:
        return catalog
    by_class, _ = read_reservations(ec2, classes, datetime.now(UTC))
    return with_reservations(catalog, by_class)


# The Pricing API answers from a few regions only; us-east-1 serves every region's prices.
PRICING_REGION = "us-east-1"


def fetch_live_catalog(
    region: str, names: Iterable[str] | None = None, nodeclasses: Iterable[EC2NodeClass] = ()
) -> Catalog:
    """`live_catalog` with clients from boto3's standard chain (environment, profile, SSO, instance
    role); boto3 itself honours AWS_ENDPOINT_URL. Names that EC2 does not offer in the region are
    skipped (DescribeInstanceTypes refuses the whole call for one unknown name). Raises whatever
    boto3 raises when AWS cannot be reached."""
    import boto3  # only needed when a live catalog is asked for

    ec2 = boto3.client("ec2", region_name=region)
    pricing = boto3.client("pricing", region_name=PRICING_REGION)
    if names is not None:
        offered = {d["InstanceType"] for d in describe_instance_types(ec2)}
        names = sorted(set(names) & offered)
    return live_catalog(ec2, pricing, region=region, names=names, nodeclasses=nodeclasses)


def cached_live_catalog(
    cache_path: str | Path,
    ec2: Any,
    pricing: Any | None = None,
    *,
    ttl: timedelta = DEFAULT_CACHE_TTL,
    clock: Any = time.time,
    **kwargs: Any,
) -> Catalog:
    """`live_catalog`, reusing `cache_path` while it is younger than `ttl`. If AWS fails and a cache
    exists (even a stale one) it is used; with neither, the bundled table."""
    path = Path(cache_path)
    cached: Catalog | None = None
    age = None
    if path.exists():
        try:
            data = json.loads(path.read_text())
            cached = catalog_from_dict(data["catalog"], source=f"cache {path}")
            age = clock() - float(data["fetchedAt"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("ignoring unreadable catalog cache %s: %s", path, err)
    if cached is not None and age is not None and age < ttl.total_seconds():
        return cached
    try:
        catalog = live_catalog(ec2, pricing, **kwargs)
    except Exception as err:
        if cached is not None:
            log.warning("live catalog failed (%s); using the stale cache %s", err, path)
            return cached
        region = kwargs.get("region") or ec2.meta.region_name
        log.warning("live catalog failed (%s); using the bundled table", err)
        return bundled_catalog(region)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"fetchedAt": clock(), "catalog": catalog_to_dict(catalog)}))
    tmp.replace(path)
    return catalog
