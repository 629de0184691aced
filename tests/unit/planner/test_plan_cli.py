import json
from datetime import timedelta

import pytest
from click.testing import CliRunner
from moto import mock_aws

from cli import main
from sim.cluster_builder import ClusterBuilder


@pytest.fixture
def demo(tmp_path):
    """A small demo-like cluster: an empty node, a drifted one, a PDB-blocked one, an expired one."""
    b = ClusterBuilder(region="us-east-1")
    b.nodeclass(amis=["ami-new"], security_groups=["sg-1"])
    b.nodepool("default", budgets=[{"nodes": "50%"}])
    b.node("empty", zone="us-east-1b", ami="ami-new", security_groups="sg-1")
    b.daemonset_pod("empty")
    b.node("drifted", ami="ami-old", security_groups="sg-1")
    b.pod("web-1", "drifted", app="web")
    b.node("guarded", ami="ami-new", security_groups="sg-1")
    b.pod("api-1", "guarded", app="api")
    b.pdb("api", match_labels={"app": "api"}, allowed=0)
    b.node("ancient", age=timedelta(days=40), ami="ami-new", security_groups="sg-1")
    return b.write(tmp_path / "cluster.yaml")


def invoke(*args):
    return CliRunner().invoke(main, ["plan", *args], env={"COLUMNS": "200"})


def test_plan_prints_a_table_by_default(demo):
    result = invoke("--snapshot", str(demo), "--at", "2026-11-22T10:00:00Z")
    assert result.exit_code == 0, result.output
    assert "Plan at 2026-11-22T10:00:00Z  region us-east-1" in result.output
    assert "expiration" in result.output and "emptiness" in result.output
    assert "pdb default/api prevents pod evictions" in result.output
    assert "Disruption budgets per NodePool and reason: allowed when this pass starts → still allowed" in (
        result.output
    )
    # 4 nodes at 50%: 2 allowed at the start; expiration and emptiness each take one.
    budget_row = next(line for line in result.output.splitlines() if line.startswith("│ default "))
    cells = [cell.strip() for cell in budget_row.split("│")[1:-1]]
    assert cells == ["default", "4", "0", "2", "2 → 0", "2 → 0", "2 → 0"]
    assert "$0.0000" not in result.output  # expiration saves nothing: shown as "-"


