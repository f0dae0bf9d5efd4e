"""Constructed logs whose timestamps tie, for checking the automatic horizon on data it was not chosen on.

The automatic ``train.predict_next`` (five clicks where at least a quarter of consecutive clicks
tie in time, else one) was chosen on MovieLens 100K, Amazon Beauty and taobao. Real tied logs
leave the order of a burst of clicks open; these files do the same to the built-in generator's
clicks: each time is cut to its day and each user's clicks of one day are shuffled (35–37%
of consecutive clicks tie). Two shapes: the built-in synthetic data and the long-history log
(``experiments/configs/data/long-history.toml``). The data configs ``tied-synthetic`` and
``tied-long-history`` read the files this writes::

    python experiments/tied_logs.py
    python experiments/collapse_study.py --data tied-synthetic --variant rule --variant h1 train.predict_next=1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.config import load_config
from recsys.data import load_dataset
from recsys.data.synthetic import generate

DAY = 86_400
SHAPES = {"tied-synthetic": "synthetic", "tied-long-history": "long-history"}


def tied(clicks: pd.DataFrame, seed: int) -> pd.DataFrame:
    """``clicks`` ([n] rows of user, item, time in seconds) as ``user, item, timestamp`` with each
    time cut to its day and each (user, day)'s clicks in a random order."""
    day = (clicks["time"] // DAY * DAY).astype("int64")
    out = pd.DataFrame({"user": clicks["user"].astype(str), "item": clicks["item"].astype(str), "timestamp": day})
    out["shuffle"] = np.random.default_rng(seed).random(len(out))
    return out.sort_values(["user", "timestamp", "shuffle"]).drop(columns="shuffle")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/tied", help="the folder the data configs read")
    ap.add_argument("--seed", type=int, default=7, help="the shuffle's seed")
    args = ap.parse_args()
    here = Path(__file__).parent / "configs" / "data"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name, shape in SHAPES.items():
        cfg = load_config(here / f"{shape}.toml")
        log = tied(generate(cfg.synthetic), args.seed)
        path = Path(args.out) / f"{name}.csv"
        log.to_csv(path, index=False)
        read = load_config(None, [f"data.source={path}", "data.format=csv", "data.time_col=timestamp"])
        share = load_dataset(read).tied_share()  # as the automatic horizon reads it
        print(f"{path}: {len(log):,} clicks, {share:.0%} of consecutive clicks tied")


if __name__ == "__main__":
    main()
