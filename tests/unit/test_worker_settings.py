"""Bad worker settings and environment: every one answered with a clear line, before anything connects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime.settings import WorkerSettings, explain, unknown_variables

KARPFLOW = Path(sys.executable).with_name("karpflow")


def test_a_typo_in_a_variable_is_named_with_the_setting_it_resembles():
    lines = unknown_variables(
        {"KARPFLOW_CONTROLER": "false", "KARPFLOW_CLUSTER_NAME": "c", "KARPFLOW_STATE_DIR": "/s", "HOME": "/"}
    )
    assert lines == ["KARPFLOW_CONTROLER is not a karpflow setting (did you mean KARPFLOW_CONTROLLER?)"]


def test_every_setting_has_its_variable_known():
    every = {f"KARPFLOW_{name.upper()}": "x" for name in WorkerSettings.model_fields}
    assert unknown_variables(every) == []


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"cache_stale_after": -5},
            "--cache-stale-after / KARPFLOW_CACHE_STALE_AFTER: Input should be greater than 0",
        ),
        (
            {"health_port": 99999},
            "--health-port / KARPFLOW_HEALTH_PORT: Input should be less than or equal to 65535",
        ),
        ({"ec2_threads": "lots"}, "--ec2-threads / KARPFLOW_EC2_THREADS: Input should be a valid integer"),
    ],
    ids=["negative", "out-of-range", "not-a-number"],
)
def test_a_bad_value_names_its_flag_and_variable(values, expected):
    with pytest.raises(ValidationError) as caught:
        WorkerSettings(cluster_name="c", **values)
    assert expected in explain(caught.value)


def run_worker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KARPFLOW_", "TEMPORAL_"))}
    return subprocess.run(
        [str(KARPFLOW), "worker", "--no-health", *args],
        env={**clean, "KARPFLOW_CLUSTER_NAME": "c", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_worker_refuses_bad_settings_before_it_connects():
    done = run_worker({"KARPFLOW_HEALTH_PORT": "99999", "KARPFLOW_EC2_THREADS": "lots"})
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == "invalid worker settings:"
    assert "KARPFLOW_HEALTH_PORT" in done.stderr and "KARPFLOW_EC2_THREADS" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreachable_temporal_ends_the_worker_with_one_line_and_a_typo_is_warned():
    done = run_worker(
        {"KARPFLOW_CONTROLER": "false"},
        "--temporal-address",
        "127.0.0.1:1",
        "--temporal-connect-timeout",
        "0",
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "karpflow worker: cannot reach Temporal at 127.0.0.1:1 within 0s" in done.stderr
    assert "KARPFLOW_CONTROLER is not a karpflow setting (did you mean KARPFLOW_CONTROLLER?)" in (
        done.stdout + done.stderr
    )
