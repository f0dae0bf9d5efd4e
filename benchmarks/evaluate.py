"""Evaluator throughput: the batched ComiRec-protocol evaluator vs a plain per-user Python loop.

Synthetic case: ``--users`` users × ``--items`` items, d = 64, K = 4 interests,
top-N = 50 (metrics at 20 and 50). Items fall in categories with a centre each; a user's
interests sit near the centres of K categories and the truth clicks come mostly from those
categories, so the metrics are not all zero. The "model" looks each user's interests up in
a table (its input sequence holds the user's row + 1), so the timing covers exactly what the
evaluator adds around a model: index build, B×K search, merge, metrics.

The loop baseline does per user what a straightforward implementation does: score all
items with numpy, take each interest's top N, merge with a dict, and compute the metrics
with Python sets. It is timed on ``--loop-users`` users and extrapolated linearly (the work
per user is constant), and its metrics are checked against the evaluator's on those users.

    python benchmarks/evaluate.py                       # 100k users x 100k items
    python benchmarks/evaluate.py --users 20000 --items 20000 --loop-users 500
    python benchmarks/evaluate.py --users 200000 --items 1000000 --dim 128 --device cuda --backends torch
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import time

import numpy as np
import torch

from recsys.data.split import EvalSet
from recsys.evaluate import evaluate
from recsys.models.base import InterestModel


class TableInterests(InterestModel):
    """Interests read from a table: ``seq[:, 0] - 1`` is the user's row. ``[U, K, d]`` table."""

    def __init__(self, interests: np.ndarray, item_emb: np.ndarray) -> None:
        super().__init__()
        self.num_interests = interests.shape[1]
        self.register_buffer("table", torch.from_numpy(interests))
        self.register_buffer("items", torch.from_numpy(item_emb))

    def interests(self, seq: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.table[seq[:, 0] - 1]  # [B, K, d]

    def item_embeddings(self) -> torch.Tensor:
        return self.items


def make_case(num_users: int, num_items: int, dim: int, k: int, num_cats: int, seed: int):
    """Clustered item embeddings, users near K category centres, truth mostly from those."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((num_cats, dim)).astype(np.float32)
    item_cat = rng.integers(0, num_cats, size=num_items)
    item_cat[0] = 0
    item_emb = (centres[item_cat] + 0.8 * rng.standard_normal((num_items, dim))).astype(np.float32)
    user_cats = rng.integers(0, num_cats, size=(num_users, k))
    interests = (centres[user_cats] + 0.3 * rng.standard_normal((num_users, k, dim))).astype(np.float32)

    by_cat = np.argsort(item_cat[1:], kind="stable") + 1  # real items grouped by category
    cat_start = np.searchsorted(item_cat[by_cat], np.arange(num_cats + 1))
    lengths = rng.integers(1, 21, size=num_users)
    owner = np.repeat(np.arange(num_users), lengths)
    cat = user_cats[owner, rng.integers(0, k, size=len(owner))]
    size = np.maximum(cat_start[cat + 1] - cat_start[cat], 1)
    truth = by_cat[np.minimum(cat_start[cat] + rng.integers(0, 1 << 30, size=len(owner)) % size, num_items - 2)]
    noise = rng.random(len(owner)) < 0.3
    truth[noise] = rng.integers(1, num_items, size=int(noise.sum()))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    inputs = (np.arange(num_users, dtype=np.int64) + 1)[:, None]
    eval_set = EvalSet(np.arange(num_users), inputs, np.ones(num_users, dtype=np.int64), indptr, truth.astype(np.int64))
    return eval_set, interests, item_emb, item_cat


def loop_baseline(interests, item_emb, eval_set, item_cat, users, topn=(20, 50)):
    """Per user: numpy scores, top-N per interest, dict merge, set-based metrics."""
    n_max = max(topn)
    sums = {f"{m}@{n}": 0.0 for n in topn for m in ("recall", "ndcg", "hitrate", "diversity")}
    seen = {n: set() for n in topn}
    cats = item_cat.tolist()
    for u in users:
        scores = interests[u] @ item_emb.T  # [K, N]
        scores[:, 0] = -np.inf
        best: dict[int, float] = {}
        for row in scores:
            top = np.argpartition(-row, n_max)[:n_max]
            for i in top[np.argsort(-row[top])]:
                s = float(row[i])
                if s > best.get(int(i), -math.inf):
                    best[int(i)] = s
        ranked = [i for i, _ in sorted(best.items(), key=lambda kv: -kv[1])[:n_max]]
        truth = eval_set.truth_items[eval_set.truth_indptr[u] : eval_set.truth_indptr[u + 1]].tolist()
        truth_set = set(truth)
        for n in topn:
            recs = ranked[:n]
            rec_set = set(recs)
            hits = sum(1 for t in truth if t in rec_set)
            dcg = sum(1.0 / math.log2(r + 2) for r, i in enumerate(recs) if i in truth_set)
            idcg = sum(1.0 / math.log2(r + 2) for r in range(min(len(truth_set), n)))
            same = sum(cats[recs[a]] == cats[recs[b]] for a in range(n) for b in range(a + 1, n))
            sums[f"recall@{n}"] += hits / len(truth)
            sums[f"ndcg@{n}"] += dcg / idcg
            sums[f"hitrate@{n}"] += float(hits > 0)
            sums[f"diversity@{n}"] += 1.0 - same / (n * (n - 1) / 2)
            seen[n].update(recs)
    out = {key: value / len(users) for key, value in sums.items()}
    for n in topn:
        out[f"coverage@{n}"] = len(seen[n]) / (len(item_emb) - 1)
    return out


def subset(eval_set: EvalSet, num: int) -> EvalSet:
    end = eval_set.truth_indptr[num]
    return EvalSet(
        eval_set.users[:num],
        eval_set.inputs[:num],
        eval_set.lengths[:num],
        eval_set.truth_indptr[: num + 1],
        eval_set.truth_items[:end],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--interests", type=int, default=4)
    parser.add_argument("--categories", type=int, default=200)
    parser.add_argument("--loop-users", type=int, default=2000, help="users timed in the loop baseline")
    parser.add_argument(
        "--backends", default="auto", help="evaluator backends to time, comma-separated (auto | faiss | torch)"
    )
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the model and the torch search run (cpu | cuda)")
    args = parser.parse_args()

    print(
        f"# benchmarks/evaluate.py  {datetime.date.today()}  {platform.platform()}  "
        f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} torch={torch.__version__}"
    )
    print(f"# {args.users:,} users x {args.items:,} items, d={args.dim}, K={args.interests}, N=50 (metrics @20, @50)")
    t0 = time.perf_counter()
    eval_set, interests, item_emb, item_cat = make_case(
        args.users, args.items, args.dim, args.interests, args.categories, args.seed
    )
    print(f"# synthetic case built in {time.perf_counter() - t0:.1f}s; {len(eval_set.truth_items):,} truth clicks")
    model = TableInterests(interests, item_emb).to(args.device)

    rows = []
    loop_users = min(args.loop_users, args.users)
    t0, c0 = time.perf_counter(), time.process_time()
    loop_metrics = loop_baseline(interests, item_emb, eval_set, item_cat, range(loop_users))
    scale = args.users / loop_users
    loop_wall, loop_cpu = (time.perf_counter() - t0) * scale, (time.process_time() - c0) * scale
    rows.append((f"per-user Python loop ({loop_users:,} users timed, extrapolated)", loop_wall, loop_cpu, loop_metrics))

    small = subset(eval_set, loop_users)
    check = evaluate(model, small, topn=(20, 50), item_category=item_cat, backend="torch")
    worst = max(abs(check[key] - value) for key, value in loop_metrics.items())
    print(f"# loop vs evaluator on the first {loop_users:,} users: max |metric difference| = {worst:.2e}")
    if worst > 1e-3:  # float32 rounding may flip a rare near-tie at the cut; more is a bug
        raise SystemExit("the loop baseline and the evaluator disagree")

    for backend in [b for b in args.backends.split(",") if b]:
        t0, c0 = time.perf_counter(), time.process_time()
        got = evaluate(
            model, eval_set, topn=(20, 50), item_category=item_cat, backend=backend, batch_size=args.batch_size
        )
        rows.append(
            (
                f"recsys evaluate, backend={backend} (all {args.users:,} users)",
                time.perf_counter() - t0,
                time.process_time() - c0,
                got,
            )
        )

    print()
    print(
        "| method | wall s | users/s | speed-up (wall) | CPU s | speed-up (CPU) | recall@50 | ndcg@50 | diversity@50 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, wall, cpu, metrics in rows:
        print(
            f"| {name} | {wall:,.1f} | {args.users / wall:,.0f} | {loop_wall / wall:.1f}x | {cpu:,.1f} | "
            f"{loop_cpu / cpu:.1f}x | {metrics['recall@50']:.4f} | {metrics['ndcg@50']:.4f} | "
            f"{metrics['diversity@50']:.4f} |"
        )
    print(
        "\n(CPU s = process CPU time over all threads; loop metrics are over its timed users only, "
        "evaluator metrics over all users)"
    )


if __name__ == "__main__":
    main()
