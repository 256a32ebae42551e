#!/usr/bin/env bash
# The README's main-job command: set up the venv if needed, start the local Polyaxon sandbox
# (server + local agent), register the components in its hub, run the storage-profile
# pipeline with small sizes, print the profile comparison and the runs-table URL.
# The server keeps running afterwards; the last line printed is the command that stops it.
# The two profiles emulate the classes of connections/vac-ebs-gp3.yaml with block-I/O limits
# (needs root and a blkio/io cgroup controller); elsewhere it says so and compares two plain
# media instead, which is not an emulation (docs/sandbox.md).
# Extra arguments go to `python -m sandbox demo` (e.g. --port 8100, -P steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m sandbox demo "$@"
