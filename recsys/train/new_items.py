"""How items without clicks rank, chosen once a run has trained, on its validation users: their
boost (``model.cold_scale = -1``) and the share of each list kept for them
(``retrieval.new_item_share = -1``), both defaults.

An item without training clicks (a new item of the feature file, or one clicked only by evaluation
users) is retrieved by its features and the id row its attributes predict
(:mod:`recsys.items.features`); how it should rank against the clicked items is a question that
training cannot answer, since training never scores such an item. The validation users can: their
targets include such items at the rate the log has them. So after training, with the best weights,
the run's validation is scored at each value of a grid, first the scale (:data:`SCALES`), then, at
the chosen scale, the share (:data:`SHARES`; :mod:`recsys.retrieval.new_items`), and the run keeps
the **largest value whose validation objective is within** :data:`TOLERANCE` **of the best one**: new
items rank as high as they can at no measurable cost to recall on every target. What costs recall
is not taken (measured on Amazon Beauty with 10% of its items held out: docs/results.md, "New
items").

The trainer writes the chosen values into the run's ``config.json`` (``model.cold_scale``,
``retrieval.new_item_share``), where everything that loads the run reads them; a run without such
items, or without features, keeps 1 and 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from recsys.config import CHOOSE_COLD_SCALE, CHOOSE_NEW_ITEM_SHARE, Config
from recsys.data import EvalSet
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.items import ItemTable, find_item_table
from recsys.models.base import InterestModel

__all__ = ["SCALES", "SHARES", "TOLERANCE", "choose_for_new_items"]

SCALES = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0)  # the boosts tried, in order
SHARES = (0.0, 0.02, 0.05, 0.1, 0.2)  # the shares tried, in order: 0, 1, 2, 5 and 10 of a top 50
TOLERANCE = 0.005  # a value within this share of the best validation objective costs nothing measurable
GIVE_UP = 0.05  # past the best, a value this far below it ends the search (larger ones only cost more)


def choose_for_new_items(
    model: InterestModel,
    valid: EvalSet,
    cfg: Config,
    item_category: np.ndarray | None,
    log: Callable[[str], None],
) -> Config | None:
    """Choose the scale and the share (module docstring) that ``cfg`` leaves to the run: the scale
    is set on ``model``'s item table, and the returned copy of ``cfg`` holds both
    (``model.cold_scale``, ``retrieval.new_item_share``) for the caller to use and save. None where
    there is nothing to choose: neither is -1, the model has no feature table, or every item has
    clicks. Every rank calls it (the validation users are shared)."""
    found = find_item_table(model)
    table = found[0] if found is not None and found[0].features is not None else None
    scale, share = cfg.model.cold_scale, cfg.retrieval.new_item_share
    if scale != CHOOSE_COLD_SCALE and share != CHOOSE_NEW_ITEM_SHARE:
        return None
    if table is None or table.warm is None or bool(table.warm[1:].all()):
        return None
    cold = ~table.warm.cpu().numpy()
    cold[0] = False
    if not cold[valid.truth_items].any():
        log("model.cold_scale: 1, retrieval.new_item_share: 0 (no validation target is an item without clicks)")
        return _chosen(table, cfg, 1.0 if scale == CHOOSE_COLD_SCALE else scale, 0.0 if share < 0 else share)
    if scale == CHOOSE_COLD_SCALE:
        scales = _largest(SCALES, lambda s: _scored(model, valid, cfg, item_category, table, s, 0.0))
        scale = _said("model.cold_scale", scales, cfg, log)
    if share == CHOOSE_NEW_ITEM_SHARE:
        shares = _largest(SHARES, lambda s: _scored(model, valid, cfg, item_category, table, scale, s))
        share = _said("retrieval.new_item_share", shares, cfg, log)
    return _chosen(table, cfg, scale, share)


def _scored(
    model: InterestModel,
    valid: EvalSet,
    cfg: Config,
    item_category: np.ndarray | None,
    table: ItemTable,
    scale: float,
    share: float,
) -> float:
    """The validation objective, items without clicks scaled by ``scale``, ``share`` of each list kept for them."""
    table.cold_scale = scale
    trial = dataclasses.replace(cfg, retrieval=dataclasses.replace(cfg.retrieval, new_item_share=share))
    return evaluate_with_config(model, valid, trial, item_category=item_category, across_ranks=True)[cfg.eval.objective]


def _largest(grid: Sequence[float], score: Callable[[float], float]) -> tuple[float, dict[float, float]]:
    """The largest value of ``grid`` whose score is within :data:`TOLERANCE` of the best, and every
    score taken (the search stops once one is :data:`GIVE_UP` below the best)."""
    scores: dict[float, float] = {}
    for value in grid:
        scores[value] = score(value)
        best = max(scores.values())
        if scores[value] < best * (1.0 - GIVE_UP):
            break
    return max(v for v, s in scores.items() if s >= best * (1.0 - TOLERANCE)), scores


def _said(name: str, chosen: tuple[float, dict[float, float]], cfg: Config, log: Callable[[str], None]) -> float:
    """The chosen value of ``name``, logged with every score tried."""
    value, scores = chosen
    tried = ", ".join(f"{v:g}: {s:.4f}" for v, s in scores.items())
    log(f"{name}: {value:g}, the largest within {TOLERANCE:.1%} of the best validation {cfg.eval.objective} ({tried})")
    return value


def _chosen(table: ItemTable, cfg: Config, scale: float, share: float) -> Config:
    """``cfg`` with both values, the scale set on ``table`` too."""
    table.cold_scale = scale
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, cold_scale=scale),
        retrieval=dataclasses.replace(cfg.retrieval, new_item_share=share),
    )
