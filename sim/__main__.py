"""`python -m sim`: the simulator process of the dev stack — moto (EC2), the Kubernetes API emulator,
the simulated cluster's controllers and the invariant checker, until SIGTERM or Ctrl-C.

    python -m sim --kube-port 6443 --moto-port 4566 --scenario sim/scenarios/demo.yaml \\
                  --time-scale 1.0 --kubeconfig .state/kubeconfig

`karpflow dev up` starts it in the background; it is ready when `GET /sim/status` says
`"ready": true` on the emulator's port.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from sim.ports import port_is_free
from sim.scenario import ScenarioError
from sim.stack import SimStack, shutdown_moto


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kube-port", type=int, default=6443)
    parser.add_argument("--moto-port", type=int, default=4566)
    parser.add_argument("--cluster-name", default="karpflow-dev")
    parser.add_argument("--region", default="us-west-2")
    parser.add_argument("--time-scale", type=float, default=1.0, help="factor on every simulated delay")
    parser.add_argument("--scenario", help="a kubectl-style List (YAML or JSON) to seed the cluster with")
    parser.add_argument("--kubeconfig", help="where to write a kubeconfig for the emulator")
    parser.add_argument(
        "--secure-dir",
        help="serve HTTPS with a CA written to DIR/ca.crt, and authenticate and authorize every request",
    )
    parser.add_argument(
        "--controllers", help="comma-separated subset of the simulated controllers (default: all)"
    )
    parser.add_argument(
        "--karpenter",
        action="store_true",
        help="run a simulated Karpenter beside karpflow (sim/controllers/karpenter/); the scenario's "
        "nodes get NodeClaims",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    log = logging.getLogger("sim")

    for label, port in (("Kubernetes emulator", args.kube_port), ("EC2 (moto)", args.moto_port)):
        if port and not port_is_free(args.host, port):
            log.error("port %d (%s) on %s is in use by another process", port, label, args.host)
            return 2
    stack = SimStack(
        time_scale=args.time_scale,
        cluster_name=args.cluster_name,
        region=args.region,
        scenario=args.scenario,
        controllers=args.controllers.split(",") if args.controllers else None,
        host=args.host,
        kube_port=args.kube_port,
        moto_port=args.moto_port,
        kubeconfig_path=args.kubeconfig,
        secure=bool(args.secure_dir),
        tls_dir=Path(args.secure_dir) if args.secure_dir else None,
        karpenter=args.karpenter,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        stack.start()
    except ScenarioError as err:
        log.error("%s", err)
        stack.stop()
        shutdown_moto()
        return 2
    report = stack.seed_report
    if report is not None:
        log.info(
            "scenario %s: %s", args.scenario, ", ".join(f"{n} {kind}" for kind, n in report.created.items())
        )
    log.info(
        "Kubernetes API %s (kubeconfig %s), EC2 %s", stack.kube_url, stack.kubeconfig_path, stack.ec2_endpoint
    )
    stop.wait()
    log.info("stopping")
    stack.stop()
    shutdown_moto()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is stopped and nothing is kept on disk: skip the interpreter's finalization, which
    # takes seconds tearing down moto's tables and would make `dev down` wait for it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
