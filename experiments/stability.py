"""Training stability at a 10x learning rate, with and without each softmax-stability switch.

Runs comirec_sa and sasrec_mi at ``train.lr`` = 10 x the default (0.01), in bf16 autocast where
a GPU is available, once plain and once per switch (``train.z_loss``; for sasrec_mi also
``model.qk_norm`` and ``model.softcap``), with the same data, seed and budget. Plots the
training loss, gradient norm, output log-partition and max attention logit (from each run's
``metrics.jsonl``) to a PNG and prints a Markdown summary.

Usage::

    python experiments/stability.py --data ../shared/data/taobao/sequences.txt \
        [--steps 3000] [--png experiments/stability.png] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import math
import time

from recsys.config import load_config
from recsys.run import RunDir
from recsys.train.trainer import train

VARIANTS = {
    "comirec_sa": {"plain": [], "z_loss 1e-4": ["train.z_loss=0.0001"]},
    "sasrec_mi": {
        "plain": [],
        "z_loss 1e-4": ["train.z_loss=0.0001"],
        "qk_norm rms": ["model.qk_norm=rms"],
        "softcap 20": ["model.softcap=20"],
        "all three": ["train.z_loss=0.0001", "model.qk_norm=rms", "model.softcap=20"],
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=0.01, help="10x the default 0.001")
    ap.add_argument("--png", default="experiments/stability.png")
    ap.add_argument("--output-dir", default="runs/stability")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    base = [
        f"data.source={args.data}",
        "data.max_len=50",
        f"train.lr={args.lr}",
        f"train.max_steps={args.steps}",
        "train.batch_size=512",
        "train.log_every=25",
        f"train.eval_every={args.steps}",
        "train.patience=0",
        f"output_dir={args.output_dir}",
        *args.overrides,
    ]
    curves, rows = {}, []
    for model, variants in VARIANTS.items():
        for label, extra in variants.items():
            name = f"{model} {label}"
            cfg = load_config(None, base + [f"model.name={model}", *extra])
            t0 = time.perf_counter()
            result = train(cfg, log=lambda line: None)
            records = [r for r in RunDir(result.run_dir).read_metrics() if "loss" in r]
            curves[name] = records
            losses = [r["loss"] for r in records]
            finite = all(math.isfinite(x) for x in losses)
            rows.append(
                (
                    name,
                    losses[-1],
                    max(r["grad_norm"] for r in records),
                    max(r.get("max_attention_logit", float("nan")) for r in records),
                    records[-1]["log_z"],
                    result.test_metrics.get("recall@50", float("nan")),
                    finite,
                    time.perf_counter() - t0,
                )
            )
            print(f"{name}: final loss {losses[-1]:.4f}  test recall@50 {rows[-1][5]:.4f}", flush=True)

    print(
        f"\n| run (lr {args.lr}, {args.steps} steps) | final loss | max grad norm | max attn logit | "
        "final log Z | test Recall@50 | finite | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.4f} | {r[2]:.2f} | {r[3]:.1f} | {r[4]:.2f} | {r[5]:.4f} | {r[6]} | {r[7]:.0f} |")
    _plot(curves, args.png)


def _plot(curves: dict[str, list[dict]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plotting needs matplotlib: pip install 'multi-interest-recsys[plot]'")
        return
    keys = [
        ("loss", "training loss"),
        ("grad_norm", "gradient norm (pre-clip)"),
        ("log_z", "output log-partition (mean log Z)"),
        ("max_attention_logit", "max attention logit"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.5))
    for ax, (key, title) in zip(axes, keys):
        for name, records in curves.items():
            pts = [(r["step"], r[key]) for r in records if key in r]
            if pts:
                ax.plot(*zip(*pts), label=name, linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
