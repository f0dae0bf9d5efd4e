"""Run configuration: plain dataclasses of primitives, loaded from TOML, overridable with ``--set``.

A :class:`Config` has one section per pipeline stage. Every field is a primitive (``int``,
``float``, ``str``, ``bool``; ``train.cuda_graph``, ``train.full_softmax`` and
``eval.exclude_history`` are a ``bool`` or the string ``"auto"``) or a list of ``int``, so a
config round-trips through JSON and a checkpoint that embeds it loads with
``torch.load(weights_only=True)``.

Unknown sections, unknown keys and values of the wrong type are errors that name the key::

    >>> cfg = load_config(None, ["model.dim=32", "train.lr=0.01"])
    >>> cfg.model.dim
    32
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
import typing
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


AUTO = "auto"  # the value of a setting decided when the experiment is built (AUTOMATIC, recsys.run.settings)
# the config's format: a saved config without ``config_version`` is version 1, read with the values in force
# then (recsys.run.saved_config); from version 2 a run's config.json holds every automatic value decided
CONFIG_VERSION = 2
REGISTRY_TABLE = "dataset"  # a dataset registry entry's table (data/<name>.toml); not run config
TUNE_TABLE = "tune"  # `recsys tune`'s search space (recsys.tune); not run config
KERNEL_BACKENDS = ("auto", "triton", "torch")  # model.backend: recsys.kernels.common.backend


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the offending key."""


class _Section:
    """What a config and its sections do beyond holding plain data: once :func:`freeze` has run on
    them (a resolved config: :func:`recsys.run.settings.resolve`) they refuse assignment, so no
    reader changes the values a run records. A copy (``copy.copy``, ``copy.deepcopy``, pickle,
    :func:`with_values`) is a plain config again, to change at will."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__}.{name}: a resolved config is frozen; change a copy "
                "(recsys.config.with_values, copy.deepcopy) before it is resolved"
            )
        object.__setattr__(self, name, value)

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "_frozen"}


# keys that were renamed, old name -> new name: a config file, `--set` or `values=` may still use the old name
# (read with a one-line warning naming the new one), and a saved run's config.json loads as it is
RENAMED = {
    "train.targets": "train.predict_at",
    "train.horizon": "train.predict_next",
    "train.negative_scores": "train.negative_readout",
}


def _new_name(key: str, warn: bool = True) -> str:
    """``key``, or its new name where it was renamed (with a warning naming it when ``warn``)."""
    new = RENAMED.get(key)
    if new is None:
        return key
    if warn:
        warnings.warn(f"{key} is now {new}; the old name still works for now", FutureWarning, stacklevel=4)
    return new


def renamed(tree: Mapping[str, Any], *, warn: bool = True) -> dict[str, Any]:
    """A copy of the nested config ``tree`` (a parsed TOML file, a ``config.json``) with renamed keys
    under their new names (:data:`RENAMED`); both names of one key is a :class:`ConfigError`."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in tree.items()}
    for old, new in RENAMED.items():
        (section, leaf), (_, new_leaf) = old.split("."), new.split(".")
        table = out.get(section)
        if isinstance(table, dict) and leaf in table:
            if new_leaf in table:
                raise ConfigError(f"{old} and {new} are one setting (its old and new name); keep {new}")
            table[new_leaf] = table.pop(leaf)
            _new_name(old, warn)
    return out


# ComiRec's greedy diversity penalty: above this, λ·(picks in a category) dwarfs any inner
# product, so larger values change nothing but could overflow the greedy's scores
MAX_DIVERSITY_LAMBDA = 1e6

# K interests: published multi-interest models use 2-10 (ComiRec 4-8, MIND up to 10); every one
# is another search over the catalogue per user, and K = 1000 trained at ~3 s a step on 2 CPU
# cores, so a value far above this is a typo, refused before any work
MAX_NUM_INTERESTS = 64


@dataclass
class SyntheticConfig(_Section):
    """The built-in multi-interest click generator (the default dataset)."""

    num_users: int = 20000
    num_items: int = 4000
    num_categories: int = 40
    interests_per_user: int = 4  # planted interests (categories) per user
    mean_length: int = 40  # mean clicks per user
    switch_prob: float = 0.25  # chance the active interest changes after each click
    popularity_alpha: float = 1.0  # Zipf exponent of item popularity inside a category
    noise: float = 0.05  # share of clicks on a uniformly random item
    seed: int = 7