def test_plan_json_has_the_documented_keys_and_region_from_node_labels(demo):
    result = invoke(
        "--snapshot", str(demo), "--at", "2026-11-22T10:00:00Z", "--output", "json", "--all-methods"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["at"] == "2026-11-22T10:00:00Z" and data["region"] == "us-east-1"
    methods = [c["method"] for c in data["commands"]]
    assert methods[:2] == ["expiration", "emptiness"]
    for command in data["commands"]:
        assert {
            "method",
            "reason",
            "decision",
            "nodes",
            "nodepools",
            "replacements",
            "savingsPerHour",
        } <= set(command)
    assert {
        "node": "guarded",
        "nodepool": "default",
        "reason": "pdb default/api prevents pod evictions",
        "details": [],
    } in data["blocked"]
    assert set(data["budgets"]["default"]) == {"Empty", "Drifted", "Underutilized"}


def test_several_snapshot_files_are_combined(demo, tmp_path):
    extra = ClusterBuilder(region="us-east-1")
    extra.node("late", ami="ami-new", security_groups="sg-1")
    second = extra.write(tmp_path / "more.json")
    result = invoke(
        "--snapshot", str(demo), "--snapshot", str(second), "-o", "json", "--at", "2026-11-22T10:00:00Z"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["summary"]["nodes"] == 5


def test_a_catalog_file_overrides_the_bundled_prices(demo, tmp_path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "region: us-east-1\ninstanceTypes:\n- name: m5.large\n  cpu: '2'\n  memory: 8Gi\n  pods: 29\n"
        "  offerings:\n  - {zone: us-east-1a, capacityType: on-demand, price: 1.0}\n"
        "  - {zone: us-east-1b, capacityType: on-demand, price: 2.0}\n"
    )
    result = invoke(
        "--snapshot", str(demo), "--catalog", str(catalog), "-o", "json", "--at", "2026-11-22T10:00:00Z"
    )
    assert result.exit_code == 0, result.output
    (empty,) = [c for c in json.loads(result.output)["commands"] if c["method"] == "emptiness"]
    assert empty["savingsPerHour"] == 2.0  # the empty node sits in us-east-1b


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--snapshot", "{missing}"], "missing.yaml: cannot read snapshot"),
        (["--snapshot", "{bad}"], "bad.yaml: not valid YAML/JSON"),
        (["--snapshot", "{demo}", "--catalog", "{bad}"], "bad.yaml: not valid YAML/JSON"),
        (
            ["--snapshot", "{demo}", "--catalog", "{badcatalog}"],
            "instance type m5.large: missing field 'memory'",
        ),
        (["--snapshot", "{demo}", "--at", "yesterday"], "--at: 'yesterday' is not an RFC 3339 time"),
        (["--snapshot", "{demo}", "--region", "eu-west-1"], "no data for region 'eu-west-1'"),
    ],
)
def test_bad_input_exits_2_with_a_message_naming_the_file_and_object(demo, tmp_path, args, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: List\nitems: [\n")
    badcatalog = tmp_path / "badcatalog.yaml"
    badcatalog.write_text("region: us-east-1\ninstanceTypes:\n- {name: m5.large, cpu: 2, pods: 29}\n")
    paths = {"missing": tmp_path / "missing.yaml", "bad": bad, "demo": demo, "badcatalog": badcatalog}
    result = invoke(*(a.format(**paths) for a in args))
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_malformed_objects_are_listed_as_problems_without_failing(tmp_path):
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n1")
    b.pod("broken", "n1", cpu="a-lot")
    path = b.write(tmp_path / "c.yaml")
    result = invoke("--snapshot", str(path), "--at", "2026-11-22T10:00:00Z")
    assert result.exit_code == 0
    assert "Pod default/broken: invalid quantity 'a-lot'" in result.output


def test_malformed_maps_are_problems_naming_file_kind_and_name_not_a_traceback(demo, tmp_path):
    bad = tmp_path / "extra.yaml"
    bad.write_text(
        "kind: NodeList\nitems:\n- metadata: {name: odd, labels: [a]}\n"
        "  status: {capacity: {cpu: '2', memory: 8Gi, pods: '30'}}\n- 42\n"
    )
    result = invoke(
        "--snapshot", str(demo), "--snapshot", str(bad), "-o", "json", "--at", "2026-11-22T10:00:00Z"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["problems"] == [
        f"{bad}: Node odd: metadata.labels: expected a map of strings, got list",
        f"{bad}: NodeList items[1]: not an object: 42 (skipped)",
    ]


def test_live_catalog_comes_from_ec2_through_the_standard_chain(demo):
    with mock_aws():
        result = invoke(
            "--snapshot", str(demo), "--live-catalog", "-o", "json", "--at", "2026-11-22T10:00:00Z"
        )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    # moto has EC2 but no Pricing API: on-demand prices come from the bundled table.
    assert data["catalog"] == "live EC2 (bundled table on-demand prices)" and data["region"] == "us-east-1"
    assert "expiration" in {c["method"] for c in data["commands"]}


def test_live_catalog_falls_back_to_the_bundled_table_with_a_warning_when_aws_fails(demo):
    unreachable = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing listens on the discard port
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    result = CliRunner().invoke(
        main,
        ["plan", "--snapshot", str(demo), "--live-catalog", "-o", "json", "--at", "2026-11-22T10:00:00Z"],
        env=unreachable,
    )
    assert result.exit_code == 0, result.output
    assert "karpflow plan: live catalog unavailable (" in result.stderr
    assert json.loads(result.stdout)["catalog"].startswith("bundled table")


def test_catalog_file_and_live_catalog_are_alternatives(demo, tmp_path):
    result = invoke("--snapshot", str(demo), "--catalog", str(tmp_path / "c.yaml"), "--live-catalog")
    assert result.exit_code == 2 and "--catalog and --live-catalog are alternatives" in result.output


def test_the_capture_time_of_a_snapshot_is_the_default_plan_time(tmp_path):
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n1")
    data = b.as_list()
    data["metadata"]["annotations"] = {"karpflow.io/captured-at": "2026-11-22T10:00:00Z"}
    path = tmp_path / "captured.json"
    path.write_text(json.dumps(data))
    result = invoke("--snapshot", str(path), "-o", "json")
    assert json.loads(result.output)["at"] == "2026-11-22T10:00:00Z"


def test_max_replacements_lets_multi_node_consolidation_launch_several_nodes(tmp_path):
    b = ClusterBuilder(region="us-east-1")
    b.nodeclass()
    b.nodepool(
        "default",
        budgets=[{"nodes": "100%"}],
        requirements=[
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5", "r5"]},
        ],
    )
    b.node("a", instance_type="m5.4xlarge")
    b.node("b", instance_type="m5.4xlarge")
    for i in range(2):
        b.pod(f"cpu-{i}", "a", cpu="3500m", memory="1Gi", app="cpu")
        b.pod(f"mem-{i}", "b", cpu="1", memory="14Gi", app="mem")
    path = b.write(tmp_path / "lopsided.yaml")
    args = ["--snapshot", str(path), "--at", "2026-11-22T10:00:00Z", "--output", "json"]

    [karpenter] = json.loads(invoke(*args).output)["commands"]
    assert karpenter["method"] == "single-node-consolidation" and karpenter["decision"] == "delete"
    [several] = json.loads(invoke(*args, "--max-replacements", "3").output)["commands"]
    assert several["method"] == "multi-node-consolidation" and several["nodes"] == ["a", "b"]
    assert 2 <= len(several["replacements"]) <= 3
    # Expected prices: the guaranteed (worst-case) saving of 2 new nodes need not beat one delete.
    assert several["savingsPerHourBest"] > karpenter["savingsPerHourBest"] == karpenter["savingsPerHour"]
    assert 0 < several["savingsPerHour"] < several["savingsPerHourBest"]
    bad = invoke(*args, "--max-replacements", "0")
    assert bad.exit_code == 2 and "--max-replacements" in bad.output


def test_drift_per_pass_takes_karpenters_pace_or_the_whole_budget(tmp_path):
    b = ClusterBuilder(region="us-east-1")
    b.nodeclass(amis=["ami-new"], security_groups=["sg-1"])
    b.nodepool("default", consolidate_after="Never", budgets=[{"nodes": "100%"}])
    for i in range(3):
        b.node(f"old-{i}", ami="ami-old", security_groups="sg-1", age=timedelta(days=9 - i))
    path = b.write(tmp_path / "cluster.yaml")

    def drift_nodes(*args: str) -> list[list[str]]:
        result = invoke("--snapshot", str(path), "--at", "2026-11-22T10:00:00Z", "-o", "json", *args)
        assert result.exit_code == 0, result.output
        return [c["nodes"] for c in json.loads(result.output)["commands"] if c["method"] == "drift"]

    assert drift_nodes() == [["old-0"], ["old-1"], ["old-2"]]
    assert drift_nodes("--drift-per-pass", "1") == [["old-0"]]
    assert invoke("--snapshot", str(path), "--drift-per-pass", "0").exit_code == 2
