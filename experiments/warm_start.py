"""Warm start on tomorrow's log: does a run that starts from yesterday's run reach the cold run's
validation recall in at most a third of its steps, and end no worse?

One command cuts a log into an earlier part and the whole (the later log), trains a run on the
earlier part, then two runs on the later log with the same config and seed: one cold (fresh
weights) and one warm (``recsys train --init-from`` the earlier run). It prints the steps each
later run took to reach the cold run's best validation objective, their ratio, and each run's best
validation and test numbers::

    python experiments/warm_start.py --config experiments/configs/data/amazon-beauty.toml --cut time
    python experiments/warm_start.py --config experiments/configs/data/taobao.toml --cut order

The cut keeps every click the later runs are evaluated on out of the earlier run's training, so
the warm run has not seen its own validation or test targets:

- ``--cut time`` (logs with real timestamps: Amazon Beauty, MovieLens): the earlier log is every
  click before the ``--earlier`` quantile of the click times (0.8), yesterday's log as it stood.
  All three runs use the time split (``data.split = "time"``): the later runs validate and test on
  the clicks after the later log's ``data.time_cutoff_quantile`` (0.9), which all fall after the
  earlier log's end.
- ``--cut order`` (logs without times: taobao): the earlier log is each user's first
  ``int(data.eval_input_frac * n)`` clicks of the later log as prepared, i.e. every user's history
  before their latest clicks. All three runs use the user split (``data.split = "user"``): the
  later runs' validation and test users are scored on exactly the clicks past that fraction, which
  the earlier log never holds. (A per-user cut is the only honest "earlier" without timestamps: an
  earlier/later user split would make the later log's evaluation users new users, not users who
  came back.)

The earlier log is cut from the later log as prepared (its filters applied), written as a CSV, and
prepared again as a log of its own. Runs already finished in ``--out`` are reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.config import Config, load_config
from recsys.data import Dataset, load_dataset
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.run import RunDir, build_experiment, load_run
from recsys.train.trainer import train
from recsys.train.warm_start import warm_start


def cut(ds: Dataset, how: str, earlier: float, input_frac: float) -> pd.DataFrame:
    """The earlier part of the prepared log ``ds`` as a click table (``user, item, timestamp`` and
    ``category`` where ``ds`` has categories), in each user's click order (ties in time keep it:
    the prepared log is sorted stably)."""
    lengths = np.diff(ds.indptr)
    user = np.repeat(np.arange(ds.num_users), lengths)
    position = np.arange(len(ds.items)) - np.repeat(ds.indptr[:-1], lengths)
    items = np.asarray(ds.items)
    times = np.asarray(ds.times) if ds.times is not None else position.astype(np.float64)
    if how == "time":
        keep = times < np.quantile(times, earlier)
    else:
        keep = position < np.repeat((input_frac * lengths).astype(np.int64), lengths)
    frame = {
        "user": np.asarray(ds.user_raw)[user[keep]],
        "item": np.asarray(ds.item_raw)[items[keep]],
        "timestamp": times[keep],  # the log's own times (or positions), so its ties read as the later log's
    }
    if ds.num_categories > 1:
        frame["category"] = np.asarray(ds.category_raw)[np.asarray(ds.item_category)[items[keep]]]
    return pd.DataFrame(frame)


def run(cfg: Config, out: Path, name: str, init_from: str | None = None) -> RunDir:
    """Train ``cfg`` as run ``out/name`` (or reuse it where it finished before)."""
    path = out / name
    if path.is_dir() and RunDir(path).is_finished():
        print(f"{name}: reusing {path}")
        return RunDir(path)
    print(f"{name}: training into {path}", flush=True)
    cfg = dataclasses.replace(cfg, name=name, output_dir=str(out))
    result = train(cfg, init_from=init_from, log=lambda line: print(f"  [{name}] {line}", flush=True))
    return RunDir(result.run_dir)


def valid_curve(rd: RunDir, key: str) -> list[tuple[int, float]]:
    """``(step, objective)`` of every validation of run ``rd``."""
    return [(r["step"], r[key]) for r in rd.read_metrics() if r.get("split") == "valid"]


def at_start(earlier: RunDir, cold: RunDir) -> float:
    """The validation objective of the later log's model as the warm run starts it (the earlier run's
    weights, rows by raw id), on the users the later runs validate on: the warm run's step 0."""
    cfg = cold.read_config()
    exp = build_experiment(cfg, dataset=cold.load_dataset())
    warm_start(exp, load_run(earlier.path))
    valid = exp.split.valid.sample(cfg.eval.valid_users, cfg.data.seed)
    metrics = evaluate_with_config(exp.model.eval(), valid, cfg, item_category=exp.dataset.catalogue_category)
    return metrics[cfg.eval.objective]


