"""The `karpflow` command.

Each subcommand lives beside the code it drives and is imported only when invoked, so
`karpflow --help` stays fast and a missing optional part never breaks the others. The shipped
package (the wheel, the worker image) holds the product only; `dev`, `demo` and `sim` drive the
local stack in sim/, which comes with the development install (`make install`), so a plain
`pip install karpflow` lists only the commands that work there.
"""

from __future__ import annotations

import importlib
import os
import shlex
from pathlib import Path

import click

# name -> "module:attribute" of a click command or group.
SUBCOMMANDS: dict[str, str] = {
    "plan": "planner.cli:plan",
    "windows": "planner.windows_cli:windows",
    "controller": "runtime.controller_cli:controller",
    "status": "runtime.controller_cli:status",
    "pause": "runtime.controller_cli:pause",
    "resume": "runtime.controller_cli:resume",
    "approve": "runtime.controller_cli:approve",
    "reject": "runtime.controller_cli:reject",
    "rollout": "runtime.rollout_cli:rollout",
    "disrupt": "runtime.disrupt_cli:disrupt",
    "codec-server": "runtime.codec_server:codec_server",
    "uninstall": "runtime.uninstall_cli:uninstall",
    "dev": "sim.devstack_cli:dev",
    "demo": "sim.demo:demo",
    "sim": "sim.cli:sim",
    "worker": "worker:cli",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in SUBCOMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            # Only a missing subcommand module (or its package) hides the command; a broken import
            # inside a module that is present must surface.
            if not _names_module_or_parent(err.name, module_name):
                raise
            return None
        command = getattr(module, attribute, None)
        return command if isinstance(command, click.Command) else None


def _names_module_or_parent(missing: str | None, module_name: str) -> bool:
    return missing is not None and (missing == module_name or module_name.startswith(missing + "."))


def stack_environment(state_dir: Path) -> dict[str, str]:
    """The variables `DIR/env` exports (what `source DIR/env` would set), `$PATH` expanded."""
    found = {"KARPFLOW_STATE_DIR": str(state_dir)}
    env_file = state_dir / "env"
    if not env_file.is_file():
        return found
    for line in env_file.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            found[name] = value.replace("$PATH", os.environ.get("PATH", ""))
    return found


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Use the dev stack of this state directory, for every subcommand: the same as "
    "`source DIR/env` first (a `karpflow dev up` writes it). Without it, subcommands read that "
    "environment, else the default stack in .state/.",
)
def main(state_dir: Path | None) -> None:
    """karpflow: Karpenter-style node disruption as durable Temporal workflows."""
    if state_dir is not None:
        environment = stack_environment(state_dir.resolve())
        if "KUBECONFIG" not in environment and click.get_current_context().invoked_subcommand not in (
            "dev",
            "demo",
        ):
            click.echo(
                f"karpflow: no dev stack in {state_dir} (no env file); `karpflow dev up` writes it", err=True
            )
        os.environ.update(environment)


if __name__ == "__main__":
    main()
