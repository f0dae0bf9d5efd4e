"""Why does sasrec_mi trail comirec_sa? Test one suspect: what the self-attentive head pools.

``sasrec_mi`` pools the encoder's outputs (``interests = Aᵀ E``, after the final LayerNorm),
while ``comirec_sa`` pools the item embeddings themselves (``Aᵀ H``), which live in the space
the retrieval index searches. This script trains ``sasrec_mi`` as shipped next to a variant
whose attention still reads the encoder (``A = softmax_L(tanh((E + P) W1) W2)``) but pools the
item embeddings (``interests = Aᵀ H``), with the same data, seed and budget, and prints both
test tables. The variant is patched in here (PyTorch ops, any device), not shipped.

Usage::

    python experiments/sasrec_mi_values.py --data amazon-beauty [--set train.max_steps=30000 ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor

from recsys.config import load_config
from recsys.evaluate.evaluator import format_table
from recsys.models.sasrec import SASRecMI
from recsys.nn.masking import length_mask, recency_index
from recsys.train.trainer import train

CONFIGS = Path(__file__).parent / "configs"


def encode_pooling_items(self: SASRecMI, h: Tensor, lengths: Tensor) -> Tensor:
    """``h [B, L, d]`` -> ``[B, K, d]``: attention from the encoder states, values = item embeddings."""
    e = self.encoder(h, lengths)
    head, seq_len = self.head, h.shape[1]
    if head.positions == "recent":
        index = recency_index(lengths, seq_len)[..., None].expand_as(h)
        e, h = e.gather(1, index), h.gather(1, index)
    x = e if head.pos is None else e + head.pos[:seq_len]
    scores = torch.tanh(x @ head.w1) @ head.w2  # [B, L, K]
    valid = length_mask(lengths, seq_len)[..., None]
    weights = torch.softmax(scores.float().masked_fill(~valid, -1e9), dim=1).to(h.dtype)
    return torch.einsum("blk,bld->bkd", weights * valid, h)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a dataset config name under experiments/configs/data/")
    ap.add_argument("--variant", choices=("encoded", "items", "both"), default="both")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--output-dir", default="runs/sasrec_mi_values")
    args = ap.parse_args()

    shipped = SASRecMI.encode
    table = {}
    for variant in (("encoded", "items") if args.variant == "both" else (args.variant,)):
        SASRecMI.encode = encode_pooling_items if variant == "items" else shipped
        cfg = load_config([CONFIGS / "data" / f"{args.data}.toml", CONFIGS / "models" / "sasrec_mi.toml"],
                          args.overrides + [f"output_dir={args.output_dir}", "model.backend=torch"])
        result = train(cfg, log=lambda line: print(f"  [{variant}] {line}", flush=True)
                       if line.startswith(("valid", "stopped", "early")) else None)
        table[f"sasrec_mi, pools {variant}"] = result.test_metrics
        print(f"{variant}: best step {result.best_step}/{result.steps}, {result.wall_s:.0f}s", flush=True)
    SASRecMI.encode = shipped
    print(format_table(table))


if __name__ == "__main__":
    main()
