"""The shipped package holds the product and nothing else, and works without the development extra.

Builds the wheel from this checkout, installs it into a fresh virtual environment (dependencies
from the package index, no `[dev]` extra), and checks what a worker image would run: every
workflow and activity imports, `karpflow worker --help` works, and `karpflow --help` lists only
the commands that work there. The Dockerfile must copy exactly the packages the wheel ships.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"activities", "api", "cluster", "kube", "launch", "planner", "runtime", "workflows"}
DEV_ONLY = ("sim/", "bench/", "tests/", "planner/testing.py", "cluster_builder.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("karpflow-*.whl")
    return built


def top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    return {name.split("/")[0] for name in names if "/" in name and ".dist-info/" not in name}


def test_the_wheel_ships_the_product_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert top_level(wheel) == PRODUCT
    assert {"cli.py", "worker.py"} <= set(names)
    leaked = [name for name in names if any(part in name for part in DEV_ONLY)]
    assert leaked == []


def test_the_dockerfile_copies_what_the_wheel_ships(wheel: Path) -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, flags=re.MULTILINE))
    assert copied == top_level(wheel)
    assert re.search(r"^COPY pyproject.toml README.md cli.py worker.py ./$", dockerfile, flags=re.MULTILINE)


@pytest.mark.slow(seconds=120)
def test_a_clean_install_runs_the_worker_and_hides_the_dev_commands(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, karpflow = venv / "bin" / "python", venv / "bin" / "karpflow"
    # --no-compile: the same files, without byte-compiling every module of every dependency up front
    # (about 40% of the install's CPU); the few modules the checks import compile as they load.
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", str(wheel)],
        check=True,
        capture_output=True,
    )

    modules = sorted(
        f"{package}.{path.stem}"
        for package in ("workflows", "activities")
        for path in (ROOT / package).glob("*.py")
        if path.stem != "__init__"
    )
    imported = subprocess.run(
        [
            str(python),
            "-c",
            f"import importlib; [importlib.import_module(m) for m in {modules!r}]; import worker",
        ],
        cwd=tmp_path,  # not the checkout: only the installed package may answer
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    sim = subprocess.run([str(python), "-c", "import sim"], cwd=tmp_path, capture_output=True, text=True)
    assert "No module named 'sim'" in sim.stderr

    worker_help = subprocess.run(
        [str(karpflow), "worker", "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert worker_help.returncode == 0, worker_help.stderr
    assert "--cluster-name" in worker_help.stdout

    main_help = subprocess.run([str(karpflow), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert main_help.returncode == 0, main_help.stderr
    commands = set(re.findall(r"^  (\w+)\s", main_help.stdout.split("Commands:")[1], flags=re.MULTILINE))
    assert {"worker", "plan", "controller", "status"} <= commands
    assert commands.isdisjoint({"dev", "demo", "sim"})
