"""How much to boost items without clicks (``model.cold_scale = -1``, the default): chosen once a run
has trained, on its validation users.

An item without training clicks (a new item of the feature file, or one clicked only by evaluation
users) is retrieved by its features and the id row its attributes predict
(:mod:`recsys.items.features`); how it should rank against the clicked items is a question of scale
that training cannot answer, since training never scores such an item. The validation users can:
their targets include such items at the rate the log has them. So after training, with the best
weights, the run's validation is scored at each scale of :data:`GRID`, and the run keeps the
**largest scale whose validation objective is within** :data:`TOLERANCE` **of the best one**: new
items rank as high as they can at no measurable cost to recall on every target. A boost that costs
recall is not taken (measured on Amazon Beauty with 10% of its items held out: docs/results.md,
"New items").

The trainer writes the chosen value into the run's ``config.json`` (``model.cold_scale``), where
everything that loads the run reads it; a run without such items, or without features, keeps 1.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from recsys.config import CHOOSE_COLD_SCALE, Config
from recsys.data import EvalSet
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.items import find_item_table
from recsys.models.base import InterestModel

__all__ = ["GRID", "TOLERANCE", "choose_cold_scale"]

GRID = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0)  # the scales tried, in order
TOLERANCE = 0.005  # a scale within this share of the best validation objective costs nothing measurable
GIVE_UP = 0.05  # past the best, a scale this far below it ends the search (larger ones only cost more)


def choose_cold_scale(
    model: InterestModel,
    valid: EvalSet,
    cfg: Config,
    item_category: np.ndarray | None,
    log: Callable[[str], None],
) -> float | None:
    """The scale for ``model``'s items without clicks (module docstring), set on its item table, or
    None where there is nothing to choose: ``model.cold_scale`` was given, the model has no feature
    table, or every item has clicks. Every rank calls it (the validation users are shared)."""
    found = find_item_table(model)
    table = found[0] if found is not None and found[0].features is not None else None
    if cfg.model.cold_scale != CHOOSE_COLD_SCALE or table is None or table.warm is None or bool(table.warm[1:].all()):
        return None
    cold = ~table.warm.cpu().numpy()
    cold[0] = False
    if not cold[valid.truth_items].any():
        table.cold_scale = 1.0
        log("model.cold_scale: 1 (no validation target is an item without clicks: nothing to choose on)")
        return 1.0
    key = cfg.eval.objective
    scores: dict[float, float] = {}
    for scale in GRID:
        table.cold_scale = scale
        scores[scale] = evaluate_with_config(model, valid, cfg, item_category=item_category, across_ranks=True)[key]
        best = max(scores.values())
        if scores[scale] < best * (1.0 - GIVE_UP):
            break
    chosen = max(s for s, v in scores.items() if v >= best * (1.0 - TOLERANCE))
    table.cold_scale = chosen
    tried = ", ".join(f"{s:g}: {v:.4f}" for s, v in scores.items())
    log(
        f"model.cold_scale: {chosen:g}, the largest boost for items without clicks within {TOLERANCE:.1%} of the "
        f"best validation {key} ({tried})"
    )
    return chosen
