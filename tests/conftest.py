"""Fixtures shared by every test: the real Temporal servers from the wheels, found without PATH."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import TypeVar

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings
from temporalio.testing import WorkflowEnvironment

from sim.binaries import temporal_cli, temporal_test_server

T = TypeVar("T")

# Hypothesis example counts: `ci` (the default) keeps `make test` short; `nightly` searches longer
# (HYPOTHESIS_PROFILE=nightly). Tests with their own @settings(max_examples=...) keep theirs.
settings.register_profile("ci", max_examples=60, deadline=timedelta(seconds=2), print_blob=True)
settings.register_profile(
    "nightly", max_examples=2000, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

logging.getLogger("werkzeug").setLevel(logging.ERROR)


@pytest_asyncio.fixture(scope="module")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server: a one-hour workflow.sleep returns in milliseconds.

    One per test module (it starts in ~0.1 s): a workflow cancelled while one of its activities ran
    leaves that server's time skipping off for good (the activity's lock is never released), and
    every later timer of the session then took its real time (a 15 s test that takes 0.1 s)."""
    env = await WorkflowEnvironment.start_time_skipping(test_server_existing_path=temporal_test_server())
    try:
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def dev_server_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real Temporal dev server (`temporal server start-dev`), in memory, no UI."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        ui=False,
        dev_server_extra_args=[
            "--dynamic-config-value",
            "frontend.enableServerVersionCheck=false",
        ],
    )
    try:
        yield env
    finally:
        await env.shutdown()


def pytest_unconfigure(config: pytest.Config) -> None:
    # temporalio sdk-python #300: the Rust core can abort the interpreter at exit
    # ("PyGILState_Release ... finalizing", exit 134) after every test passed. Leave with the
    # session's own status before finalization can run.
    status = getattr(config, "_karpflow_exitstatus", None)
    if status is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(int(status))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._karpflow_exitstatus = exitstatus  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests marked slow run first, so that none is left running alone at the end. Under xdist's
    # work stealing each worker starts on a contiguous block of the list: with every slow test at
    # the front, one worker got them all and ran them one after the other (a clean clone's last
    # 100 s had one worker busy). Each block now starts with its share of them, longest first.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    items[:] = spread_slow_first(items, workers, slow_seconds)


# What a test marked `slow` without `seconds=` is taken to last, for the order above.
SLOW_SECONDS = 30.0


def slow_seconds(item: pytest.Item) -> float | None:
    """`@pytest.mark.slow(seconds=N)`: about N s on a clean clone's 2 cores; None for a fast test."""
    marker = item.get_closest_marker("slow")
    return None if marker is None else float(marker.kwargs.get("seconds", SLOW_SECONDS))


def spread_slow_first(items: list[T], workers: int, seconds: Callable[[T], float | None]) -> list[T]:
    """The slow items (`seconds` not None) dealt to the heads of the blocks xdist's work stealing
    hands its `workers` at the start (block k: what is left divided by the workers left): longest
    first, each to the block with the fewest slow seconds so far, so that the longest ones start at
    once on different workers; fast ones after, in their order. Stealing takes from a queue's tail,
    so a block's head stays with its worker."""
    slow = sorted((item for item in items if seconds(item) is not None), key=lambda i: -(seconds(i) or 0))
    fast = [item for item in items if seconds(item) is None]
    if workers <= 1:
        return slow + fast
    blocks: list[list[T]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in slow:
        k = loads.index(min(loads))
        blocks[k].append(item)
        loads[k] += seconds(item) or 0
    rest = iter(fast)
    spread: list[T] = []
    remaining = len(items)
    for k, block in enumerate(blocks):
        size = remaining // (workers - k)
        remaining -= size
        spread += block + list(itertools.islice(rest, max(size - len(block), 0)))
    return spread + list(rest)