def first_reaching(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first validation step at or above ``target``, or None."""
    return next((step for step, value in curve if value >= target), None)


def summary(earlier: RunDir, cold: RunDir, warm: RunDir) -> tuple[list[dict[str, Any]], str]:
    """The table's rows and the verdict line of the acceptance test (the warm run's curve starts
    with its step 0: the earlier run's weights as they are)."""
    cfg = cold.read_config()
    key = cfg.eval.objective
    test_keys = [f"recall@{n}" for n in sorted(cfg.eval.topn)]
    curves = {"cold": valid_curve(cold, key), "warm": [(0, at_start(earlier, cold)), *valid_curve(warm, key)]}
    target = max(value for _, value in curves["cold"])
    rows, reached = [], {}
    for label, rd in (("cold", cold), ("warm", warm)):
        curve = curves[label]
        best = max(value for _, value in curve)
        reached[label] = first_reaching(curve, target)
        tests = rd.read_test_metrics()
        rows.append(
            {
                "run": label,
                "steps": curve[-1][0],
                "valid at step 0": curve[0][1] if label == "warm" else None,
                "reaches cold best at": "not reached" if reached[label] is None else reached[label],
                f"best valid {key}": best,
                **{f"test {k}": tests[k] for k in test_keys if k in tests},
            }
        )
    cold_steps, warm_steps = reached["cold"], reached["warm"]
    ratio = warm_steps / cold_steps if warm_steps is not None and cold_steps else math.inf
    verdict = (
        f"steps to the cold run's best valid {key} ({target:.4f}): warm {warm_steps}, cold {cold_steps}, "
        f"ratio {ratio:.2f} ({'<=' if ratio <= 1 / 3 else '>'} 1/3); warm best valid "
        f"{'>=' if rows[1][f'best valid {key}'] >= target else '<'} cold's"
    )
    return rows, verdict


def markdown(rows: list[dict[str, Any]]) -> str:
    heads = list(rows[0])
    cell = lambda v: f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    return "\n".join(lines + ["| " + " | ".join(cell(r[h]) for h in heads) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], metavar="FILE", help="config files (data, model)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cut", choices=("time", "order"), required=True, help="how the earlier log is cut (see above)")
    ap.add_argument("--earlier", type=float, default=0.8, help="--cut time: the quantile of click times it ends at")
    ap.add_argument("--out", default="runs/warm_start", help="the folder of the three runs and the earlier log")
    args = ap.parse_args()

    split = "time" if args.cut == "time" else "user"
    later = load_config(args.config, [*args.overrides, f"data.split={split}"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cut == "time" and args.earlier >= later.data.time_cutoff_quantile:
        raise SystemExit(f"--earlier {args.earlier} must end before data.time_cutoff_quantile")
    ds = load_dataset(later)
    clicks = cut(ds, args.cut, args.earlier, later.data.eval_input_frac)
    log = out / "earlier.csv"
    clicks.to_csv(log, index=False)
    print(
        f"later log: {ds.num_users:,} users, {ds.num_items - 1:,} items, {len(ds.items):,} clicks; earlier log "
        f"({args.cut} cut): {clicks['user'].nunique():,} users, {clicks['item'].nunique():,} items, "
        f"{len(clicks):,} clicks -> {log}"
    )
    earlier_data = dataclasses.replace(
        later.data,
        source=str(log),
        format="csv",
        user_col="user",
        item_col="item",
        time_col="timestamp",
        category_col="category" if "category" in clicks else "",
        categories="",
    )
    earlier = run(dataclasses.replace(later, data=earlier_data), out, "earlier")
    cold = run(later, out, "cold")
    warm = run(later, out, "warm", init_from=str(earlier.path))
    rows, verdict = summary(earlier, cold, warm)
    print()
    print(markdown(rows))
    print(verdict)


if __name__ == "__main__":
    main()
