"""The live catalog against moto's EC2 (real DescribeInstanceTypes data; no Pricing API in moto)."""

import json

import boto3
import pytest
from moto import mock_aws

from planner.catalog_live import cached_live_catalog, live_catalog, parse_price_list

PRODUCT = {
    "product": {
        "attributes": {"instanceType": "m5.large", "regionCode": "us-west-2", "operatingSystem": "Linux"}
    },
    "terms": {
        "OnDemand": {
            "ABC.JRTCKXETXF": {
                "priceDimensions": {
                    "ABC.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": "0.0960000000"}}
                }
            }
        }
    },
}


@pytest.fixture
def ec2():
    with mock_aws():
        yield boto3.client("ec2", region_name="us-west-2")


class FakePricing:
    """The Pricing API boundary (moto has none): answers get_products pages from a fixed table."""

    def __init__(self, prices):
        self.prices = prices
        self.calls = 0

    def get_paginator(self, name):
        assert name == "get_products"
        return self

    def paginate(self, ServiceCode, Filters):  # boto3 spells its parameters this way
        self.calls += 1
        name = next(f["Value"] for f in Filters if f["Field"] == "instanceType")
        assert {"Field": "regionCode", "Type": "TERM_MATCH", "Value": "us-west-2"} in Filters
        if name not in self.prices:
            return [{"PriceList": []}]
        product = json.loads(json.dumps(PRODUCT))
        product["product"]["attributes"]["instanceType"] = name
        dims = product["terms"]["OnDemand"]["ABC.JRTCKXETXF"]["priceDimensions"]
        dims["ABC.JRTCKXETXF.6YS6EN2CT7"]["pricePerUnit"]["USD"] = str(self.prices[name])
        return [{"PriceList": [json.dumps(product)]}]


class BrokenPricing:
    def get_paginator(self, name):
        raise RuntimeError("pricing endpoint unreachable")


def test_hardware_and_zones_come_from_ec2_and_prices_fall_back_to_the_table(ec2):
    catalog = live_catalog(ec2, BrokenPricing(), names=["m5.large", "m6g.medium", "x2gd.large"])
    assert catalog.region == "us-west-2" and "bundled table" in catalog.source
    m5 = catalog.get("m5.large")
    assert (m5.cpu, m5.memory, m5.pods, m5.arch) == (2000, 8 << 30, 29, "amd64")
    assert m5.allocatable == {"cpu": "1930m", "memory": "6903Mi", "pods": "29", "ephemeral-storage": "17Gi"}
    zones = {o.zone for o in m5.offerings}
    assert {"us-west-2a", "us-west-2b", "us-west-2c"} <= zones
    assert m5.price("us-west-2a", "on-demand") == 0.096
    # moto's spot price (0.00001) is implausible: the bundled estimate replaces it.
    assert m5.price("us-west-2a", "spot") == pytest.approx(0.0384)
    assert catalog.get("m6g.medium").arch == "arm64" and catalog.get("m6g.medium").pods == 8
    assert catalog.get("x2gd.large") is None  # priced by nobody: left out


def test_the_pricing_api_price_wins_when_available(ec2):
    pricing = FakePricing({"m5.large": 0.1, "x2gd.large": 0.167})
    catalog = live_catalog(ec2, pricing, names=["m5.large", "x2gd.large"])
    assert "Pricing API" in catalog.source
    assert catalog.get("m5.large").price("us-west-2b", "on-demand") == 0.1
    x2 = catalog.get("x2gd.large")
    assert x2.arch == "arm64" and x2.price("us-west-2a", "on-demand") == 0.167
    assert x2.offering("us-west-2a", "spot") is None  # no plausible spot price and no estimate


def test_parse_price_list_reads_the_on_demand_usd_price():
    assert parse_price_list([json.dumps(PRODUCT)]) == {"m5.large": 0.096}
    assert parse_price_list([{"product": {"attributes": {}}}]) == {}


def test_the_cache_is_reused_while_fresh_and_kept_when_aws_fails(ec2, tmp_path):
    cache = tmp_path / "catalog.json"
    now = [1_000_000.0]
    first = cached_live_catalog(cache, ec2, None, names=["m5.large"], clock=lambda: now[0])
    assert cache.exists() and first.get("m5.large") is not None

    class Failing:
        meta = ec2.meta

        def get_paginator(self, name):
            raise RuntimeError("EC2 unreachable")

    now[0] += 60
    fresh = cached_live_catalog(cache, Failing(), None, names=["m5.large"], clock=lambda: now[0])
    assert (
        fresh.source.startswith("cache")
        and fresh.get("m5.large").allocatable == first.get("m5.large").allocatable
    )
    now[0] += 7 * 3600  # stale, and AWS still failing: the stale cache beats nothing
    stale = cached_live_catalog(cache, Failing(), None, names=["m5.large"], clock=lambda: now[0])
    assert stale.source.startswith("cache")
    cache.unlink()
    bundled = cached_live_catalog(cache, Failing(), None, names=["m5.large"], clock=lambda: now[0])
    assert bundled.source.startswith("bundled") and len(bundled) > 40
