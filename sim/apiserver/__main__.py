"""`python -m sim.apiserver --port 6443`: the emulator on its own, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from sim.apiserver.flowcontrol import FlowControlConfig
from sim.apiserver.runner import EmulatorServer
from sim.apiserver.store import Store
from sim.timescale import TimeScale


async def serve(args: argparse.Namespace) -> None:
    srv = EmulatorServer(
        Store(TimeScale(args.timescale)),
        host=args.host,
        port=args.port,
        bookmark_interval=args.bookmark_interval,
        flow_control=(
            FlowControlConfig(seats_per_second=args.flow_control_seats, user_share=args.flow_control_share)
            if args.flow_control_seats
            else None
        ),
    )
    await srv.start()
    if args.kubeconfig:
        srv.write_kubeconfig(args.kubeconfig)
    print(
        f"Kubernetes API emulator on {srv.url}"
        + (f" (kubeconfig {args.kubeconfig})" if args.kubeconfig else ""),
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await srv.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m sim.apiserver", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument(
        "--timescale", type=float, default=1.0, help="factor on grace periods (0 = immediate)"
    )
    parser.add_argument("--kubeconfig", help="write a kubeconfig for this server to this path")
    parser.add_argument("--bookmark-interval", type=float, default=10.0)
    parser.add_argument(
        "--flow-control-seats",
        type=float,
        help="API Priority and Fairness, simplified (flowcontrol.py): seats the server serves a second",
    )
    parser.add_argument(
        "--flow-control-share", type=float, default=0.5, help="the most of them one user may take"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
