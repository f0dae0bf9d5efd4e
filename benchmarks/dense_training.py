"""Dense training throughput: `recsys train` (sasrec, `train.predict_at = "all"`, defaults otherwise)
beside the reference plain-PyTorch SASRec trained with cross-entropy at every position
(../shared/anchors/sasrec_ce_reference.py), on the same data, one after the other in one run.

Both train ``--steps`` steps of 128 windows of up to 20 clicks with no validation in the loop;
the reference's windows end at a random click, as ``recsys.data.batches.WindowSampler`` draws them
with ``tiled=False``, so its targets/s is its windows/s times that sampler's expected targets per
window. Ours is the median of its logged windows (``metrics.jsonl``). Prints a ratio table.

    python benchmarks/dense_training.py --data .gpu_data/taobao/sequences.txt [--steps 5000]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from recsys.config import load_config
from recsys.data import load_dataset, split_dataset
from recsys.data.batches import WindowSampler

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "anchors" / "sasrec_ce_reference.py"


def _reference(path: str, script: Path, steps: int) -> float:
    """The reference's windows/s over ``steps`` steps (no validation in the loop)."""
    out = subprocess.run(
        [sys.executable, str(script), path, "--max-steps", str(steps), "--eval-every", str(10**9), "--minutes", "60"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(re.search(r"([\d,]+) seq/s", out).group(1).replace(",", ""))


def _ours(path: str, steps: int, extra: list[str]) -> tuple[float, float]:
    """Median (samples/s, targets/s) over the logged windows after the first of a dense sasrec run."""
    with tempfile.TemporaryDirectory() as tmp:
        sets = [
            f"data.source={path}",
            "model.name=sasrec",
            "train.predict_at=all",
            f"train.max_steps={steps}",
            f"train.eval_every={10**9}",
            "train.patience=0",
            "train.log_every=250",
            f"output_dir={tmp}",
            "name=bench",
            *extra,
        ]
        subprocess.run(
            [sys.executable, "-m", "recsys", "train", *[x for s in sets for x in ("--set", s)]],
            capture_output=True,
            text=True,
            check=True,
        )
        rows = [json.loads(line) for run in Path(tmp).iterdir() for line in (run / "metrics.jsonl").open()]
        rows = [r for r in rows if "targets_per_s" in r][1:]
        return (
            statistics.median(r["samples_per_s"] for r in rows),
            statistics.median(r["targets_per_s"] for r in rows),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", action="append", required=True, help="a file `recsys train --data` reads (repeatable)")
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--set", action="append", default=[], help="extra overrides for ours")
    a = ap.parse_args()
    lines = [
        "| data | reference windows/s | reference targets/s | ours windows/s | ours targets/s | targets/s ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for path in a.data:
        cfg = load_config(None, [f"data.source={path}"])
        split = split_dataset(load_dataset(cfg), cfg.data)
        per_window = WindowSampler(*split.train_csr(), cfg.data.max_len, seed=0, tiled=False).mean_targets()
        ref = _reference(path, a.reference, a.steps)
        ours_w, ours_t = _ours(path, a.steps, a.set)
        lines.append(
            f"| {Path(path).parent.name or path} | {ref:,.0f} | {ref * per_window:,.0f} | {ours_w:,.0f} | "
            f"{ours_t:,.0f} | {ours_t / (ref * per_window):.2f}x |"
        )
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