@dataclass
class DataConfig(_Section):
    """Where the clicks come from and how they are filtered and split."""

    source: str = "synthetic"  # "synthetic" or a path to a file or folder
    # auto (detected) | csv | tsv | parquet | comirec | movielens | sequences | a reader registered with
    # recsys.data.formats.register_reader (an unknown one is refused with the known names: recsys.run.settings.check)
    format: str = "auto"
    user_col: str = "user"
    item_col: str = "item"
    time_col: str = "timestamp"  # empty: use row order within a user
    category_col: str = ""
    categories: str = ""  # optional item -> category file for any format
    # optional item features for any format (recsys.data.features; docs/data.md, "Item features"): a CSV/TSV file
    # (a cell's several values split at "|"), Parquet, JSON ({"item": [values]}), JSON lines, or MovieLens' u.item
    # (its genres); items it lists that the prepared clicks lack are new items, numbered after the clicked ones
    item_features: str = ""
    feature_item_col: str = "item"  # the item column (JSON lines: field) of data.item_features
    feature_vector_col: str = ""  # its column of dense vectors (lists of numbers: text embeddings); empty: none
    # optional text file of raw item ids, one a line: every click on them leaves the split's training part (training
    # users' sequences, leave-one-out's training prefixes) and nothing else, so they train as new items would and
    # evaluation still sees them in inputs and truth (recsys.data.split; docs/data.md, "Holding items out")
    held_out_items: str = ""
    skip_bad_rows: bool = False  # report and drop malformed rows instead of failing
    min_item_count: int = 5
    min_user_count: int = 5
    kcore: bool = False  # iterate both filters until stable
    # user (ComiRec 8:1:1) | time (global cutoff) | leave_one_out (each user's last click tests, the one
    # before validates; full ranking: recsys.data.split)
    split: str = "user"
    # leave_one_out's evaluation rules: rectools (drop a target the user clicked before, or that no earlier click
    # is: RecTools', the eSASRec benchmark's) | every_user (score every held-out user, nothing dropped: the
    # S3Rec / FMLP-Rec / BSARec / TV-Rec / WEARec lineage's); recsys.data.split
    loo_rules: str = "rectools"
    valid_frac: float = 0.1
    test_frac: float = 0.1
    time_cutoff_quantile: float = 0.9  # time split: clicks before this quantile train
    eval_input_frac: float = 0.8  # eval users: first int(frac * n) clicks are the input
    max_len: int = 20
    seed: int = 2020
    cache_dir: str = ""  # where `recsys data` writes the prepared dataset
    # auto | memory | disk: disk prepares out of core (DuckDB) into a cached folder (data.cache_dir, else
    # ~/.cache/recsys/prepared) and memory-maps the clicks; auto picks disk from 256 MiB of text or 64 MiB of Parquet
    prepare: str = "auto"


CHOOSE_COLD_SCALE = -1.0  # model.cold_scale: chosen on validation once trained (recsys.train.new_items)
CHOOSE_NEW_ITEM_SHARE = -1.0  # retrieval.new_item_share: chosen on validation once trained (recsys.train.new_items)


@dataclass
class ModelConfig(_Section):
    """Which encoder turns a click sequence into K interests, and its sizes."""

    name: str = "comirec_sa"
    # embedding and interest width; -1 (the default): the model's automatic value (recsys.models.spec)
    dim: int = -1
    num_interests: int = 4
    hidden: int = 0  # self-attentive hidden size; 0 (the default): 4 * dim, as ComiRec
    num_layers: int = 2  # transformer encoders
    num_heads: int = -1  # -1 (the default): the model's automatic value (recsys.models.spec)
    dropout: float = -1.0  # transformer encoders; -1 (the default): the model's automatic value (recsys.models.spec)
    routing_iters: int = 3  # capsule models
    qk_norm: str = ""  # "" | rms | layer
    softcap: float = 0.0  # attention logit soft-cap; 0 disables
    backend: str = "auto"  # kernel backend: auto | triton | torch
    # learned positions: recent (0 = latest click) | absolute (0 = oldest) | alibi (self-attentive heads: a
    # learned linear recency bias per interest, which the dense causal form reads from every prefix) | none
    positions: str = "recent"
    # sasrec_mi: its multi-interest head pools items (embeddings) | encoded (encoder outputs)
    head_values: str = "items"
    # transformer encoders (recsys.nn.transformer): the token mixer, attention | frequency (BSARec's low/high-band
    # filter; it reads the whole window, so it trains on the last position only) | hybrid (BSARec's
    # filter_alpha * filter + (1 - filter_alpha) * attention) | wavelet (WEARec's: filter_alpha * an adaptive
    # frequency filter + (1 - filter_alpha) * a Haar wavelet, no attention; it too reads the whole window); the
    # block form, pre_norm | post_norm (BERT's, as SASRec's code, S3Rec and BSARec) | ligr (pre-norm, sigmoid-gated
    # residuals, SwiGLU: eSASRec's); BSARec's c (the low band keeps c // 2 + 1 frequencies); dropout on attention
    # probabilities (the kernels have none: it trains on the PyTorch twin). mixer, block, filter_alpha,
    # attention_dropout and init: "auto" / -1 (the default) is the model's own (recsys.models.spec): sasrec's
    # attention in pre-norm blocks, bsarec's and wearec's published blocks
    mixer: str = AUTO
    block: str = AUTO
    filter_cutoff: int = 5
    filter_alpha: float = -1.0
    # the filter at each position reads the window that ends there (a causal FIR filter), so the model can train
    # densely (train.predict_at = "all"); false: BSARec's, over the whole window
    filter_causal: bool = False
    # what the whole-window filters (frequency, hybrid, wavelet) read at the window's padding rows: zero (recsys's:
    # a user's representation does not depend on their padding) | window (the published blocks': the rows the
    # encoder computed there, placed as in a left-padded window, so a short history's low band carries learned
    # position terms; recsys.nn.frequency)
    filter_padding: str = "zero"
    attention_dropout: float = -1.0
    # transformer encoders' initial weights: scaled (item rows N(0, 1/d), torch's Linear init) | bert (every
    # Linear and embedding N(0, 0.02), zero biases: BERT's, which S3Rec, FMLP-Rec and BSARec keep)
    init: str = AUTO
    # with data.item_features: each item is its id row plus its features' embeddings, and an item without training
    # clicks (a new item) is its features alone (recsys.items.features); false: ids alone
    use_features: bool = True
    # with item features: in training, each read of a clicked item leaves its id row out with this probability, so
    # the features learn to stand for an item alone and new items score on the clicked items' scale; 0: never
    id_dropout: float = 0.0
    # with item features: outside training, an item without training clicks (a new item) is its features plus the
    # mean id row of the clicked items sharing its attribute values (attribute_mean: its score the expected score of
    # a clicked item of its kind; recsys.items.features; docs/results.md, "New items") | its features alone (zero)
    cold_rows: str = "attribute_mean"
    # with item features: outside training, an item without training clicks is scaled by this (above 1: new items
    # rank higher against the clicked ones, which can cost the clicked items' recall; docs/results.md, "New items");
    # -1 (the default): the largest scale that costs no validation recall, chosen once trained (recsys.train.new_items)
    cold_scale: float = CHOOSE_COLD_SCALE
    # self-attentive models: scores become c*tanh(s/c), so no interest collapses onto one click;
    # 0 disables; -1 (the default): the model's automatic value (recsys.models.spec)
    score_cap: float = -1.0


