"""From a pandas DataFrame of clicks to recommendations with the Python API, top to bottom.

Builds a small click table (the synthetic generator's, as plain ``user, item, time`` columns:
any DataFrame of yours works the same), trains ComiRec-SA on it, evaluates it, recommends for
known users and for a new click sequence, gets the interest vectors and the item table, saves
an HNSW index and exports the network to ONNX (when ``multi-interest-recsys[export]`` is installed)::

    python experiments/python_api_example.py [--steps 300] [--out /tmp/recsys-api-example]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import recsys
from recsys.data import generate


def example_clicks() -> pd.DataFrame:
    """A click table: one row per click, columns user, item, time (any sortable number)."""
    cfg = recsys.load_config(None, ["synthetic.num_users=2000", "synthetic.num_items=500"])
    df = generate(cfg.synthetic)
    return pd.DataFrame({"user": df["user"].astype(str), "item": "i" + df["item"].astype(str), "time": df["time"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps (train.max_steps)")
    parser.add_argument("--out", default="/tmp/recsys-api-example", help="where the run directory goes")
    args = parser.parse_args()

    clicks = example_clicks()
    print(clicks.head(3), f"\n{len(clicks):,} clicks\n")

    run = recsys.fit(
        clicks,
        overrides={
            "model.name": "comirec_sa",
            "model.num_interests": 4,
            "train.max_steps": args.steps,
            "train.eval_every": max(args.steps // 3, 1),
            "output_dir": args.out,
        },
        log=None,
    )
    print(run)
    print("test metrics:", {k: round(v, 4) for k, v in run.evaluate().items() if k.endswith("@50")})

    users = list(run.dataset.user_raw[:2])
    print(run.recommend(users=users, n=5))  # user, rank, item, score, interest (raw ids)
    print(run.recommend(sequences=[["i3", "i17", "i42"]], n=5))  # a visitor's clicks, oldest first

    interests = run.interests([["i3", "i17", "i42"]])  # [1, K, d]
    item_ids, item_emb = run.item_embeddings()  # [N] raw ids, [N, d]
    scores = (interests[0] @ item_emb.T).max(axis=0)  # each item scored by its best interest
    top = run.recommend(sequences=[["i3", "i17", "i42"]], n=1, exclude_seen=False)["item"].iloc[0]
    print(
        f"interests {interests.shape}, items {item_emb.shape}; best item by hand {item_ids[scores.argmax()]}, "
        f"by recommend(exclude_seen=False) {top}"
    )

    report = run.index("HNSW32,Flat")  # saved in the run directory; recommend() now uses it
    print(f"HNSW recall@50 vs exact: {report.recall:.3f}")
    try:
        print("ONNX export in", run.export(Path(args.out) / "export-onnx", format="onnx"))
    except ImportError as err:
        print(f"skipped the ONNX export: {err}")


if __name__ == "__main__":
    main()
