"""Make a run directory with UNTRAINED (random-init) weights, for serving and index benchmarks.

The run is complete in form (config, dataset, best weights), so ``recsys index | recommend |
serve`` accept it, but its model has never seen a click: its recommendations are meaningless
and only its sizes (items, K, d, max_len) and speed are real. Its best weights carry
``"untrained": True`` to say so.

Item embeddings are planted around one random centre per synthetic category (``--spread``
times the centre's scale as noise), the geometry a trained model's table has (items of one
topic close together), so ANN indexes reach the recall they would on a trained run; on
i.i.d. random vectors (``--spread 0``) no index beats exact search by much at useful recall.

Default: the synthetic generator with 100,000 items (half the clicks uniform, so nearly every
item is clicked and survives filtering), ComiRec-SA with K = 4, d = 64::

    python benchmarks/make_random_run.py --out /tmp/random-100k
    python benchmarks/make_random_run.py --out /tmp/r --set synthetic.num_items=20000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from recsys.config import Config, load_config
from recsys.run import RunDir, build_experiment

DEFAULTS = [
    "synthetic.num_items=100000",
    "synthetic.num_users=50000",
    "synthetic.noise=0.5",
    "synthetic.num_categories=200",
    "data.min_item_count=1",
    "data.min_user_count=1",
    "data.max_len=50",
    "model.num_interests=4",
    "model.dim=64",
    "model.backend=torch",
]


def plant_clusters(table: torch.Tensor, item_category: np.ndarray, spread: float, seed: int) -> None:
    """Overwrite ``table [N, d]`` in place: row i = centre of its category + ``spread`` x noise.

    Centres and noise are N(0, 1/d) per coordinate (the model's own initialisation scale); the
    padding row 0 is left alone. ``spread = 0`` keeps the i.i.d. random initialisation.
    """
    if spread <= 0:
        return
    g = torch.Generator().manual_seed(seed)
    num_items, dim = table.shape
    cats = torch.from_numpy(item_category.astype(np.int64))
    centres = torch.randn(int(cats.max()) + 1, dim, generator=g) / dim**0.5
    noise = torch.randn(num_items, dim, generator=g) / dim**0.5
    with torch.no_grad():
        table[1:] = (centres[cats] + spread * noise)[1:] / (1 + spread**2) ** 0.5


def make_random_run(out: str | Path, overrides: list[str] | None = None, seed: int = 0, spread: float = 0.5) -> Path:
    """Write a run directory at ``out`` whose best weights are untrained (item
    embeddings clustered by category with noise ``spread``, see :func:`plant_clusters`)."""
    cfg: Config = load_config(None, DEFAULTS + list(overrides or []))
    torch.manual_seed(seed)
    exp = build_experiment(cfg)
    plant_clusters(exp.model.item_embeddings(), exp.dataset.item_category, spread, seed)
    rd = RunDir.create(out)
    rd.save_config(cfg)
    rd.save_dataset(exp.dataset)
    rd.save_best(exp.model.state_dict(), step=0, untrained=True)
    return rd.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="run directory to create")
    parser.add_argument(
        "--spread", type=float, default=0.5, help="noise around each category's centre (0: i.i.d. random embeddings)"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    t0 = time.perf_counter()
    path = make_random_run(args.out, args.overrides, spread=args.spread)
    print(f"untrained run written to {path} in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
