#!/usr/bin/env bash
# The GPU path of issue 15, end to end, in under 5 minutes on a CUDA machine:
#   1. the trainer on CUDA, sync and async (raw format: device-to-host copies into the
#      pinned buffer overlap the O_DIRECT writes), with a resume that verifies;
#   2. the benchmark on CUDA (1 GiB state on the GPU; fio, torch.save, DCP, safetensors);
# then prints the trainer's stage timeline and the benchmark's ratios and targets.
#
# Usage: scripts/gpu-check.sh [DIR]   (DIR: a directory on the volume to measure;
#        default /var/tmp). Env: PYTHON (default .venv/bin/python, else python3),
#        SIZE (default 1GiB), REPEATS (default 3).
# Exit codes: 0 done (targets met or not: read the output); 2 no CUDA device;
#        other: the failing step's exit code.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
DIR=${1:-/var/tmp}
SIZE=${SIZE:-1GiB}
REPEATS=${REPEATS:-3}

if ! "$PY" - <<'PYEOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu-check: torch {torch.__version__} sees no CUDA device "
             f"(built for CUDA {torch.version.cuda}); run this on a GPU machine")
print(f"gpu-check: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
PYEOF
then
    exit 2
fi

mkdir -p "$DIR"
work=$(mktemp -d "$DIR/gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--device cuda --model-size 256MiB --checkpoint-every 10 --keep 2 --no-track)

echo "== trainer, sync (raw, overlapped staging through the pinned buffer)"
timeout 120 "$PY" -m trainer --checkpoint-dir "$work/sync" "${common[@]}" --steps 30 \
    --summary-json "$work/sync.json" | tail -n 6
echo "== trainer, async"
timeout 120 "$PY" -m trainer --checkpoint-dir "$work/async" "${common[@]}" --steps 30 --async \
    --summary-json "$work/async.json" | tail -n 6
echo "== trainer, resume from the async run's newest checkpoint (verifies its checksums)"
timeout 60 "$PY" -m trainer --checkpoint-dir "$work/async" "${common[@]}" --steps 40 --resume \
    | grep -E "resume:"

echo "== benchmark on CUDA ($SIZE, $REPEATS repeats)"
timeout 200 "$PY" -m trainer.bench --device cuda --dir "$work/bench" --size "$SIZE" \
    --repeats "$REPEATS" --streams 1,2,4 --train-rounds 5 --train-model-size 256MiB \
    --json "$work/bench.json" > "$work/bench.txt"
cat "$work/bench.txt"

"$PY" - "$work" <<'PYEOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
print("== trainer ratios")
for mode in ("sync", "async"):
    data = json.loads((work / f"{mode}.json").read_text())
    for r in data["checkpoints"]:
        gb = r["bytes"] / 1e9
        print(f"{mode:5} step {r['step']:3d}: {gb:.2f} GB pause {r['pause_s']:.3f}s "
              f"({r['pause_s'] / gb:.3f} s/GB) serialize {r['serialize_s']:.3f}s write {r['write_s']:.3f}s "
              f"overlapped={r['overlapped']} total {r['total_s']:.3f}s [{r['io_mode']}]")
bench = json.loads((work / "bench.json").read_text())
print("== benchmark targets (device: %s)" % bench["machine"].get("device"))
for name, t in bench["targets"].items():
    value = "n/a" if t["measured"] is None else f"{t['measured']:.2f}"
    print(f"  {name:<40} {value:>8} (target {t['op']} {t['target']}) {'met' if t['met'] else 'MISSED'}")
PYEOF