@dataclass
class TrainConfig(_Section):
    """The optimisation loop."""

    optimizer: str = "adamw"  # adamw | adam
    # -1 (the default): the model's rate (recsys.models.spec; 1e-3, the lineage's models 5e-4), the same at every
    # batch: raising it with the batch (the square-root rule) lost recall at 2,048 and 4,096 (docs/defaults.md,
    # "Batch and learning rate on large logs")
    lr: float = -1.0
    weight_decay: float = -1.0  # -1: a fixed shrinkage per epoch, from the data's size (recsys.run.settings)
    # samples a step on each process; 0 (the default): 128, larger on logs whose epoch at 128 would pass
    # 20,000 steps (recsys.run.settings)
    batch_size: int = 0
    max_steps: int = 0  # 0: max_epochs epochs, each as many samples as training targets (recsys.train.plan)
    max_epochs: float = 100.0  # the budget when max_steps = 0; the plateau stop usually ends the run first
    eval_every: int = 0  # 0: a cadence that grows with the run (recsys.train.plan)
    patience: int = 5  # validations without improvement before stopping; 0 disables
    # at a plateau, go back to the best weights and train on at lr * lr_drop_factor, this many times
    # before the plateau stops the run (0: the first plateau stops it)
    lr_drops: int = 0
    lr_drop_factor: float = 0.1
    # validate, keep and ship an exponential moving average of the weights with this decay (about
    # 1 / (1 - ema_decay) steps averaged; recsys.train.averaging); 0 scores the last weights
    ema_decay: float = 0.999
    # wall-clock budget of the whole run, the data, the last validation and the test included: training stops where
    # the time left covers one last validation and the test (docs/training.md); 0 disables
    max_minutes: float = 0.0
    num_negatives: int = 0  # shared sampled negatives; 0 (the default): 10 * the global batch (batch_size * processes)
    sampler: str = "log_uniform"  # uniform | log_uniform | unigram
    sampler_alpha: float = 0.75  # unigram exponent
    logq: bool = True  # subtract log Q(item) from sampled logits
    remove_accidental_hits: bool = True
    # the training loss (recsys.train.losses): softmax (exact or sampled: train.full_softmax) | bpr (pairs of each
    # target and the shared negatives) | a loss registered with recsys.train.losses.register_loss
    loss: str = "softmax"
    # the exact softmax over the whole catalogue (true) or the sampled one (false); "auto" (the default): the
    # model's choice for the catalogue's size and the device (recsys.models.spec: sasrec is exact on small catalogues)
    full_softmax: bool | str = AUTO
    z_loss: float = 0.0
    grad_clip: float = 5.0  # 0 disables
    amp: bool = True  # bf16 autocast on CUDA
    compile: bool = False
    # the whole training step as one CUDA graph: "auto" (on CUDA when the step can be captured, else
    # eager launches with one line saying why) | true (capture or fail) | false (eager launches)
    cuda_graph: bool | str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 42
    log_every: int = 100
    # earliest target position in a training sequence; -1 (the default): the model's (recsys.models.spec: 4 as
    # ComiRec's code, 1 for the lineage's models, whose epoch trains every prefix)
    min_target: int = -1
    # which positions of a training window predict (formerly train.targets): "last" = the last one, one target
    # per sampled history (ComiRec's sampler) | "all" = every position predicts what follows it (dense) |
    # "auto" = the model's default (its spec)
    predict_at: str = AUTO
    # where dense training windows end (recsys.data.batches.WindowSampler): "tiled" = at the user's last click
    # or a multiple of data.max_len before it, so each click is a target once and short users always train on
    # their whole sequence | "random" = anywhere, which trains early clicks far more often than the latest
    # (docs/defaults.md, "Dense training windows")
    windows: str = "tiled"
    # how last-position training (predict_at = "last") draws its samples: "users" = a uniform user, then a uniform
    # target of theirs (ComiRec's sampler) | "targets" = every training target equally likely, as an epoch over
    # every prefix of every user does (the S3Rec / BSARec lineage's training set), each draw independent |
    # "epochs" = every training target exactly once an epoch, in a fresh random order each epoch (that lineage's
    # data loader; recsys.data.batches.TrainSampler) | "auto" (the default): the model's (recsys.models.spec)
    draw: str = AUTO
    # how many following clicks each predicting position predicts (formerly train.horizon): 1 = the next one |
    # m > 1 = each of the next m clicks, read out against the same interests (PinnerFormer's all-action
    # objective) | -1 (the default): the model's value where the data's timestamps leave the order of
    # consecutive clicks open, else 1 (recsys.run.settings)
    predict_next: int = -1
    # torch intra-op threads; 0 (the default): the cores other work leaves free as the run starts (recsys.run.settings)
    cpu_threads: int = 0
    # also write every metrics.jsonl scalar as TensorBoard events (RUN/tensorboard/; extra track)
    tensorboard: bool = False
    # against interest collapse (see docs/multi-interest.md)
    # weight of mean sum_l A^2 (each interest's collision probability) for self-attentive models, K > 1;
    # -1 (the default): the model's automatic value (recsys.models.spec)
    attention_reg: float = -1.0
    # K > 1: weight of the mean over pairs of a row's interests of max(0, cosine - interest_margin)
    # (recsys.train.losses.interest_cosine); interest_margin = -1 penalises the plain mean cosine;
    # -1 (the default): the model's automatic value (recsys.models.spec)
    interest_reg: float = -1.0
    interest_margin: float = 0.7
    # K > 1: the readout blends from a softmax over interests to ComiRec's argmax over these steps;
    # -1 (the default): the model's automatic value (recsys.models.spec)
    soft_readout_steps: int = -1
    # which interest scores a row's negatives, K > 1 (formerly train.negative_scores): "readout" = the one the
    # readout chose for the row's target (ComiRec) | "max" = each negative's best-matching interest, the score
    # retrieval ranks by | "auto" = the model's default (its spec)
    negative_readout: str = AUTO
    hard_negatives: float = 0.0  # share of the sampled negatives drawn near the batch's interests (exact logQ)
    # how a step updates the item table: "sparse" = only the rows its batch touches, with per-row Adam state
    # (recsys.items.row_sparse) | "sharded" = the same, each torchrun rank keeping the Adam state and average of
    # its share of the rows (recsys.items.sharded; one process: as "sparse") | "dense" = the whole table through
    # torch.optim | "auto" (the default): sparse where the step samples its negatives and the catalogue is large
    # (recsys.models.spec.SPARSE_ITEMS)
    item_updates: str = AUTO
    hard_negative_temperature: float = 1.0  # the hard proposal is softmax(<interest, item> / temperature)


