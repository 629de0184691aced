"""pytest fixtures for tests that need the simulated cluster. Import them into a conftest.py:

    # tests/integration/<area>/conftest.py
    from sim.testing import make_sim_stack, pytest_configure, sim_stack  # noqa: F401

    @pytest.mark.integration
    def test_something(sim_stack):                   # small.yaml, time scale 0.01, every controller
        kubectl("get", "nodes", kubeconfig=sim_stack.kubeconfig_path)

    @pytest.mark.sim_stack(scenario=DEMO, time_scale=0.05, controllers=["nodes", "kubelet"])
    def test_configured(sim_stack): ...              # any SimStack keyword, per test

    def test_two_phases(make_sim_stack):
        stack = make_sim_stack(scenario=None)        # started now, stopped at teardown

Each test gets its own stack (a fresh store, a cluster name and VPC of its own in the process's
moto, no faults); start-up is ~0.3-0.8 s with small.yaml once moto has loaded (~2 s, the first
time in a process). At teardown the stack is stopped even when
the test failed; `assert_no_violations(stack)` is the usual last line of a scenario test.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.stack import SimStack

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
SMALL = SCENARIOS / "small.yaml"  # three nodes: busy, nearly empty (spot), empty
DEMO = SCENARIOS / "demo.yaml"  # thirteen nodes, three NodePools
DEFAULTS: dict[str, Any] = {"time_scale": 0.01, "scenario": SMALL}


def wait_for(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll until `predicate()` is truthy; return its value or fail naming `what`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}; last value {last!r}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim_stack(**kwargs): SimStack keyword arguments for the sim_stack fixture"
    )


@pytest.fixture
def make_sim_stack() -> Iterator[Callable[..., SimStack]]:
    """A factory: `make_sim_stack(**SimStack kwargs)` returns a started stack (DEFAULTS filled in,
    and a cluster name of its own)."""
    stacks: list[SimStack] = []

    def make(**kwargs: Any) -> SimStack:
        # moto is shared by the whole process: a fresh cluster name keeps tests apart.
        kwargs.setdefault("cluster_name", f"karpflow-test-{uuid.uuid4().hex[:6]}")
        stack = SimStack(**{**DEFAULTS, **kwargs})
        stacks.append(stack)
        return stack.start()

    try:
        yield make
    finally:
        for stack in reversed(stacks):
            stack.stop()


@pytest.fixture
def sim_stack(request: pytest.FixtureRequest, make_sim_stack: Callable[..., SimStack]) -> SimStack:
    """A started SimStack; configure it with `@pytest.mark.sim_stack(**kwargs)`."""
    marker = request.node.get_closest_marker("sim_stack")
    return make_sim_stack(**(marker.kwargs if marker else {}))


def kubectl(stack: SimStack, *args: str, check: bool = True, timeout: float = 30) -> str:
    """Run the real kubectl against the stack; returns stdout (raises with stderr on failure)."""
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(stack.kubeconfig_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


def assert_no_violations(stack: SimStack, in_flight: Iterable[str] | None = None) -> None:
    """A test's last line: its window is closed, so a disrupted taint left on a node not named in
    `in_flight` is a violation (see `InvariantChecker.check(end_of_window=True)`)."""
    report = stack.check_invariants(in_flight, end_of_window=True)
    assert report.ok, f"invariant violations:\n{report.summary()}"
