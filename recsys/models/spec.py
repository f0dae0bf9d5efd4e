"""What a model is, declared in one place: :class:`ModelSpec`, its typed automatic values
(:class:`Automatic`), and the registry of specs.

Every model module registers one spec: how to build the model, which ``[model]`` settings it
reads, what it can do (multi-interest, self-attentive scores, dense training, needs item
counts), what its automatic settings become and its tuning space. The trainer, the plan,
``recsys tune`` and model building ask the spec instead of comparing model names, so adding a
model touches its own file only::

    register(ModelSpec(name="my_model", build=build_my_model, dense=True, automatic=Automatic(dropout=0.2)))

``recsys.config`` is the schema (types, ranges); :func:`recsys.run.settings.resolve` applies a
spec's :class:`Automatic` values and the data-driven rules below (the constants) once, when an
experiment is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from recsys.config import ConfigError, ModelConfig

# switches a model must read to accept a changed value: each changes what a model computes, so one
# set on a model that ignores it is a mistake. Sizes (num_interests, num_layers, hidden, dropout, ...)
# may be carried by a config that several models share, and are ignored where they do not apply.
STRICT_SETTINGS = (
    "qk_norm",
    "softcap",
    "head_values",
    "score_cap",
    "mixer",
    "block",
    "attention_dropout",
    "init",
)
# from this many items (padding not counted) a spec's large-catalogue values (Automatic.large_dim,
# Automatic.large_dropout) replace its dim and dropout: at
# 128 wide the self-attentive multi-interest models gained 3-10% on Amazon Beauty (12k items) and
# taobao (38k) but about 1% on MovieLens 100K (1.3k) and the synthetic data (4k), at 1.7x the CPU time
# (docs/defaults.md, "Width and dropout of the multi-interest models")
LARGE_CATALOGUE = 10_000
# a spec whose automatic softmax is exact (Automatic.full_softmax) samples from this many items
# on: the exact softmax's work grows with the catalogue, the sampled one's does not. It gained
# 1.5-3% over sampling for sasrec on MovieLens 100K, Amazon Beauty and taobao. On the fused kernel
# (recsys.kernels.catalogue_logsumexp; CUDA under autocast) it trained as fast as sampling on taobao
# (38k items) and Amazon Beauty (12k), and the kernel's time is flat up to 100k items and triples
# by 400k; on the chunked torch loop (the CPU) it halved the steps per second at 4k items and cost
# 4.8x at 12k (docs/defaults.md, "sasrec's dropout and softmax" and "Dense throughput")
FUSED_EXACT_SOFTMAX_ITEMS = 100_000
EXACT_SOFTMAX_ITEMS = 10_000
# a spec's Automatic.predict_next above 1 holds where at least this share of a user's consecutive clicks share
# a timestamp (Dataset.tied_share): their order is not in the data, so "the next click" is the file's
# row order, and predicting each of the next few gained 2-6% for the multi-interest models on MovieLens
# 100K (51% tied) and Amazon Beauty (44%); on taobao (row order, no ties) it lost 21-25%. The cut lies
# between those measurements; it was not tuned (docs/defaults.md, "Predicting the next m clicks")
TIED_ORDER = 0.25
# train.item_updates "auto" updates only the item rows a step touches from this many items on, where
# the step samples its negatives (the exact softmax reads every row): on the GPU measured, the dense step's time
# grows 3.4 ns a row and the sparse one's stays at 1.3 ms, crossing near 190k items; below that the
# whole-table update is faster and exact (docs/notes/results-history.md, "Training at a million items")
SPARSE_ITEMS = 200_000

# shared blocks of tuning space (the [tune] table's format), composed by the specs
MULTI_INTEREST_SPACE: dict[str, Any] = {
    "model.num_interests": [1, 2, 4, 8],
    "train.soft_readout_steps": [0, 1000, 5000],
    "train.negative_readout": ["readout", "max"],
    # the next click or the next 5: the automatic value picks by the timestamps (TIED_ORDER), a
    # rule from three logs (docs/defaults.md, "Predicting the next m clicks") that a search can check
    "train.predict_next": [1, 5],
}
# the defaults against collapse of comirec_sa and sasrec_mi, around their automatic values: the score cap
# (1 to 2.3 as the history grows to 100 clicks; 0, no cap, lets a head collapse onto one click) and the
# cosine hinge between interests, its weights as measured (0.2 to 1 by length; 0: none) and its margins (0.7
# the default, 0.5 the earlier one, 0.8 tried) (docs/defaults.md, "Interests that stay distinct"). recsys
# tune sets the hinge only in a trial with K > 1 interests (recsys.tune.BETWEEN_INTERESTS). The attention
# regulariser is not searched: it spreads each head against the length cap, and lost both times it was tried
# beside the cap and the hinge on MovieLens 100K (0.2806 against 0.2933, 0.2746 against 0.2964)
SELF_ATTENTIVE_SPACE: dict[str, Any] = {
    "model.score_cap": {"low": 0.5, "high": 2.5},
    "train.interest_reg": [0.0, 0.2, 0.5, 1.0],
    "train.interest_margin": [0.5, 0.7, 0.8],
}
DROPOUT_SPACE: dict[str, Any] = {"model.dropout": {"low": 0.0, "high": 0.5}}

Builder = Callable[[ModelConfig, int, int, "Tensor | None"], Any]
HIDDEN_RATIO = 4  # the automatic model.hidden is HIDDEN_RATIO * model.dim (ComiRec's tanh projection)


@dataclass(frozen=True)
class Automatic:
    """What a model's automatic settings become (:data:`recsys.config.AUTOMATIC`), declared in the
    model's own file; :func:`recsys.run.settings.resolve` applies them with the data's facts.

    Attributes:
        dim: ``model.dim``.
        large_dim: ``model.dim`` from :data:`LARGE_CATALOGUE` items on (None: ``dim``).
        dropout: ``model.dropout`` (of the transformer encoders).
        large_dropout: ``model.dropout`` from :data:`LARGE_CATALOGUE` items on (None: ``dropout``).
        score_cap: ``model.score_cap``; with ``follows_length`` the least cap.
        follows_length: the score cap and the cosine hinge grow with the training histories'
            typical length ``L``: the cap to ``max(score_cap, ln(L) / 2)``, the hinge's weight to
            ``interest_reg`` times ``L / 50`` within [0.2, 1] (:func:`recsys.run.settings.length_score_cap`,
            :func:`recsys.run.settings.length_interest_reg`).
        predict_at: ``train.predict_at``.
        predict_next: ``train.predict_next`` on data whose order is open (at least :data:`TIED_ORDER` of
            consecutive clicks tied); 1 elsewhere.
        full_softmax: ``train.full_softmax``: exact below :data:`FUSED_EXACT_SOFTMAX_ITEMS` items where
            the exact softmax runs on its fused kernel, below :data:`EXACT_SOFTMAX_ITEMS` elsewhere, and
            never with ``train.hard_negatives``.
        negative_readout: ``train.negative_readout``.
        attention_reg: ``train.attention_reg`` with ``K > 1`` and last-position training (0 otherwise).
        interest_reg: ``train.interest_reg`` with ``K > 1`` (0 otherwise); with ``follows_length``
            its weight at 50-click histories.
        soft_readout_steps: ``train.soft_readout_steps``.
        epoch_decay: the AdamW shrinkage per pass over the data that the automatic
            ``train.weight_decay`` gives (:func:`recsys.run.settings.resolve`).
        batch: ``train.batch_size`` a process while an epoch at it stays short
            (:func:`recsys.run.settings.scaled_batch`).
        lr: ``train.lr``.
        draw: ``train.draw`` (how last-position training draws its samples).
        min_target: ``train.min_target``.
        num_heads, mixer, block, filter_alpha, attention_dropout, init: the transformer family's
            ``model.*`` block settings (read by the models that list them in ``settings``; the
            others resolve to these neutral values).
    """

    dim: int = 64
    large_dim: int | None = None
    dropout: float = 0.1
    large_dropout: float | None = None
    score_cap: float = 0.0
    follows_length: bool = False
    predict_at: str = "last"
    predict_next: int = 1
    full_softmax: bool = False
    negative_readout: str = "readout"
    attention_reg: float = 0.0
    interest_reg: float = 0.0
    soft_readout_steps: int = 0
    epoch_decay: float = 0.15
    batch: int = 128
    lr: float = 1e-3
    draw: str = "users"
    min_target: int = 4
    num_heads: int = 2
    mixer: str = "attention"
    block: str = "pre_norm"
    filter_alpha: float = 0.7
    attention_dropout: float = 0.0
    init: str = "scaled"


# the self-attentive multi-interest models' shared defaults against collapse (comirec_sa, sasrec_mi), which
# each model's file extends with dataclasses.replace: max-scored negatives (docs/defaults.md, "Dense
# training"), the soft readout (docs/multi-interest.md), a score cap that grows
# with the histories and the cosine hinge between interests (docs/defaults.md, "Interests that stay
# distinct"), the next 5 clicks where the data leaves their order open (TIED_ORDER), and 128 wide on a
# large catalogue, where 64 crowds the K interests' one space (docs/models.md)
SELF_ATTENTIVE_MULTI_INTEREST = Automatic(
    score_cap=1.0,
    follows_length=True,
    interest_reg=1.0,
    soft_readout_steps=1000,
    negative_readout="max",
    predict_next=5,
    large_dim=128,
)


@dataclass(frozen=True)
class ModelSpec:
    """One model, as the rest of the library sees it.

    Attributes:
        name: ``model.name``.
        build: ``build(cfg: ModelConfig, num_items, max_len, item_counts [num_items] or None)``
            -> an :class:`~recsys.models.base.InterestModel` (``cfg`` already resolved).
        settings: the ``[model]`` fields it reads beyond ``name``, ``dim`` and ``backend``; a
            switch of :data:`STRICT_SETTINGS` it does not read must keep its default (a changed
            one is an error naming it, since it would silently do nothing).
        multi_interest: reads ``model.num_interests`` as its ``K`` (the readout and the
            multi-interest training switches apply).
        self_attentive: its interests read the clicks through differentiable attention scores
            (``train.attention_reg`` applies; ``interests_with_attention`` returns them).
        dense: can train with ``train.predict_at = "all"`` (implements ``prefix_interests``).
        state_interest: interest 0 is the encoder's next-click state: training reads it out against
            every target by itself (as a single-interest model), and ComiRec's readout picks among
            the other ``K - 1`` (:func:`recsys.train.losses.readouts`).
        needs_item_counts: ``build`` needs the training click counts.
        trainable: has parameters to learn (MostPopular has none).
        automatic: what its automatic settings become (:class:`Automatic`).
        tune_space: search space added to the shared one by ``recsys tune`` (``[tune]`` format).
        saved_defaults: for runs saved before a key existed: ``{missing key: {key: value}}``, the
            values that were in force for this model then (:mod:`recsys.run.saved_config`).
    """

    name: str
    build: Builder
    settings: tuple[str, ...] = ()
    multi_interest: bool = False
    self_attentive: bool = False
    dense: bool = False
    state_interest: bool = False
    needs_item_counts: bool = False
    trainable: bool = True
    automatic: Automatic = Automatic()
    tune_space: Mapping[str, Any] = field(default_factory=dict)
    saved_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


_SPECS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Make ``spec`` buildable as ``model.name = spec.name``; returns it."""
    if spec.name in _SPECS:
        raise ValueError(f"model {spec.name!r} registered twice")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(spec.settings) - known)
    if unknown:
        raise ValueError(f"model {spec.name!r}: settings {unknown} are not [model] fields")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registered model, so that a notebook or a test can register its own again."""
    _SPECS.pop(name, None)


def model_names() -> list[str]:
    """Every registered ``model.name``, sorted (the built-in ones are registered by the time this
    module can be imported: importing it runs ``recsys.models`` first)."""
    return sorted(_SPECS)


def spec_for(name: str) -> ModelSpec:
    """The spec of ``model.name = name``; unknown names are a :class:`ConfigError` listing the known ones."""
    if name not in _SPECS:
        raise ConfigError(f"model.name: unknown model {name!r}; known: {', '.join(model_names())}")
    return _SPECS[name]


def specs() -> list[ModelSpec]:
    """Every registered spec, by name."""
    return [_SPECS[name] for name in model_names()]