@dataclass
class EvalConfig(_Section):
    """Offline evaluation (the protocol is ``data.split``'s)."""

    topn: list[int] = field(default_factory=lambda: [10, 20, 50])
    comirec_ndcg: bool = False  # ComiRec's NDCG variant instead of the standard one
    batch_size: int = 2048
    # never recommend an item of the user's input (every click before the truth): true | false | "auto" (the
    # default): true under data.split = "leave_one_out", as the papers evaluate, false under ComiRec's protocols
    exclude_history: bool | str = AUTO
    diversity_lambda: float = 0.0  # > 0: ComiRec's greedy diversity-controlled aggregation
    # validation during training scores a fixed random sample of this many validation users (0: all of
    # them), so its cost does not grow with the log; the final test always scores every test user
    valid_users: int = 10_000
    # the validation metric that keeps the best weights, stops at a plateau and ranks `recsys tune`'s trials:
    # recall@N | ndcg@N | hitrate@N | mrr@N with N in topn; "auto" (the default): recall@max(topn)
    objective: str = AUTO


@dataclass
class RetrievalConfig(_Section):
    """Candidate retrieval over item embeddings."""

    factory: str = "Flat"  # FAISS index_factory string
    backend: str = "auto"  # auto | faiss | torch
    nprobe: int = 16
    ef_search: int = 128
    ef_construction: int = 80  # HNSW build beam (FAISS's own default, 40, loses recall on 1M items)
    # with item features: the share of each top-n list that items without training clicks (new items) may take
    # where fewer of them earn a place by score (recsys.retrieval.new_items); 0: none; -1 (the default): the
    # largest share that costs no validation recall, chosen once trained (recsys.train.new_items)
    new_item_share: float = CHOOSE_NEW_ITEM_SHARE


@dataclass
class ServeConfig(_Section):
    """The HTTP service."""

    host: str = "127.0.0.1"
    port: int = 8000
    n: int = 50  # default top-N of a request
    max_n: int = 1000  # largest top-N a request may ask for (larger: 422)
    max_batch: int = 64  # most concurrent requests answered by one model call (micro-batching)
    batch_workers: int = 1  # micro-batches computed at once, each in its own thread (1: least GIL contention)
    fallback_popular: bool = False  # unknown user / no known item: most clicked items instead of a 4xx


@dataclass
class Config(_Section):
    """A whole run's configuration. ``name`` and ``output_dir`` place the run directory."""

    name: str = ""
    output_dir: str = "runs"
    config_version: int = CONFIG_VERSION  # the format (CONFIG_VERSION); set by the resolver, read when a run loads
    data: DataConfig = field(default_factory=DataConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self, base: Config | None = None, notes: Mapping[str, str] | None = None) -> str:
        """The resolved config as TOML (printed at the start of every command); with ``base``,
        only the keys whose value differs from ``base``'s (and only tables that have some); with
        ``notes`` (``{"section.key": text}``), each such key's line ends in ``# text``."""
        top, sections = [], []
        old = base.to_dict() if base is not None else {}
        notes = notes or {}

        def line(key: str, value: Any) -> str:
            note = notes.get(key)
            return f"{key.rsplit('.', 1)[-1]} = {_toml_value(value)}" + (f"  # {note}" if note else "")

        for key, value in self.to_dict().items():
            if isinstance(value, dict):
                changed = {k: v for k, v in value.items() if base is None or old[key][k] != v}
                if changed:
                    sections.append(f"\n[{key}]")
                    sections.extend(line(f"{key}.{k}", v) for k, v in changed.items())
            elif base is None or old[key] != value:
                top.append(f"{key} = {_toml_value(value)}")
        return "\n".join(top + sections).lstrip("\n") + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """Return ``value`` converted to ``hint`` (int -> float allowed), or raise naming ``key``."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):  # e.g. bool | str: the first member the value is
        members = typing.get_args(hint)
        for member in members:
            if isinstance(value, member) and not (member is int and isinstance(value, bool)):
                return value
        names = " or ".join(m.__name__ for m in members)
        raise ConfigError(f"{key}: expected {names}, got {type(value).__name__} {value!r}")
    if origin is list:
        (inner,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of {inner.__name__}, got {value!r}")
        return [_check_type(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (hint is int and isinstance(value, bool)) or not isinstance(value, hint):
        raise ConfigError(f"{key}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    if hint is float and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    return value


def _parse_override_value(text: str, hint: Any) -> Any:
    """Parse the right-hand side of ``--set a.b=v`` by the field's type."""
    if hint is str:
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # left as a string; the type check names the key


