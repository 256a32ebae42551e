"""``python -m operator_standin``: run the operator stand-in against one namespace."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from kubernetes import client, config

from operator_standin import crd
from operator_standin.controller import ApiStatusSink, Controller, Reconciler
from operator_standin.crd import JOB_PLURAL, KFJOB_PLURAL

EXIT_CONFIG = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m operator_standin",
        description="Stand-in for Polyaxon's operator: runs polyaxon.com/v1 Jobs as batch Jobs "
        "and KfJobs as PyTorchJobs.",
    )
    parser.add_argument("--namespace", default=os.environ.get("POLYAXON_K8S_NAMESPACE"))
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument(
        "--api-host",
        default=os.environ.get("POLYAXON_HOST"),
        help="Polyaxon API to post statuses to (default $POLYAXON_HOST; none: status only "
        "on the objects)",
    )
    parser.add_argument("--install-crds", action="store_true", help="create the CRDs first")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.namespace:
        print(
            "operator_standin: --namespace (or POLYAXON_K8S_NAMESPACE) is required", file=sys.stderr
        )
        return EXIT_CONFIG
    if not args.kubeconfig:
        print("operator_standin: --kubeconfig (or KUBECONFIG) is required", file=sys.stderr)
        return EXIT_CONFIG
    api = config.new_client_from_config(config_file=args.kubeconfig)
    if args.install_crds:
        crd.install(api)
    sink = (
        ApiStatusSink(args.api_host, os.environ.get("POLYAXON_AUTH_TOKEN"))
        if args.api_host
        else None
    )
    # One controller per kind, sharing one stop: Jobs become batch Jobs, KfJobs PyTorchJobs.
    jobs = Controller(Reconciler(api, args.namespace, sink, JOB_PLURAL))
    kfjobs = Controller(
        Reconciler(api, args.namespace, sink, KFJOB_PLURAL), stop_event=jobs.stop_event
    )
    signal.signal(signal.SIGTERM, lambda *_: jobs.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: jobs.stop_event.set())
    logging.getLogger("operator_standin").info(
        "watching polyaxon.com/v1 jobs and kfjobs in %s (statuses to %s)",
        args.namespace,
        args.api_host or "-",
    )
    kfjobs.start()
    try:
        jobs.run_forever()
    finally:
        kfjobs.stop()
    client.ApiClient.close(api)
    return 0


if __name__ == "__main__":
    sys.exit(main())
