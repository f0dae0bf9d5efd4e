"""Does the capsules' norm bound hold ComiRec-DR back? Train it as ComiRec wrote it and with a scale.

ComiRec-DR's interests are squashed capsules (norm < 1), so a training logit ``<z_k, e_i>`` can
never exceed ``|e_i|``; ComiRec-SA's interests are convex combinations of item embeddings and
its logits grow with the square of the embedding norms. This script trains ``comirec_dr`` as
shipped and a variant whose interests are multiplied by one learned scalar (initialised at 1,
trained with everything else), with the same data, seed and budget, and prints both test tables
and the largest training logit each reached (``max_output_logit`` in ``metrics.jsonl``). The
variant is a subclass registered by this script (``model.name = "comirec_dr_scaled"``); it is not
a model of the library.

Usage::

    python experiments/capsule_scale.py --data amazon-beauty [--variant both|shipped|scaled] [--set ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor, nn

from recsys.config import ModelConfig, load_config
from recsys.evaluate.evaluator import format_table
from recsys.models import register
from recsys.models.comirec_dr import ComiRecDR
from recsys.run import RunDir
from recsys.train.trainer import train

CONFIGS = Path(__file__).parent / "configs"
VARIANTS = {"shipped": "comirec_dr", "scaled": "comirec_dr_scaled"}


class ScaledComiRecDR(ComiRecDR):
    """ComiRec-DR whose interests (squashed capsules, norm < 1) are multiplied by one learned
    scalar ``scale``, initialised at 1 and trained with everything else."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scale = nn.Parameter(torch.ones(()))

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self.scale * self.routing(h, lengths)  # [B, K, d], norm < scale


@register(VARIANTS["scaled"])  # buildable while this script runs; its runs load only after importing it
def build_scaled(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> ScaledComiRecDR:
    return ScaledComiRecDR(num_items, cfg.dim, cfg.num_interests, max_len, cfg.routing_iters, cfg.positions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a dataset config name under experiments/configs/data/")
    ap.add_argument("--variant", choices=("shipped", "scaled", "both"), default="both")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--output-dir", default="runs/capsule_scale")
    args = ap.parse_args()

    table, notes = {}, []
    for variant in (("shipped", "scaled") if args.variant == "both" else (args.variant,)):
        cfg = load_config([CONFIGS / "data" / f"{args.data}.toml", CONFIGS / "models" / "comirec_dr.toml"],
                          args.overrides + [f"output_dir={args.output_dir}", f"model.name={VARIANTS[variant]}"])
        result = train(cfg, log=lambda line: print(f"  [{variant}] {line}", flush=True)
                       if line.startswith(("valid", "stopped", "early")) else None)
        rows = [r for r in RunDir(result.run_dir).read_metrics() if "max_output_logit" in r]
        max_logit = max(r["max_output_logit"] for r in rows)
        scale = RunDir(result.run_dir).load_best().get("scale")  # the variant's learned scalar
        table[f"comirec_dr, {variant}"] = result.test_metrics
        notes.append(f"{variant}: best step {result.best_step}/{result.steps}, largest training logit "
                     f"{max_logit:.1f}" + (f", learned scale {float(scale):.2f}" if scale is not None else ""))
    print(format_table(table))
    print("\n".join(notes))


if __name__ == "__main__":
    main()
