"""`karpflow controller start|status` and `karpflow status [--output json]`.

Settings come from the worker's (KARPFLOW_* variables); the dev stack's `.state/env` fills in what the
environment does not say, so `karpflow status` works right after `karpflow dev up`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from api.controller_io import QUERY_STATUS, ControllerStatus
from api.workflow_ids import controller_workflow_id
from runtime.settings import WorkerSettings, explain


def _dev_env(path: Path) -> None:
    """Fill os.environ from the dev stack's env file (`export NAME=value` lines); set ones win."""
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        if name and value:
            os.environ.setdefault(name.strip(), value.strip().strip("'\""))


def _settings(env_file: str | None) -> WorkerSettings:
    _dev_env(
        Path(env_file or os.environ.get("KARPFLOW_STATE_DIR", ".state")) / "env"
        if not env_file
        else Path(env_file)
    )
    try:
        return WorkerSettings()
    except ValidationError as err:
        click.echo(explain(err), err=True)
        sys.exit(2)


async def _client(settings: WorkerSettings) -> Any:
    from runtime.connections import connect_temporal

    return await connect_temporal(settings)


async def fetch_status(settings: WorkerSettings) -> ControllerStatus:
    client = await _client(settings)
    handle = client.get_workflow_handle(controller_workflow_id(settings.cluster_name))
    return await handle.query(QUERY_STATUS, result_type=ControllerStatus)


def _print(status: ControllerStatus, output: str) -> None:
    if output == "json":
        click.echo(status.model_dump_json(indent=2))
        return
    click.echo(
        f"controller of {status.cluster}: {'quiet' if status.quiet else 'busy'}"
        f"{'' if status.synced else ' (cache not synced yet)'}"
    )
    if status.last_pass_at is not None:
        click.echo(
            f"last pass {status.last_pass_at:%H:%M:%S} ({status.last_pass_seconds:.2f}s), "
            f"passes {status.passes}"
        )
    for workflow_id in status.commands:
        click.echo(f"  started  {workflow_id}")
    for workflow_id in status.validating:
        click.echo(f"  validating {workflow_id}")
    for running in status.in_flight:
        click.echo(f"  in flight {running.workflow_id} ({', '.join(running.nodes)})")
    for backoff in status.backoffs:
        click.echo(
            f"  backoff  {backoff.pool}/{backoff.reason} until {backoff.until:%H:%M:%S} "
            f"({backoff.failures} failures)"
        )
    for pool, reasons in sorted(status.budgets.items()):
        click.echo(f"  budget   {pool}: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())))
    for blocked in status.blocked:
        click.echo(f"  blocked  {blocked.node}: {blocked.reason}")
    for problem in status.problems:
        click.echo(f"  problem  {problem}")


_output = click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text")
_env = click.option("--env-file", help="KARPFLOW_* settings file (default: the dev stack's .state/env)")


@click.command("status")
@_output
@_env
def status(output: str, env_file: str | None) -> None:
    """What the cluster's controller did last and whether the cluster is quiet."""
    settings = _settings(env_file)
    _print(asyncio.run(fetch_status(settings)), output)


@click.group("controller")
def controller() -> None:
    """The cluster's ControllerWorkflow (every worker starts it; these commands are for people)."""


@controller.command("start")
@_env
def start(env_file: str | None) -> None:
    """Start the controller unless it runs already (idempotent)."""
    from worker import start_controller

    settings = _settings(env_file)

    async def run() -> bool:
        return await start_controller(await _client(settings), settings)

    started = asyncio.run(run())
    workflow_id = controller_workflow_id(settings.cluster_name)
    click.echo(f"{workflow_id}: {'started' if started else 'already running'}")


@controller.command("status")
@_output
@_env
def controller_status(output: str, env_file: str | None) -> None:
    """Same as `karpflow status`."""
    settings = _settings(env_file)
    _print(asyncio.run(fetch_status(settings)), output)