def _apply(obj: Any, values: dict[str, Any], prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"unknown config key '{path}' (known here: {known})")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a [{path}] table, got {value!r}")
            _apply(getattr(obj, key), value, f"{path}.")
        else:
            setattr(obj, key, _check_type(path, value, hint))


def _set_override(cfg: Config, assignment: str) -> None:
    if "=" not in assignment:
        raise ConfigError(f"override '{assignment}' is not of the form section.key=value")
    path, text = assignment.split("=", 1)
    path = _new_name(path.strip())
    parts = path.split(".")
    obj: Any = cfg
    for i, part in enumerate(parts[:-1]):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            raise ConfigError(f"unknown config key '{'.'.join(parts[: i + 1])}' in override '{assignment}'")
        obj = getattr(obj, part)
    leaf = parts[-1]
    if not dataclasses.is_dataclass(obj) or leaf not in {f.name for f in dataclasses.fields(obj)}:
        raise ConfigError(f"unknown config key '{path.strip()}' in override '{assignment}'")
    hint = typing.get_type_hints(type(obj))[leaf]
    if dataclasses.is_dataclass(hint):
        raise ConfigError(f"'{path.strip()}' is a section; set one of its keys")
    setattr(obj, leaf, _check_type(path.strip(), _parse_override_value(text.strip(), hint), hint))


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``section.key=value`` assignments to ``cfg`` in place, then validate it."""
    for assignment in overrides:
        _set_override(cfg, assignment)
    validate(cfg)
    return cfg


def config_from_dict(values: dict[str, Any]) -> Config:
    """Build a config from nested plain data (a parsed TOML file or a saved ``config.json``)."""
    cfg = Config()
    _apply(cfg, renamed(values), "")
    validate(cfg)
    return cfg


def with_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """A validated copy of ``cfg`` with ``{"section.key": value}`` set (plain Python values,
    e.g. ``{"train.lr": 0.01}``); unknown keys and bad values raise :class:`ConfigError` naming the key.
    Automatic values (:data:`AUTOMATIC`) stay automatic until the experiment is built
    (:func:`recsys.run.settings.resolve`), so they follow a changed ``model.name``."""
    return config_from_dict(_set_dotted(cfg.to_dict(), {_new_name(str(k)): v for k, v in values.items()}))


def _set_dotted(tree: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """Set ``{"section.key": value}`` in the nested dict ``tree`` (in place; returned)."""
    for key, value in values.items():
        *sections, leaf = str(key).split(".")
        node = tree
        for section in sections:
            if not isinstance(node.setdefault(section, {}), dict):
                raise ConfigError(f"{key!r}: {section!r} is a setting, not a section")
            node = node[section]
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return tree


def load_config(
    paths: str | Path | Sequence[str | Path] | None = None,
    overrides: list[str] | None = None,
    *,
    values: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults, then each TOML file in ``paths`` in order (later files win; a ``[dataset]``
    table, a registry entry's download details, and a ``[tune]`` table, ``recsys tune``'s search
    space, are skipped), then each ``section.key=value`` override, then ``values`` (plain Python
    values by dotted key, as :func:`with_values` takes them). Automatic values (:data:`AUTOMATIC`)
    are left for the experiment to resolve (:func:`recsys.run.settings.resolve`). Layering lets a
    dataset file and a model file combine::

        load_config(["experiments/configs/data/taobao.toml", "experiments/configs/models/comirec_sa.toml"])
    """
    cfg = Config()
    if paths is None:
        paths = []
    elif isinstance(paths, (str, Path)):
        paths = [paths]
    for path in map(Path, paths):
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: invalid TOML: {err}") from None
        except UnicodeDecodeError as err:  # err.object: the file's bytes
            line = err.object.count(b"\n", 0, err.start) + 1
            byte = err.object[err.start]
            raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {byte:#04x}); TOML files are UTF-8") from None
        table.pop(REGISTRY_TABLE, None)
        table.pop(TUNE_TABLE, None)
        try:
            _apply(cfg, renamed(table), "")
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    for assignment in overrides or []:
        _set_override(cfg, assignment)
    if values:
        _apply(cfg, _set_dotted({}, {_new_name(str(k)): v for k, v in values.items()}), "")
    validate(cfg)
    return cfg


_CHOICES = {
    "data.split": ("user", "time", "leave_one_out"),
    "data.loo_rules": ("rectools", "every_user"),
    "data.prepare": ("auto", "memory", "disk"),
    "model.qk_norm": ("", "rms", "layer"),
    "model.positions": ("recent", "absolute", "alibi", "none"),
    "model.head_values": ("items", "encoded"),
    "model.mixer": (AUTO, "attention", "frequency", "hybrid", "wavelet"),
    "model.cold_rows": ("zero", "attribute_mean"),
    "model.block": (AUTO, "pre_norm", "post_norm", "ligr"),
    "model.filter_padding": ("zero", "window"),
    "model.init": (AUTO, "scaled", "bert"),
    "model.backend": KERNEL_BACKENDS,
    "train.optimizer": ("adam", "adamw"),
    "train.sampler": ("uniform", "log_uniform", "unigram"),
    "train.negative_readout": (AUTO, "readout", "max"),
    "train.predict_at": (AUTO, "last", "all"),
    "train.windows": ("tiled", "random"),
    "train.draw": (AUTO, "users", "targets", "epochs"),
    "train.item_updates": (AUTO, "sparse", "sharded", "dense"),
    "train.device": ("auto", "cpu", "cuda"),
    "retrieval.backend": ("auto", "faiss", "torch"),
}

# train.cuda_graph, train.full_softmax and eval.exclude_history: "auto" lets the code decide
SWITCH_VALUES = (AUTO, True, False)

_POSITIVE = (
    "config_version",
    "data.max_len",
    "model.num_interests",
    "model.num_layers",
    "model.routing_iters",
    "model.filter_cutoff",
    "train.max_epochs",
    "train.log_every",
    "eval.batch_size",
    "synthetic.num_users",
    "synthetic.num_items",
    "synthetic.num_categories",
    "synthetic.interests_per_user",
    "synthetic.mean_length",
    "serve.n",
    "serve.max_n",
    "serve.max_batch",
    "serve.batch_workers",
    "retrieval.nprobe",
    "retrieval.ef_search",
    "retrieval.ef_construction",
)
_NON_NEGATIVE = (
    "data.min_item_count",
    "data.min_user_count",
    "model.hidden",
    "model.softcap",
    "train.max_steps",
    "train.eval_every",
    "train.patience",
    "train.lr_drops",
    "train.num_negatives",
    "train.z_loss",
    "train.max_minutes",
    "train.cpu_threads",
    "train.grad_clip",
    "eval.diversity_lambda",
    "synthetic.noise",
)


def _get(cfg: Config, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


# the keys whose default leaves the value to the model, the data or the device, by the value that says
# so: recsys.run.settings.resolve decides every one of them once, when an experiment is built, and
# nothing else reads these values (tests/test_settings.py walks the code for a comparison with them)
AUTOMATIC: dict[str, Any] = {
    "model.dim": -1,
    "model.num_heads": -1,
    "model.mixer": AUTO,
    "model.block": AUTO,
    "model.filter_alpha": -1.0,
    "model.attention_dropout": -1.0,
    "model.init": AUTO,
    "train.lr": -1.0,
    "train.min_target": -1,
    "train.draw": AUTO,
    "model.dropout": -1.0,
    "model.score_cap": -1.0,
    "model.hidden": 0,
    "train.batch_size": 0,
    "train.weight_decay": -1.0,
    "train.num_negatives": 0,
    "train.predict_at": AUTO,
    "train.predict_next": -1,
    "train.full_softmax": AUTO,
    "train.negative_readout": AUTO,
    "train.attention_reg": -1.0,
    "train.interest_reg": -1.0,
    "train.soft_readout_steps": -1,
    "train.item_updates": AUTO,
    "train.cpu_threads": 0,
    "eval.objective": AUTO,
    "eval.exclude_history": AUTO,
}


def is_automatic(cfg: Config, key: str) -> bool:
    """Whether ``key`` of ``cfg`` (one of :data:`AUTOMATIC`) still holds its automatic value."""
    value, automatic = _get(cfg, key), AUTOMATIC[key]
    return type(value) is type(automatic) and value == automatic


def automatic_keys(cfg: Config) -> list[str]:
    """The keys of ``cfg`` that still hold their automatic value: empty once the config is
    resolved (:func:`recsys.run.settings.resolve`)."""
    return [key for key in AUTOMATIC if is_automatic(cfg, key)]


def freeze(cfg: Config) -> Config:
    """Make ``cfg`` and its sections refuse assignment (see :class:`_Section`); returns it."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, _Section):
            object.__setattr__(value, "_frozen", True)
    object.__setattr__(cfg, "_frozen", True)
    return cfg


def require_resolved(cfg: Config, who: str, section: str = "") -> None:
    """Raise ``ValueError`` naming the keys of ``cfg`` (of ``section`` only, where given) that still
    hold an automatic value: ``who`` reads a resolved config and decides nothing itself."""
    left = [key for key in automatic_keys(cfg) if key.startswith(section)]
    if left:
        raise ValueError(
            f"{who}: {', '.join(left)} still automatic; resolve the config first "
            "(recsys.run.settings.resolve, as recsys.run.build_experiment does)"
        )


def validate(cfg: Config) -> None:
    """Check values (not only types) so a bad config fails before any work starts. What depends
    on the model (settings it does not read, its automatic values) is checked by
    :func:`recsys.run.settings.check` and :func:`recsys.run.settings.resolve`.

    The first bad key found raises :class:`ConfigError` naming it."""
    _check_automatic_keys(cfg)
    _check_listed_keys(cfg)
    _check_bounds(cfg)
    _check_dependent_keys(cfg)
    _check_data_fractions(cfg)
    _check_eval(cfg)
    if cfg.serve.n > cfg.serve.max_n:
        raise ConfigError(f"serve.n: {cfg.serve.n} exceeds serve.max_n {cfg.serve.max_n}")
    if not 0 <= cfg.serve.port <= 65535:
        raise ConfigError(f"serve.port: must be in 0..65535, got {cfg.serve.port}")
    if not (is_automatic(cfg, "model.dim") or is_automatic(cfg, "model.num_heads")):
        check_heads(cfg.model)


def _check_automatic_keys(cfg: Config) -> None:
    """The keys whose sentinel (-1 or 0) means automatic (:data:`AUTOMATIC`) take it or a value in
    range; ``train.lr``'s automatic value is -1, not 0 (its automatic value once), which it names."""
    for path in ("model.dim", "model.num_heads", "train.min_target"):
        if _get(cfg, path) <= 0 and not is_automatic(cfg, path):
            raise ConfigError(f"{path}: must be > 0 (or -1: automatic), got {_get(cfg, path)!r}")
    for path in (
        "model.score_cap",
        "model.dropout",
        "train.soft_readout_steps",
        "train.weight_decay",
        "train.attention_reg",
        "train.interest_reg",
    ):
        if _get(cfg, path) < 0 and not is_automatic(cfg, path):
            raise ConfigError(f"{path}: must be >= 0 (or -1: automatic), got {_get(cfg, path)!r}")
    alpha, attention = _get(cfg, "model.filter_alpha"), _get(cfg, "model.attention_dropout")
    if not 0.0 <= alpha <= 1.0 and not is_automatic(cfg, "model.filter_alpha"):
        raise ConfigError(f"model.filter_alpha: must be in [0, 1] (or -1: automatic), got {alpha!r}")
    if not 0.0 <= attention < 1.0 and not is_automatic(cfg, "model.attention_dropout"):
        raise ConfigError(f"model.attention_dropout: must be in [0, 1) (or -1: automatic), got {attention!r}")
    if (batch := _get(cfg, "train.batch_size")) < 0:
        raise ConfigError(f"train.batch_size: must be > 0 (or 0: automatic), got {batch!r}")
    if cfg.train.lr <= 0 and not is_automatic(cfg, "train.lr"):
        was = " (0 no longer means automatic: it once followed the batch)" if cfg.train.lr == 0 else ""
        raise ConfigError(f"train.lr: must be > 0 (or -1: the model's rate), got {cfg.train.lr!r}{was}")


def _check_listed_keys(cfg: Config) -> None:
    """The keys of the tables above: one of :data:`_CHOICES`, positive, non-negative."""
    for path, choices in _CHOICES.items():
        if _get(cfg, path) not in choices:
            raise ConfigError(f"{path}: {_get(cfg, path)!r} is not one of {list(choices)}")
    for path in _POSITIVE:
        if _get(cfg, path) <= 0:
            raise ConfigError(f"{path}: must be > 0, got {_get(cfg, path)!r}")
    for path in _NON_NEGATIVE:
        if _get(cfg, path) < 0:
            raise ConfigError(f"{path}: must be >= 0, got {_get(cfg, path)!r}")


def _check_bounds(cfg: Config) -> None:
    """The values that must lie in an interval or under a cap (and ``train.cuda_graph``, a switch)."""
    if cfg.model.filter_causal and cfg.model.mixer == "wavelet":
        raise ConfigError("model.filter_causal: the wavelet mixer has no causal form; train it on the last position")
    if cfg.model.filter_causal and cfg.model.filter_padding == "window":
        raise ConfigError(
            'model.filter_padding="window" reads the padding rows of a whole window; the causal filter reads none'
        )
    if not -1.0 <= cfg.train.interest_margin < 1.0:
        raise ConfigError(f"train.interest_margin: a cosine in [-1, 1), got {cfg.train.interest_margin!r}")
    if cfg.model.num_interests > MAX_NUM_INTERESTS:
        raise ConfigError(
            f"model.num_interests: must be <= {MAX_NUM_INTERESTS} (published models use 2-10; each interest is "
            f"another search of the catalogue per user), got {cfg.model.num_interests!r}"
        )
    if cfg.eval.diversity_lambda > MAX_DIVERSITY_LAMBDA:
        raise ConfigError(
            f"eval.diversity_lambda: must be <= {MAX_DIVERSITY_LAMBDA:g}, got {cfg.eval.diversity_lambda!r}"
        )
    if cfg.train.cuda_graph not in SWITCH_VALUES:
        raise ConfigError(f'train.cuda_graph: must be true, false or "auto", got {cfg.train.cuda_graph!r}')
    if not 0.0 <= cfg.train.hard_negatives < 1.0:
        raise ConfigError(f"train.hard_negatives: must be in [0, 1), got {cfg.train.hard_negatives!r}")
    if not cfg.train.hard_negative_temperature > 0:
        raise ConfigError(f"train.hard_negative_temperature: must be > 0, got {cfg.train.hard_negative_temperature!r}")
    if not 0 < cfg.train.lr_drop_factor < 1:
        raise ConfigError(f"train.lr_drop_factor: must be in (0, 1), got {cfg.train.lr_drop_factor!r}")
    if not 0.0 <= cfg.train.ema_decay < 1.0:
        raise ConfigError(f"train.ema_decay: must be in [0, 1) (0: no averaging), got {cfg.train.ema_decay!r}")


def _check_dependent_keys(cfg: Config) -> None:
    """``train.predict_next``'s range, then the keys that need or rule out another one: the
    leave-one-out rules, learning-rate drops (need a patience), hard negatives (need sampling; the
    ``train.full_softmax`` switch checked before), ``model.dropout`` below 1, ``model.id_dropout``
    (needs item features), the item feature columns."""
    if cfg.train.predict_next < 1 and not is_automatic(cfg, "train.predict_next"):
        raise ConfigError(f"train.predict_next: must be >= 1 (or -1: automatic), got {cfg.train.predict_next!r}")
    if cfg.data.loo_rules != "rectools" and cfg.data.split != "leave_one_out":
        raise ConfigError(f'data.loo_rules: applies to data.split = "leave_one_out" only (got {cfg.data.split!r})')
    if cfg.train.lr_drops and not cfg.train.patience:
        raise ConfigError("train.lr_drops: needs train.patience > 0 (the plateau it waits for)")
    if cfg.train.full_softmax not in SWITCH_VALUES:
        raise ConfigError(f'train.full_softmax: must be true, false or "auto", got {cfg.train.full_softmax!r}')
    if cfg.train.hard_negatives and cfg.train.full_softmax is True:
        raise ConfigError(
            "train.hard_negatives: has no effect with train.full_softmax = true (no sampling); set it to 0"
        )
    if cfg.model.dropout >= 1.0:  # negatives other than -1 are refused above
        raise ConfigError(f"model.dropout: must be < 1, got {cfg.model.dropout!r}")
    if not 0.0 <= cfg.model.id_dropout < 1.0:
        raise ConfigError(f"model.id_dropout: must be in [0, 1), got {cfg.model.id_dropout!r}")
    if cfg.model.id_dropout and not (cfg.data.item_features and cfg.model.use_features):
        raise ConfigError(
            "model.id_dropout: leaves items' id rows out for their features, so it needs data.item_features "
            "and model.use_features = true; set it to 0"
        )
    if not (cfg.model.cold_scale > 0 or cfg.model.cold_scale == CHOOSE_COLD_SCALE):
        raise ConfigError(f"model.cold_scale: must be > 0 (or -1: chosen on validation), got {cfg.model.cold_scale!r}")
    if cfg.model.cold_scale not in (1.0, CHOOSE_COLD_SCALE) and not (cfg.data.item_features and cfg.model.use_features):
        raise ConfigError(
            f"model.cold_scale={cfg.model.cold_scale:g}: scales items without clicks, which only item features "
            "represent; it needs data.item_features and model.use_features = true; leave it -1 (the default)"
        )
    share = cfg.retrieval.new_item_share
    if not (0.0 <= share < 1.0 or share == CHOOSE_NEW_ITEM_SHARE):
        raise ConfigError(f"retrieval.new_item_share: must be in [0, 1) (or -1: chosen on validation), got {share!r}")
    if share > 0 and not (cfg.data.item_features and cfg.model.use_features):
        raise ConfigError(
            f"retrieval.new_item_share={share:g}: reserves places for items without clicks, which only item "
            "features represent; it needs data.item_features and model.use_features = true; leave it -1 (the default)"
        )
    if cfg.data.item_features and not cfg.data.feature_item_col:
        raise ConfigError("data.feature_item_col: names the item column of data.item_features; it is empty")
    if cfg.data.feature_vector_col and cfg.data.feature_vector_col == cfg.data.feature_item_col:
        raise ConfigError(f"data.feature_vector_col: {cfg.data.feature_vector_col!r} is data.feature_item_col too")


def _check_data_fractions(cfg: Config) -> None:
    """The shares in ``data``: of an evaluation user's clicks that are input, of the clicks before the
    time split's cut-off, of the users that validate and test."""
    if not 0.0 < cfg.data.eval_input_frac < 1.0:
        raise ConfigError(f"data.eval_input_frac: must be in (0, 1), got {cfg.data.eval_input_frac!r}")
    if not 0.0 < cfg.data.time_cutoff_quantile < 1.0:
        raise ConfigError("data.time_cutoff_quantile: must be in (0, 1)")
    if cfg.data.valid_frac < 0 or cfg.data.test_frac <= 0 or cfg.data.valid_frac + cfg.data.test_frac >= 1:
        raise ConfigError("data.valid_frac/test_frac: need valid >= 0, test > 0, valid + test < 1")


def _check_eval(cfg: Config) -> None:
    """``eval.topn``, ``eval.exclude_history`` and ``eval.objective``."""
    if not cfg.eval.topn or any(n <= 0 for n in cfg.eval.topn):
        raise ConfigError(f"eval.topn: need a non-empty list of positive ints, got {cfg.eval.topn!r}")
    if cfg.eval.exclude_history not in SWITCH_VALUES:
        raise ConfigError(f'eval.exclude_history: must be true, false or "auto", got {cfg.eval.exclude_history!r}')
    _check_objective(cfg)


OBJECTIVE_METRICS = ("recall", "ndcg", "hitrate", "mrr")  # eval.objective's metric names (recsys.evaluate.metrics)


def _check_objective(cfg: Config) -> None:
    ev = cfg.eval
    if is_automatic(cfg, "eval.objective"):
        return
    name, _, cutoff = ev.objective.partition("@")
    if name not in OBJECTIVE_METRICS or not cutoff.isdigit() or int(cutoff) not in ev.topn:
        raise ConfigError(
            f'eval.objective: {ev.objective!r} is not "auto" or METRIC@N with METRIC one of '
            f"{', '.join(OBJECTIVE_METRICS)} and N in eval.topn {ev.topn}"
        )


def check_heads(model: ModelConfig) -> None:
    """``model.num_heads`` must split ``model.dim`` evenly (checked again once an automatic dim resolves)."""
    if model.dim % model.num_heads:
        raise ConfigError(f"model.num_heads: {model.num_heads} does not divide model.dim {model.dim}")
