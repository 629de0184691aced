"""The `karpflow` command."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """karpflow: Karpenter-style node disruption as durable Temporal workflows."""


if __name__ == "__main__":
    main()
