"""Offline evaluation: the top-N metrics of every protocol and the batched evaluator."""

from recsys.evaluate.evaluator import evaluate, evaluate_with_config, format_table
from recsys.evaluate.metrics import (
    category_diversity,
    compute_metrics,
    coverage,
    hit_rate,
    mrr,
    ndcg,
    rank_hits,
    recall,
)

__all__ = [
    "category_diversity",
    "compute_metrics",
    "coverage",
    "evaluate",
    "evaluate_with_config",
    "format_table",
    "hit_rate",
    "mrr",
    "ndcg",
    "rank_hits",
    "recall",
]
