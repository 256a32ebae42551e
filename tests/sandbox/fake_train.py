"""A stand-in training job for the sandbox tests: writes "checkpoints" into a directory,
times them, and logs inputs/outputs with the project's Polyaxon tracking like the trainer.

Run from the repo root: ``python tests/sandbox/fake_train.py --checkpoint-dir DIR ...``.
Exit 3 when the checkpoint directory's parent is missing (a missing profile medium).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from trainer.tracking import tracked_run


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--storage-profile", default=os.environ.get("STORAGE_PROFILE", ""))
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    ckpt_dir = Path(args.checkpoint_dir)
    if not ckpt_dir.parent.is_dir():
        print(f"fake_train: error: checkpoint dir parent {ckpt_dir.parent} is missing")
        return 3
    ckpt_dir.mkdir(exist_ok=True)
    start = time.perf_counter()
    with tracked_run("fake-train", tags=["sandbox-test"]) as tracker:
        tracker.log_inputs(storage_profile=args.storage_profile, checkpoint_dir=str(ckpt_dir))
        pauses = []
        for step in range(1, args.checkpoints + 1):
            t0 = time.perf_counter()
            with open(ckpt_dir / f"step-{step}.bin", "wb") as out:
                out.write(os.urandom(args.bytes))
                out.flush()
                os.fsync(out.fileno())
            pauses.append(time.perf_counter() - t0)
            tracker.log_metrics(step, {"ckpt_pause_s": pauses[-1], "loss": 1.0 / step})
            print(f"fake_train: checkpoint {step} written to {ckpt_dir} in {pauses[-1]:.4f}s")
            time.sleep(args.sleep)
        pauses.sort()
        tracker.log_outputs(
            ckpt_pause_s_total=sum(pauses),
            ckpt_pause_s_median=pauses[len(pauses) // 2],
            ckpt_write_s_median=pauses[len(pauses) // 2],
            runtime_s=time.perf_counter() - start,
            final_loss=1.0 / args.checkpoints,
        )
    print(f"fake_train: done, HOME={os.environ.get('HOME')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
