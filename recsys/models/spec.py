"""What a model is, declared in one place: :class:`ModelSpec`, the registry of specs, and the
model-aware half of configuration (automatic values, settings that do not apply).

Every model module registers one spec: how to build the model, which ``[model]`` settings it
reads, what it can do (multi-interest, self-attentive scores, dense training, needs item
counts), its automatic defaults and its tuning space. The trainer, the plan, ``recsys tune`` and
model building ask the spec instead of comparing model names, so adding a model touches its own
file only::

    register(ModelSpec(name="my_model", build=build_my_model, settings=("num_layers",), dense=True))

``recsys.config`` is the schema (types, ranges); :func:`resolve` adds what depends on the model.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from recsys.config import AUTO, Config, ConfigError, ModelConfig, check_heads, excludes_history, objective

# switches a model must read to accept a changed value: each changes what a model computes, so one
# set on a model that ignores it is a mistake. Sizes (num_interests, num_layers, hidden, dropout, ...)
# may be carried by a config that several models share, and are ignored where they do not apply.
STRICT_SETTINGS = ("qk_norm", "softcap", "head_values", "score_cap")
DEFAULT_EPOCH_DECAY = 0.15  # AdamW shrinkage per pass over the data (recsys.train.plan), unless a spec says otherwise
DEFAULT_DROPOUT = 0.1  # model.dropout of the transformer encoders, unless a spec says otherwise
DEFAULT_DIM = 64  # model.dim, unless a spec says otherwise
# from this many items (padding not counted) a spec's large_catalogue values replace its defaults: at
# 128 wide the self-attentive multi-interest models gained 3-10% on Amazon Beauty (12k items) and
# taobao (38k) but about 1% on MovieLens 100K (1.3k) and the synthetic data (4k), at 1.7x the CPU time
# (docs/results.md, "Width and dropout of the multi-interest models")
LARGE_CATALOGUE = 10_000
# a spec whose automatic softmax is exact ("train.full_softmax": True) samples from this many items
# on: the exact softmax's work grows with the catalogue, the sampled one's does not. It gained
# 1.5-3% over sampling for sasrec on MovieLens 100K, Amazon Beauty and taobao. On the fused kernel
# (recsys.kernels.catalogue_logsumexp; CUDA under autocast) it trained as fast as sampling on taobao
# (38k items) and Amazon Beauty (12k), and the kernel's time is flat up to 100k items and triples
# by 400k; on the chunked torch loop (the CPU) it halved the steps per second at 4k items and cost
# 4.8x at 12k (docs/results.md, "sasrec's dropout and softmax" and "Dense throughput")
FUSED_EXACT_SOFTMAX_ITEMS = 100_000
EXACT_SOFTMAX_ITEMS = 10_000
# a spec's "train.horizon" above 1 holds where at least this share of a user's consecutive clicks share
# a timestamp (Dataset.tied_share): their order is not in the data, so "the next click" is the file's
# row order, and predicting each of the next few gained 2-6% for the multi-interest models on MovieLens
# 100K (51% tied) and Amazon Beauty (44%); on taobao (row order, no ties) it lost 21-25%. The cut lies
# between those measurements; it was not tuned (docs/results.md, "Predicting the next m clicks")
TIED_ORDER = 0.25
# train.item_updates "auto" updates only the item rows a step touches from this many items on, where
# the step samples its negatives (the exact softmax reads every row): on the GPU measured, the dense step's time
# grows 3.4 ns a row and the sparse one's stays at 1.3 ms, crossing near 190k items; below that the
# whole-table update is faster and exact (docs/results.md, "Training at a million items")
SPARSE_ITEMS = 200_000

# shared blocks of tuning space (the [tune] table's format), composed by the specs
MULTI_INTEREST_SPACE: dict[str, Any] = {
    "model.num_interests": [1, 2, 4, 8],
    "train.soft_readout_steps": [0, 1000, 5000],
    "train.negative_scores": ["readout", "max"],
    # the next click or the next 5: the automatic value picks by the timestamps (automatic_horizon), a
    # rule from three logs (docs/results.md, "Predicting the next m clicks") that a search can check
    "train.horizon": [1, 5],
}
SELF_ATTENTIVE_SPACE: dict[str, Any] = {
    "model.score_cap": [0.5, 1.0, 2.0],  # 0 (no cap) lets a head collapse onto one click
    "train.attention_reg": [0.0, 0.3, 1.0],
}
DROPOUT_SPACE: dict[str, Any] = {"model.dropout": {"low": 0.0, "high": 0.5}}

Builder = Callable[[ModelConfig, int, int, "Tensor | None"], Any]


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
        dense: can train with ``train.targets = "all"`` (implements ``prefix_interests``).
        needs_item_counts: ``build`` needs the training click counts.
        trainable: has parameters to learn (MostPopular has none).
        defaults: what the automatic (-1 / ``"auto"``) values of the config resolve to, by dotted
            key (``"model.dim"``, ``"model.score_cap"``, ``"model.dropout"``, ``"train.soft_readout_steps"``,
            ``"train.targets"``, ``"train.horizon"`` (held on data whose order is open:
            :func:`automatic_horizon`), ``"train.negative_scores"``, ``"train.full_softmax"``,
            ``"train.attention_reg"``: the last
            applies to ``K > 1`` and last-position training only, else it resolves to 0), and
            ``"epoch_decay"``: the automatic AdamW shrinkage per pass (:mod:`recsys.train.plan`).
        large_catalogue: the automatic ``"model.dim"`` and ``"model.dropout"`` from
            :data:`LARGE_CATALOGUE` items on, in place of ``defaults``; such a key stays automatic
            (-1) until the catalogue is known. (An exact ``"train.full_softmax"`` default holds
            below :data:`FUSED_EXACT_SOFTMAX_ITEMS` items where the exact softmax runs on its
            fused kernel, else below :data:`EXACT_SOFTMAX_ITEMS`, and is automatic until the
            catalogue is known.)
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
    needs_item_counts: bool = False
    trainable: bool = True
    defaults: Mapping[str, Any] = field(default_factory=dict)
    large_catalogue: Mapping[str, Any] = field(default_factory=dict)
    tune_space: Mapping[str, Any] = field(default_factory=dict)
    saved_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def default(self, key: str, fallback: Any) -> Any:
        """The automatic value of ``key`` for this model (``fallback`` where the spec says nothing)."""
        return self.defaults.get(key, fallback)


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


def _catalogue_value(spec: ModelSpec, key: str, fallback: Any, num_items: int | None) -> Any:
    """The automatic ``key`` of ``spec`` on a catalogue of ``num_items`` ids (0 = padding);
    ``None`` while a catalogue-dependent key waits for the catalogue."""
    if key in spec.large_catalogue:
        if num_items is None:
            return None
        if num_items - 1 >= LARGE_CATALOGUE:
            return spec.large_catalogue[key]
    return spec.default(key, fallback)


def resolve_model(model: ModelConfig, num_items: int | None = None) -> ModelConfig:
    """A copy of ``model`` with its automatic values resolved and its settings checked.

    A value that depends on the catalogue (``ModelSpec.large_catalogue``) stays -1 without
    ``num_items`` (ids, with padding), for :func:`~recsys.models.build_model` to resolve.
    """
    spec = spec_for(model.name)
    model = dataclasses.replace(model)
    if model.dim == -1 and (dim := _catalogue_value(spec, "model.dim", DEFAULT_DIM, num_items)) is not None:
        model.dim = int(dim)
        check_heads(model)
    if model.score_cap == -1.0:
        model.score_cap = float(spec.default("model.score_cap", 0.0))
    if model.dropout == -1.0 and (p := _catalogue_value(spec, "model.dropout", DEFAULT_DROPOUT, num_items)) is not None:
        model.dropout = float(p)
    defaults = dataclasses.replace(ModelConfig(), score_cap=0.0)
    for key in STRICT_SETTINGS:
        value, default = getattr(model, key), getattr(defaults, key)
        if key not in spec.settings and value != default:
            readers = [s.name for s in _SPECS.values() if key in s.settings]
            raise ConfigError(
                f"model.{key}={value!r} has no effect on {model.name} (only "
                f"{', '.join(sorted(readers)) or 'no model'} read it); set it to {default!r}"
            )
    return model


def automatic_horizon(name: str, tied_share: float | None) -> int | None:
    """The automatic ``train.horizon`` of model ``name`` on data where ``tied_share`` of a user's
    consecutive clicks share a timestamp (:meth:`recsys.data.Dataset.tied_share`): the spec's
    horizon from :data:`TIED_ORDER` on, else 1; ``None`` while a spec horizon above 1 waits for
    the data."""
    horizon = int(spec_for(name).default("train.horizon", 1))
    if horizon == 1:
        return 1
    return None if tied_share is None else horizon if tied_share >= TIED_ORDER else 1


def resolve(
    cfg: Config, num_items: int | None = None, *, fused_softmax: bool = False, tied_share: float | None = None
) -> Config:
    """A copy of ``cfg`` with every automatic value resolved for ``cfg.model.name`` and the
    model-dependent checks done, so that a saved config records what the run used (the values
    that follow the catalogue, such as the width, once its ``num_items``, ids with padding, is
    known: :func:`resolve_model`; the horizon once the data's ``tied_share`` is: :func:`automatic_horizon`).

    ``fused_softmax``: the run's exact softmax would run on its fused kernel (the trainer's
    :func:`recsys.train.plan.fused_exact_softmax`), which moves an exact default's catalogue limit
    from :data:`EXACT_SOFTMAX_ITEMS` to :data:`FUSED_EXACT_SOFTMAX_ITEMS`.

    Raises :class:`ConfigError` naming the key for a setting that has no effect on the model
    (``model.qk_norm`` on a model without query-key attention, ``train.attention_reg`` on a
    model without attention scores) and for ``train.targets = "all"`` on a model that cannot
    train densely.
    """
    spec = spec_for(cfg.model.name)
    cfg = copy.deepcopy(cfg)
    cfg.model = resolve_model(cfg.model, num_items)
    t = cfg.train
    if t.soft_readout_steps == -1:
        t.soft_readout_steps = int(spec.default("train.soft_readout_steps", 0))
    if t.targets == AUTO:
        t.targets = str(spec.default("train.targets", "last"))
    if t.horizon == -1 and (horizon := automatic_horizon(cfg.model.name, tied_share)) is not None:
        t.horizon = horizon
    if t.full_softmax == AUTO:
        # hard negatives are a sampling proposal: asking for them asks for the sampled softmax
        exact = bool(spec.default("train.full_softmax", False)) and not t.hard_negatives
        limit = FUSED_EXACT_SOFTMAX_ITEMS if fused_softmax else EXACT_SOFTMAX_ITEMS
        if not exact or num_items is not None:
            t.full_softmax = exact and num_items is not None and num_items - 1 < limit
    if t.negative_scores == AUTO:
        t.negative_scores = str(spec.default("train.negative_scores", "readout"))
    reads_every_row = t.full_softmax is True or bool(t.hard_negatives)  # the exact softmax, the hard proposal
    if t.item_updates == AUTO and num_items is not None and t.full_softmax != AUTO:
        t.item_updates = "sparse" if not reads_every_row and num_items - 1 >= SPARSE_ITEMS else "dense"
    if t.item_updates == "sparse" and reads_every_row:
        why = "train.full_softmax = true scores" if t.full_softmax is True else "train.hard_negatives draws from"
        raise ConfigError(f'train.item_updates="sparse": {why} every item row each step; set it to "dense" or "auto"')
    if t.attention_reg == -1.0:  # a diversity term between interests, read from one history's scores
        several = spec.multi_interest and cfg.model.num_interests > 1
        t.attention_reg = float(spec.default("train.attention_reg", 0.0)) if several and t.targets == "last" else 0.0
    if t.attention_reg and not spec.self_attentive:
        readers = sorted(s.name for s in _SPECS.values() if s.self_attentive)
        raise ConfigError(
            f"train.attention_reg={t.attention_reg:g} has no effect on {cfg.model.name} (only "
            f"{' and '.join(readers)} read their clicks through attention scores); set it to 0"
        )
    if t.attention_reg and t.targets == "all":
        raise ConfigError(
            f"train.attention_reg={t.attention_reg:g}: the attention regulariser reads one history's scores, "
            'which dense training (train.targets="all") does not compute; set it to 0 or train.targets="last"'
        )
    if t.interest_reg and not (spec.multi_interest and cfg.model.num_interests > 1):
        raise ConfigError(
            f"train.interest_reg={t.interest_reg:g} has no effect on {cfg.model.name} with "
            f"model.num_interests={cfg.model.num_interests} (it separates K > 1 interests); set it to 0"
        )
    if t.targets == "all" and not spec.dense:
        dense = sorted(s.name for s in _SPECS.values() if s.dense)
        raise ConfigError(
            f'train.targets="all": {cfg.model.name} cannot train on every position of a window '
            f'(models that can: {", ".join(dense)}); use "last" or "auto"'
        )
    # the evaluation's automatic values follow the config alone; written down so the saved config says them
    if cfg.eval.objective == AUTO:
        cfg.eval.objective = objective(cfg.eval)
    if cfg.eval.exclude_history == AUTO:
        cfg.eval.exclude_history = excludes_history(cfg)
    return cfg


def unresolved(cfg: Config) -> list[str]:
    """The keys of ``cfg`` that still hold an automatic value (-1 or ``"auto"``) that
    :func:`resolve` decides: empty once the config is resolved with the catalogue's size and the
    data's tied share, as :func:`recsys.run.build_experiment` does."""
    m, t = cfg.model, cfg.train
    sentinels = {
        "model.dim": m.dim == -1,
        "model.dropout": m.dropout == -1.0,
        "model.score_cap": m.score_cap == -1.0,
        "train.targets": t.targets == AUTO,
        "train.horizon": t.horizon == -1,
        "train.full_softmax": t.full_softmax == AUTO,
        "train.negative_scores": t.negative_scores == AUTO,
        "train.attention_reg": t.attention_reg == -1.0,
        "train.soft_readout_steps": t.soft_readout_steps == -1,
        "train.item_updates": t.item_updates == AUTO,
    }
    return [key for key, automatic in sentinels.items() if automatic]


def epoch_decay(name: str) -> float:
    """The automatic AdamW shrinkage per pass over the data for model ``name``."""
    return float(spec_for(name).default("epoch_decay", DEFAULT_EPOCH_DECAY))
