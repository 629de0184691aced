import pytest
import yaml

from api.quantity import millicores, to_int
from planner.catalog import (
    CatalogError,
    bundled_catalog,
    catalog_from_dict,
    catalog_to_dict,
    eks_max_pods,
    kube_reserved_cpu_millicores,
    load_catalog,
    load_catalog_file,
)

MIB = 1 << 20


def test_bundled_catalog_covers_both_regions_and_the_common_families():
    for region, zones in (("us-east-1", 4), ("us-west-2", 3)):
        catalog = bundled_catalog(region)
        assert len(catalog) >= 40
        assert len(catalog.zones) == zones and all(z.startswith(region) for z in catalog.zones)
        families = {t.family for t in catalog}
        assert {"m5", "m6i", "m7i", "c5", "c6i", "c7i", "r5", "r6i", "r7i", "t3"} <= families
        assert {"m6g", "c6g", "r6g", "m7g"} <= families
        for t in catalog:
            assert {o.capacity_type for o in t.offerings} == {"on-demand", "spot"}
            for zone in catalog.zones:
                assert t.price(zone, "spot") < t.price(zone, "on-demand")


def test_published_on_demand_prices_and_arch():
    catalog = bundled_catalog("us-east-1")
    assert catalog.get("m5.large").price("us-east-1a", "on-demand") == 0.096
    assert catalog.get("c6i.xlarge").price("us-east-1b", "on-demand") == 0.17
    assert catalog.get("r5.large").price("us-east-1c", "on-demand") == 0.126
    assert catalog.get("m6g.large").arch == "arm64"


@pytest.mark.parametrize(
    ("name", "pods"),
    [
        ("t3.micro", 4),
        ("t3.small", 11),
        ("t3.medium", 17),
        ("t3.large", 35),
        ("m5.large", 29),
        ("m5.xlarge", 58),
        ("m5.4xlarge", 234),
        ("c5.9xlarge", 234),
        ("m6g.medium", 8),
    ],
)
def test_max_pods_match_eks_eni_max_pods(name, pods):
    assert bundled_catalog().get(name).pods == pods


def test_eni_formula():
    assert eks_max_pods(3, 10) == 29
    assert eks_max_pods(15, 50) == 737


def test_kube_reserved_cpu_follows_the_tiered_table():
    assert kube_reserved_cpu_millicores(1000) == 60
    assert kube_reserved_cpu_millicores(2000) == 70
    assert kube_reserved_cpu_millicores(4000) == 80
    assert kube_reserved_cpu_millicores(8000) == 90
    assert kube_reserved_cpu_millicores(36000) == 160


def test_allocatable_derivation_for_m5_large():
    t = bundled_catalog().get("m5.large")
    # 8 GiB less 7.5% VM overhead (615 MiB) is the capacity; less 11*29+255 MiB kube-reserved and 100 MiB
    # eviction threshold is allocatable.
    assert t.capacity == {"cpu": "2", "memory": "7577Mi", "pods": "29", "ephemeral-storage": "20Gi"}
    assert t.allocatable == {"cpu": "1930m", "memory": "6903Mi", "pods": "29", "ephemeral-storage": "17Gi"}
    # The resource dicts parse back to the same numbers the planner uses.
    assert millicores(t.allocatable["cpu"]) == t.allocatable_resources.cpu
    assert to_int(t.allocatable["memory"]) == t.allocatable_resources.memory == 6903 * MIB


OVERRIDE = """
region: us-west-2
instanceTypes:
- name: m5.large
  cpu: "2"
  memory: 8Gi
  pods: 29
  arch: amd64
  allocatable: {cpu: 1930m, memory: 7Gi, pods: "29"}
  offerings:
  - {zone: us-west-2a, capacityType: on-demand, price: 0.096}
  - {zone: us-west-2a, capacityType: spot, price: 0.038}
- name: m6g.large
  cpu: 2
  memory: 8Gi
  pods: 29
  arch: arm64
  offerings:
  - {zone: us-west-2b, capacityType: spot, price: 0.03, available: false}
"""


def test_a_catalog_file_overrides_the_bundled_table(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(OVERRIDE)
    catalog = load_catalog(path)
    assert catalog.region == "us-west-2" and len(catalog) == 2
    m5 = catalog.get("m5.large")
    assert m5.allocatable["memory"] == "7Gi" and m5.allocatable["cpu"] == "1930m"
    assert m5.price("us-west-2a", "spot") == 0.038
    graviton = catalog.get("m6g.large")
    assert graviton.allocatable["memory"] == "6903Mi"  # derived when absent
    assert graviton.compatible_offerings() == []  # unavailable offerings are not offered
    again = catalog_from_dict(yaml.safe_load(yaml.safe_dump(catalog_to_dict(catalog))), "again")
    assert again.get("m5.large").allocatable == m5.allocatable


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("region: us-west-2\ninstanceTypes: []", "non-empty"),
        ("instanceTypes: [{name: a}]", "'region' is required"),
        (
            "region: r\ninstanceTypes: [{name: m5.large, cpu: 2, pods: 29, offerings: []}]",
            "instance type m5.large: missing field 'memory'",
        ),
        (
            "region: r\ninstanceTypes: [{name: m5.large, cpu: two, memory: 8Gi, pods: 29}]",
            "instance type m5.large: invalid quantity",
        ),
        (
            "region: r\ninstanceTypes: [{name: x.large, cpu: 2, memory: 8Gi, pods: 29,"
            " offerings: [{zone: a, capacityType: cheap, price: 1}]}]",
            "capacityType 'cheap'",
        ),
        (
            "region: r\ninstanceTypes: [{name: x.large, cpu: 2, memory: 8Gi, pods: 29}]",
            "at least one offering",
        ),
        ("region: [", "not valid YAML"),
    ],
)
def test_bad_catalog_files_name_the_file_and_entry(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message) as info:
        load_catalog_file(path)
    assert str(path) in str(info.value)


def test_missing_catalog_file_and_unknown_region_are_clear_errors(tmp_path):
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog_file(tmp_path / "nope.yaml")
    with pytest.raises(CatalogError, match="eu-west-1"):
        bundled_catalog("eu-west-1")
