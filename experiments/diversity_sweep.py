"""ComiRec's controllable diversity: recall@N vs category diversity@N over λ, as a table and a PNG.

For each run, the test users are evaluated with the greedy aggregation (score − λ · items
already picked in the same category, :func:`recsys.retrieval.aggregate.diverse_merge`) at
every λ, candidates being each interest's top N (ComiRec's protocol, exact Flat search).

Without ``--run`` it first trains quick ComiRec-SA runs (``--steps`` steps, CPU, torch
kernels) on the two shared datasets with categories: MovieLens-100K (first genre of each
movie) and the ComiRec Amazon-Books sample (ComiRec's item categories; with min counts 0,
since the default filters leave 23 users)::

    python experiments/diversity_sweep.py                       # trains both, ~5-10 min on 2 CPUs
    python experiments/diversity_sweep.py --run RUN --run RUN2 --lambdas 0 0.1 1

The plot (recall@N on y, diversity@N on x, one panel per run, λ written at the points) needs
matplotlib, the ``plot`` extra: ``pip install 'multi-interest-recsys[plot]'``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recsys.config import load_config  # noqa: E402
from recsys.evaluate.evaluator import evaluate  # noqa: E402
from recsys.run import RunDir, load_run  # noqa: E402

DATA = REPO.parent / "shared" / "data"
LAMBDAS = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
DATASETS = {
    "ml-100k": (["experiments/configs/data/ml-100k.toml"], []),
    "comirec-book-sample": (
        ["experiments/configs/data/comirec-book-sample.toml"],
        ["data.min_item_count=0", "data.min_user_count=0"],
    ),
}


def trained(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a trained run (config and best weights)."""
    try:
        RunDir(run_dir).require_trained()
    except FileNotFoundError:
        return False
    return True


def train_quick(name: str, steps: int, work: Path) -> Path:
    """A ComiRec-SA run on dataset ``name`` (see ``DATASETS``) with ``steps`` training steps."""
    from recsys.train.trainer import train

    configs, overrides = DATASETS[name]
    run_dir = work / f"comirec_sa-{name}-{steps}"
    if trained(run_dir):
        return run_dir
    cfg = load_config(
        [REPO / c for c in configs],
        overrides
        + [
            f"train.max_steps={steps}",
            f"train.eval_every={max(steps // 4, 1)}",
            "model.backend=torch",
            f"output_dir={work}",
            f"name={run_dir.name}",
        ],
    )
    cfg.data.source = str(REPO / cfg.data.source) if not Path(cfg.data.source).is_absolute() else cfg.data.source
    if cfg.data.categories:
        cfg.data.categories = str(REPO / cfg.data.categories)
    t0 = time.perf_counter()
    train(cfg, log=lambda line: None)
    print(f"trained {run_dir} in {time.perf_counter() - t0:.0f}s", flush=True)
    return run_dir


def sweep(run_dir: Path, lambdas: list[float], n: int) -> list[dict[str, float]]:
    """One row per λ: recall / ndcg / hitrate / diversity / coverage at ``n`` on the test users."""
    run = load_run(run_dir)
    if not (run.dataset.item_category != 0).any():
        raise SystemExit(f"{run_dir}: the dataset has no item categories; diversity is undefined")
    rows = []
    for lam in lambdas:
        m = evaluate(
            run.model,
            run.split.test,
            topn=(n,),
            item_category=run.dataset.item_category,
            diversity_lambda=lam,
            backend="faiss",
        )
        rows.append(
            {"lambda": lam, **{k.split("@")[0]: v for k, v in m.items() if k.endswith(f"@{n}")}, "users": m["users"]}
        )
    return rows


def plot(results: dict[str, list[dict[str, float]]], n: int, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("the plot needs matplotlib: pip install 'multi-interest-recsys[plot]'") from None
    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.2), squeeze=False)
    for ax, (name, rows) in zip(axes[0], results.items()):  # one panel per run: recall scales differ
        ax.plot([r["diversity"] for r in rows], [r["recall"] for r in rows], marker="o")
        for r in rows:
            ax.annotate(
                f"{r['lambda']:g}", (r["diversity"], r["recall"]), fontsize=7, textcoords="offset points", xytext=(3, 3)
            )
        ax.set_xlabel(f"diversity@{n} (pairs in different categories)")
        ax.set_ylabel(f"recall@{n}")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle("ComiRec-SA: controllable diversity, points labelled by λ", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", default=[], help="run directory (repeatable)")
    parser.add_argument("--steps", type=int, default=1000, help="training steps of the quick runs")
    parser.add_argument("--work", default="/tmp/recsys-sweep", help="where quick runs are trained")
    parser.add_argument("--lambdas", type=float, nargs="+", default=LAMBDAS)
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--png", default=str(REPO / "experiments" / "diversity_sweep.png"))
    args = parser.parse_args()

    if args.run:
        runs = {Path(r).name: Path(r) for r in args.run}
    else:
        if not DATA.is_dir():
            raise SystemExit(f"{DATA} is absent: pass --run RUN (a run on a dataset with categories)")
        runs = {name: train_quick(name, args.steps, Path(args.work)) for name in DATASETS}
    results = {}
    for name, run_dir in runs.items():
        t0 = time.perf_counter()
        results[name] = sweep(run_dir, args.lambdas, args.n)
        rows = results[name]
        print(f"\n{name} ({run_dir}; {int(rows[0]['users'])} test users; {time.perf_counter() - t0:.0f}s)")
        print(f"| λ | Recall@{args.n} | NDCG@{args.n} | HitRate@{args.n} | Diversity@{args.n} | Coverage@{args.n} |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['lambda']:g} | {r['recall']:.4f} | {r['ndcg']:.4f} | {r['hitrate']:.4f} | "
                f"{r['diversity']:.4f} | {r['coverage']:.4f} |"
            )
    plot(results, args.n, Path(args.png))
    print(f"\nplot written to {args.png}")


if __name__ == "__main__":
    main()
