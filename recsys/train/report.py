"""The lines a run's log opens with, which ``recsys train --dry-run`` prints too: the data, the
model and its objective, the CPU threads and who validation scores."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from recsys.config import Config
from recsys.data.split import Split
from recsys.models import InterestModel, spec_for
from recsys.run import Experiment
from recsys.run.settings import Facts
from recsys.text import count
from recsys.train.meter import VALID_SHARE

if TYPE_CHECKING:
    from recsys.data import Dataset


def data_line(ds: Dataset, split: Split) -> str:
    """The data's size and the split's users; with item features, what they cover."""
    return (
        f"data: {count(ds.num_users, 'user')}, {count(ds.num_items - 1, 'item')}, {count(len(ds.items), 'click')}; "
        f"train users {len(split.train_users):,}, valid {len(split.valid.users):,}, test {len(split.test.users):,}"
        + (f"\nitem features: {ds.features.summary()}" if ds.features is not None else "")
    )


def model_line(cfg: Config, model: InterestModel) -> str:
    """The model, its size and its objective (``cfg`` resolved: the width and the softmax are the
    catalogue's, recsys.run.settings)."""
    m, t = cfg.model, cfg.train
    positions = f"every position ({t.windows} windows)" if t.predict_at == "all" else "the last position"
    clicks = f"its next {t.predict_next} clicks" if t.predict_next > 1 else "its next click"
    loss = "exact softmax" if t.full_softmax else f"sampled softmax, {t.num_negatives:,} negatives"
    if t.loss != "softmax":
        loss = f"{t.loss} loss, {t.num_negatives:,} negatives"
    blocks = ""
    if "mixer" in spec_for(m.name).settings and (m.mixer, m.block) != ("attention", "pre_norm"):
        causal = ", causal" if m.mixer != "attention" and m.filter_causal else ""
        blocks = f", {m.block} blocks mixing by {m.mixer}{causal}"
    return (
        f"model: {m.name}, K = {getattr(model, 'num_interests', 1)}, {m.dim} wide{blocks}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters"
        + (f"; {positions} predicts {clicks}; {loss}" if model.trainable else "")
    )


def threads_line(cfg: Config, facts: Facts) -> str:
    """How many threads torch trains with, beside what the automatic count reads (recsys.run.settings.cpu_threads)."""
    return (
        f"CPU threads: {cfg.train.cpu_threads} (train.cpu_threads; this process may run on {facts.cores} cores, "
        f"{facts.busy_cores:.1f} of them busy with other work, torch's default {facts.torch_threads})"
    )


def validation_line(cfg: Config, split: Split, sampled: int) -> str:
    """Who validation scores: ``sampled`` of the validation users (``eval.valid_users``)."""
    return (
        f"validation: {sampled:,} of the {len(split.valid):,} validation users (eval.valid_users)"
        + ("" if cfg.train.eval_every else f", at most {VALID_SHARE:.0%} of the wall time")
        + f"; the test scores all {len(split.test):,} test users"
    )


def opening_lines(exp: Experiment, device: torch.device, validated: int) -> list[str]:
    """The lines a run opens with: the data, the model, on the CPU its threads, and for a trained
    model who validation scores (``validated`` of the validation users)."""
    cfg, split, model = exp.cfg, exp.split, exp.model
    lines = [data_line(exp.dataset, split), model_line(cfg, model)]
    if device.type == "cpu":
        lines.append(threads_line(cfg, exp.facts))
    if model.trainable:
        lines.append(validation_line(cfg, split, validated))
    return lines
