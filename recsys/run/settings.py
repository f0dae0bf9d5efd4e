"""Every automatic value of a config, decided once: :func:`resolve`.

A config as written (a TOML file, ``--set``, the defaults) leaves some values to the model, the
data or the machine: the keys of :data:`recsys.config.AUTOMATIC`, which hold -1, 0 or ``"auto"``
until then. :func:`resolve` decides every one of them when an experiment is built
(:func:`recsys.run.build_experiment`), from the model's :class:`~recsys.models.spec.Automatic`
values and the :class:`Facts` of the data and the machine, and returns a copy that holds plain
values only and carries :data:`~recsys.config.CONFIG_VERSION`. That copy is what ``recsys train
--dry-run`` prints, what a run saves as ``config.json`` and what everything downstream (the
trainer, its plan, the memory estimate, the evaluator, serving) reads; none of them decides a
value again, and their entry points refuse a config that still holds an automatic one
(:func:`recsys.config.require_resolved`). The resolved copy is frozen (:func:`recsys.config.freeze`:
an assignment to it raises, while a copy of it is a plain config again), and resolving it again
returns an equal one.

The rules, each with the measurement behind it beside its constant in :mod:`recsys.models.spec`:

- ``model.dim``, ``model.dropout``: the spec's, its large-catalogue values from
  :data:`~recsys.models.spec.LARGE_CATALOGUE` items on; ``model.score_cap``: the spec's, or where it
  follows the length, :func:`length_score_cap` of the median training history (:meth:`Facts.typical_length`);
  ``model.hidden``: :data:`~recsys.models.spec.HIDDEN_RATIO` times the width.
- :data:`MODEL_OWNED` (``model.num_heads``, ``model.mixer``, ``model.block``, ``model.filter_alpha``,
  ``model.attention_dropout``, ``model.init``, ``train.lr``, ``train.min_target``): the spec's own
  value, nothing more: sasrec's attention in pre-norm blocks at 1e-3, bsarec's and wearec's
  published blocks and recipe (:mod:`recsys.models.lineage`); ``train.draw``: the spec's under
  last-position training, ``"users"`` under dense training (whose windows ``train.windows`` draws).
- ``train.predict_at``, ``train.negative_readout``, ``train.soft_readout_steps``: the spec's;
  ``train.attention_reg``: the spec's for ``K > 1`` and last-position training, else 0;
  ``train.interest_reg``: the spec's for ``K > 1``, else 0; where it follows the length,
  :func:`length_interest_reg` of the median training history.
- ``train.predict_next``: the spec's where at least :data:`~recsys.models.spec.TIED_ORDER` of a user's
  consecutive clicks share a timestamp (:attr:`Facts.tied_share`), else 1.
- ``train.full_softmax``: the spec's exact softmax below
  :data:`~recsys.models.spec.FUSED_EXACT_SOFTMAX_ITEMS` items where it runs on its fused kernel
  (:func:`fused_exact_softmax`: a CUDA device under bf16 autocast), else below
  :data:`~recsys.models.spec.EXACT_SOFTMAX_ITEMS`; sampled with hard negatives.
- ``train.item_updates``: ``"sparse"`` from :data:`~recsys.models.spec.SPARSE_ITEMS` items on where
  the step samples its negatives, else ``"dense"``.
- ``train.batch_size``: :func:`scaled_batch` of the training targets: :data:`BASE_BATCH` a process
  while an epoch at the global batch of ``BASE_BATCH`` a process is at most :data:`EPOCH_STEPS` steps
  (2.56M targets on one process; taobao's 322k keep 128), else the smallest power of two that
  brings it there, at most :data:`MAX_BATCH` (:data:`MAX_DENSE_BATCH` under dense training, whose
  logits grow as the batch squared): a log of 100M clicks is 575,123 steps an epoch at 128 and
  17,973 at 4,096. The learning rate is not automatic: 1e-3 at every batch, since raising it with the
  batch lost recall at 2,048 and 4,096 (docs/defaults.md, "Batch and learning rate on large logs").
- ``train.num_negatives``: :data:`NEGATIVES_PER_ROW` per row of a batch.
- ``train.weight_decay``: with AdamW, the decay that shrinks the weights by the spec's
  ``epoch_decay`` a pass over the data, ``epoch_decay / (lr * epoch_steps)``, where an epoch is as
  many samples as training targets (:meth:`Facts.epoch_steps`); 0 with plain Adam. The data term
  of the loss is a mean over the samples while a prior's weight should fall as ``1 / samples``: a
  constant per-step decay regularises a large dataset as much as a small one over each step, and
  so far more over its longer run. On taobao the best constant was 0.05, on amazon-beauty 0.2 to
  0.5 (four times more steps per epoch on taobao): both are about 0.15 a pass (docs/defaults.md,
  "Weight decay per epoch").
- ``train.cpu_threads``: :func:`cpu_threads`, the cores other work leaves free when the
  experiment is built (:func:`machine_cores`), at least 1 and at most torch's own default. With
  other jobs on a busy 2-core machine torch's default (every core) trained 292-384 samples/s
  against 2,863-3,236 with one thread: its threads wait for each other at every parallel region,
  where a descheduled one holds up the rest (``benchmarks/cpu_threads.py`` measures it).
- ``eval.objective``: ``recall@max(eval.topn)``; ``eval.exclude_history``: true under
  ``data.split = "leave_one_out"`` (the papers' protocol), else false.
- ``model.cold_scale`` (-1) and ``retrieval.new_item_share`` (-1): 1 and 0 without item features
  (no item is scored without its clicks); with them they stay -1 here and the trainer chooses them
  on validation once the run has trained (:mod:`recsys.train.new_items`), the two settings decided
  after training: they need the trained weights.

What stays ``"auto"`` is not a value waiting to be decided but a policy that acts where it is
used, and nothing else reads it: ``train.device`` (:func:`recsys.device.resolve_device`, the one
place that asks the machine for a GPU; a resumed run may move to another machine),
``train.cuda_graph`` ("capture the step where possible, else eager launches": whether a capture
succeeds is known only by trying it, :mod:`recsys.train.graphs`), ``model.backend`` (each call
sends what the Triton kernel does not cover, by dtype and size, to its PyTorch twin),
``retrieval.backend`` (exact search in torch where the embeddings sit on a GPU or FAISS is not
installed: an index is built and reopened on machines that differ), ``data.format`` and
``data.prepare`` (the reader sniffs the source; a run saves the prepared clicks).
``train.max_steps = 0`` and ``train.eval_every = 0`` are modes, not values: the budget counted in
``train.max_epochs`` (which a resumed run may extend) and the validation cadence that grows with
the run; the plan (:mod:`recsys.train.plan`) turns them into steps and the dry run prints it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from recsys.config import (
    AUTO,
    AUTOMATIC,
    CHOOSE_COLD_SCALE,
    CHOOSE_NEW_ITEM_SHARE,
    CONFIG_VERSION,
    Config,
    ConfigError,
    EvalConfig,
    ModelConfig,
    TrainConfig,
    automatic_keys,
    check_heads,
    freeze,
    is_automatic,
)
from recsys.data.formats import reader_for
from recsys.models.spec import (
    EXACT_SOFTMAX_ITEMS,
    FUSED_EXACT_SOFTMAX_ITEMS,
    HIDDEN_RATIO,
    LARGE_CATALOGUE,
    SPARSE_ITEMS,
    STRICT_SETTINGS,
    TIED_ORDER,
    Automatic,
    ModelSpec,
    spec_for,
    specs,
)
from recsys.retrieval.index import check_factory

if TYPE_CHECKING:
    from recsys.data import Dataset, Split

__all__ = [
    "BASE_BATCH",
    "EPOCH_STEPS",
    "MAX_BATCH",
    "MAX_DENSE_BATCH",
    "MODEL_OWNED",
    "NEGATIVES_PER_ROW",
    "Facts",
    "check",
    "cpu_threads",
    "excludes_history",
    "fused_exact_softmax",
    "length_interest_reg",
    "length_score_cap",
    "machine_cores",
    "objective",
    "resolve",
    "resolve_model",
    "rules",
    "scaled_batch",
    "unresolved",
]

NEGATIVES_PER_ROW = 10  # the automatic train.num_negatives: shared sampled negatives per row of a batch
# the automatic train.batch_size (scaled_batch); the GPU measurements behind it:
# docs/defaults.md, "Batch and learning rate on large logs"
BASE_BATCH = Automatic().batch  # samples a step on each process, on every log whose epoch at this batch is short enough
EPOCH_STEPS = 20_000  # ... at most this many steps (at the global batch of BASE_BATCH a process)
MAX_BATCH = 4096  # the largest automatic batch a process
# ... where every position of a sample is a target (train.predict_at = "all"): a row of up to data.max_len
# targets, each scored against all NEGATIVES_PER_ROW * batch shared negatives, so the logits grow as the batch
# squared times the length (at 4,096 and 50 clicks, 67 GB); at 512, 1 GB
MAX_DENSE_BATCH = 512
# the automatic hinge's weight is the spec's times L / HINGE_LENGTH within [HINGE_FLOOR, 1] (length_interest_reg)
HINGE_LENGTH = 50
HINGE_FLOOR = 0.2
# the automatic train.cpu_threads: what other work keeps busy is read over this long (machine_cores) ...
LOAD_SAMPLE_S = 0.1
# ... and the count is at most torch's own default in this process (its physical cores, or OMP_NUM_THREADS,
# which torchrun sets to 1 for several processes a host), read when recsys is imported, before any run sets it
TORCH_THREADS = torch.get_num_threads()
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit
# the automatic keys that are the model's own value, nothing more: each takes the spec's Automatic field of its name
MODEL_OWNED = (
    "model.num_heads",
    "model.mixer",
    "model.block",
    "model.filter_alpha",
    "model.attention_dropout",
    "model.init",
    "train.lr",
    "train.min_target",
)


@dataclass(frozen=True)
class Facts:
    """What the data and the machine say, as :func:`resolve` reads it.

    Attributes:
        num_items: catalogue size, ids with padding (``num_items - 1`` items).
        tied_share: the share of a user's consecutive clicks that share a timestamp
            (:meth:`recsys.data.Dataset.tied_share`).
        train_lengths: ``train_lengths[n]``: training sequences of ``n`` clicks.
        device: the type of the training device (``"cpu"``, ``"cuda"``).
        world_size: processes training together, each drawing ``train.batch_size`` samples a step.
        cores: the CPU cores this process may run on (:func:`machine_cores`).
        busy_cores: how many of them other work kept busy when the facts were taken.
        torch_threads: torch's own default thread count in this process (:data:`TORCH_THREADS`).
    """

    num_items: int
    tied_share: float
    train_lengths: tuple[int, ...]
    device: str = "cpu"
    world_size: int = 1
    cores: int = 1
    busy_cores: float = 0.0
    torch_threads: int = 1

    @classmethod
    def of(cls, dataset: Dataset, split: Split, device: str | torch.device = "cpu", world_size: int = 1) -> Facts:
        """The facts of ``dataset`` split as ``split``, trained on ``device`` by ``world_size`` processes
        on this machine as it is now."""
        lengths = np.bincount(split.train_lengths)
        cores, busy = machine_cores()
        return cls(
            num_items=dataset.num_items,
            tied_share=dataset.tied_share(),
            train_lengths=tuple(int(n) for n in lengths),
            device=torch.device(device).type,
            world_size=world_size,
            cores=cores,
            busy_cores=busy,
            torch_threads=TORCH_THREADS,
        )

    @classmethod
    def of_lengths(
        cls, lengths: Sequence[int], num_items: int, tied_share: float = 0.0, device: str = "cpu", world_size: int = 1
    ) -> Facts:
        """The facts of training sequences of ``lengths`` clicks (for examples and tests)."""
        counts = np.bincount(np.asarray(lengths, dtype=np.int64), minlength=1)
        return cls(num_items, tied_share, tuple(int(n) for n in counts), device, world_size)

    def typical_length(self, max_len: int) -> int:
        """The median training history in clicks, cut at ``max_len`` (the longest input a model
        reads): how many clicks a typical input offers an attention head to choose from."""
        counts = np.asarray(self.train_lengths, dtype=np.int64)
        if not counts.sum():
            return 1
        median = int(np.searchsorted(np.cumsum(counts), (counts.sum() + 1) // 2))  # lengths count up from 0
        return max(1, min(median, max_len))

    def targets(self, min_target: int) -> int:
        """Training targets: each click with at least ``min_target`` clicks before it."""
        counts = np.asarray(self.train_lengths, dtype=np.int64)
        return int((counts * np.maximum(np.arange(len(counts)) - min_target, 0)).sum())

    def users(self, min_target: int) -> int:
        """Training sequences with at least one target."""
        return int(sum(self.train_lengths[min_target + 1 :]))

    def samples_per_step(self, train: TrainConfig) -> int:
        return train.batch_size * self.world_size

    def epoch_steps(self, train: TrainConfig) -> int:
        """Steps of one epoch, as many samples as training targets (``train.predict_at`` resolved):
        every click with ``train.min_target`` before it, or with one before it under dense
        training, whose sample is a window of up to ``data.max_len`` targets (counted in targets, a
        dense epoch was some 15x fewer steps on MovieLens 100K, which ended dense runs still
        improving and made the automatic decay 15x stronger a step: docs/defaults.md, "Dense
        training")."""
        return max(1, math.ceil(self.targets(min_target(train)) / self.samples_per_step(train)))


def machine_cores() -> tuple[int, float]:
    """``(cores, busy)``: the CPU cores this process may run on (its affinity) and how many of them
    other work keeps busy now.

    On Linux ``busy`` is read from the per-core counters of ``/proc/stat`` over
    :data:`LOAD_SAMPLE_S`, less this process's own CPU time in that while: what other processes
    run now, on these cores only (a container's cpuset, a ``taskset``), and never this process's
    own threads, which a run's thread count is chosen for. Elsewhere it is the 1-minute load average's
    share of these cores (``os.getloadavg``), which lags and counts this process too."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    try:
        before, own = _core_ticks(cpus), os.times()
        time.sleep(LOAD_SAMPLE_S)
        after, own_after = _core_ticks(cpus), os.times()
    except (OSError, ValueError, IndexError):
        try:
            load = os.getloadavg()[0] * len(cpus) / (os.cpu_count() or len(cpus))
        except (OSError, AttributeError):  # no load average on this system: assume none
            load = 0.0
        return len(cpus), min(float(len(cpus)), load)
    (busy, total), (busy_after, total_after) = before, after
    elapsed = max(total_after - total, 1) / len(cpus) / _TICKS_PER_S  # seconds, by the cores' own clocks
    mine = (own_after.user + own_after.system) - (own.user + own.system)
    others = (busy_after - busy) / _TICKS_PER_S / elapsed - mine / elapsed
    return len(cpus), min(float(len(cpus)), max(0.0, others))


def _core_ticks(cpus: Collection[int]) -> tuple[int, int]:
    """``(busy, total)`` clock ticks of the cores ``cpus`` since boot, from ``/proc/stat`` (idle and
    waiting on I/O are idle; guest time is already inside user time)."""
    wanted, busy, total = {f"cpu{c}" for c in cpus}, 0, 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name in wanted:
                ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                busy += sum(ticks) - ticks[3] - ticks[4]
                total += sum(ticks)
                wanted.discard(name)
    if wanted:
        raise ValueError(f"/proc/stat has no line for {sorted(wanted)}")
    return busy, total


def cpu_threads(cores: int, busy: float, torch_threads: int) -> int:
    """The automatic ``train.cpu_threads``: the cores that other work leaves free, ``cores - busy``
    rounded (a core half busy or more counts as taken), at least 1 and at most ``torch_threads``,
    torch's own default. torch's threads wait for each other at the end of every parallel region,
    so one thread that another job deschedules holds up all of them: on a 2-core machine with
    other jobs, torch's default (2 threads) trained at a tenth of one thread's samples/s."""
    return max(1, min(torch_threads, math.floor(cores - busy + 0.5)))


def min_target(train: TrainConfig) -> int:
    """The earliest target position of a training sequence (``train.predict_at`` resolved)."""
    return 1 if train.predict_at == "all" else train.min_target


def fused_exact_softmax(cfg: Config, device: str) -> bool:
    """Whether a run's exact softmax runs on its fused kernel (:func:`recsys.kernels.catalogue_logsumexp`:
    a CUDA ``device`` type under the bf16 autocast of ``train.amp``, kernels not forced to their
    twins), where it costs about what sampling does."""
    return device == "cuda" and cfg.train.amp and cfg.model.backend != "torch"


def objective(ev: EvalConfig) -> str:
    """The validation metric's key in the evaluator's output (``eval.objective``; automatic:
    ``recall@max(topn)``)."""
    return f"recall@{max(ev.topn)}" if is_automatic(Config(eval=ev), "eval.objective") else ev.objective


def excludes_history(cfg: Config) -> bool:
    """Whether the evaluation removes each user's input clicks (``eval.exclude_history``;
    automatic: under ``data.split = "leave_one_out"`` only)."""
    if is_automatic(cfg, "eval.exclude_history"):
        return cfg.data.split == "leave_one_out"
    return bool(cfg.eval.exclude_history)


def length_score_cap(floor: float, typical_length: int) -> float:
    """The score cap for histories of ``typical_length`` clicks: ``max(floor, ln(L) / 2)``, rounded
    to 0.01. Scores capped at ``c`` let one click weigh at most ``e^(2c)`` times another, so at
    ``c = ln(L) / 2`` one click of ``L`` can take about half of a head's attention and no more: a
    fixed cap of 1 (a ratio of 7) made every head of a 50-click input read 21-31 clicks and all
    heads average the same history, while a cap of 2 let each head of a 6-click input settle on
    one click (docs/defaults.md, "Interests that stay distinct")."""
    return max(floor, round(0.5 * math.log(max(typical_length, 1)), 2))


def length_interest_reg(weight: float, typical_length: int) -> float:
    """The cosine hinge's weight for histories of ``typical_length`` clicks: ``weight`` times
    ``L / 50`` within [0.2, 1], rounded to 0.01. Interests read from long histories share more
    clicks and point alike unless parted firmly: on MovieLens 100K's 50-click inputs a weight of
    0.2 left their mean cosine at 0.93 where 1 brought it to 0.70 at more recall, while on Amazon
    Beauty's 6-click histories 0.2 parted them (0.62) at the recall without the hinge and 1 cost
    3-4% (docs/defaults.md, "Interests that stay distinct")."""
    return round(weight * min(1.0, max(HINGE_FLOOR, typical_length / HINGE_LENGTH)), 2)


def scaled_batch(targets: int, world_size: int = 1, most: int = MAX_BATCH, base: int = BASE_BATCH) -> int:
    """The automatic ``train.batch_size`` (a process's) for ``targets`` training targets an epoch
    on ``world_size`` processes: ``base`` (the spec's :attr:`~recsys.models.spec.Automatic.batch`)
    while an epoch at the global batch of ``base * world_size`` is at most :data:`EPOCH_STEPS` steps,
    else the smallest power of two of at least ``targets / (EPOCH_STEPS * world_size)``, at most ``most``."""
    if targets <= EPOCH_STEPS * base * world_size:
        return base
    need = math.ceil(targets / (EPOCH_STEPS * world_size))
    return min(most, 1 << (need - 1).bit_length())


def rules(model: str) -> dict[str, str]:
    """Each automatic key's rule for the model named ``model``, in a line with the spec's values
    (what ``recsys config`` shows beside the key; the module docstring has the rules whole)."""
    auto, several = spec_for(model).automatic, spec_for(model).multi_interest
    large = f"{LARGE_CATALOGUE:,} items"

    def by_size(value: object, large_value: object | None) -> str:
        return f"{value}, {large_value} from {large}" if large_value is not None else f"{value}"

    cap = f"max({auto.score_cap:g}, ln(median history) / 2)" if auto.follows_length else f"{auto.score_cap:g}"
    weight = "" if auto.interest_reg == 1 else f"{auto.interest_reg:g} x "
    reg = f"{weight}median history / {HINGE_LENGTH} within [{HINGE_FLOOR:g}, 1]"
    reg = reg if auto.follows_length else f"{auto.interest_reg:g}"
    owned = {key: repr(getattr(auto, key.split(".")[1])) for key in MODEL_OWNED}
    return {
        **owned,
        "train.draw": f"{auto.draw!r} training the last position, else 'users'",
        "model.dim": by_size(auto.dim, auto.large_dim),
        "model.dropout": by_size(auto.dropout, auto.large_dropout),
        "model.score_cap": cap,
        "model.hidden": f"{HIDDEN_RATIO} x model.dim",
        "train.batch_size": f"{auto.batch} a process; where an epoch would pass {EPOCH_STEPS:,} steps, the power "
        f"of two that keeps it there, at most {MAX_BATCH:,} ({MAX_DENSE_BATCH} training every position)",
        "train.weight_decay": f"shrinks the weights by {auto.epoch_decay:g} an epoch with AdamW (0 with Adam)"
        if auto.epoch_decay
        else "0",
        "train.num_negatives": f"{NEGATIVES_PER_ROW} x the global batch",
        "train.predict_at": f'"{auto.predict_at}"',
        "train.predict_next": f"{auto.predict_next} where {TIED_ORDER:.0%} of consecutive clicks tie in time, else 1"
        if auto.predict_next > 1
        else "1",
        "train.full_softmax": f"exact below {FUSED_EXACT_SOFTMAX_ITEMS:,} items on a GPU, {EXACT_SOFTMAX_ITEMS:,} else"
        if auto.full_softmax
        else "false (sampled)",
        "train.negative_readout": f'"{auto.negative_readout}"',
        "train.attention_reg": f"{auto.attention_reg:g} at K > 1 with last-position training, else 0"
        if several and auto.attention_reg
        else "0",
        "train.interest_reg": f"{reg} at K > 1, else 0" if several and auto.interest_reg else "0",
        "train.soft_readout_steps": f"{auto.soft_readout_steps}",
        "train.item_updates": f'"sparse" from {SPARSE_ITEMS:,} items where negatives are sampled, else "dense"',
        "train.cpu_threads": "the CPU cores other work leaves free when the run starts, at least 1, at most "
        "torch's default",
        "eval.objective": "recall@max(eval.topn)",
        "eval.exclude_history": 'true under data.split = "leave_one_out", else false',
    }


def _set(cfg: Config, key: str, value: object) -> None:
    """Set ``key`` of ``cfg`` to ``value`` where it holds its automatic value."""
    if is_automatic(cfg, key):
        section, leaf = key.split(".")
        setattr(getattr(cfg, section), leaf, value)


def resolve_model(model: ModelConfig, num_items: int, typical_length: int = 0) -> ModelConfig:
    """A copy of ``model`` with its automatic values decided for a catalogue of ``num_items``
    ids (with padding) and training histories of ``typical_length`` clicks (0: unknown, the least
    score cap) and its settings checked: :func:`resolve`'s model half, for building a model on
    its own (:func:`recsys.models.build_model`)."""
    out = _resolved_model(model, num_items, typical_length)
    check(Config(model=out))
    return out


def _resolved_model(model: ModelConfig, num_items: int, typical_length: int) -> ModelConfig:
    """:func:`resolve_model` without the check (:func:`resolve` checks the whole config once)."""
    cfg = Config(model=dataclasses.replace(model))
    auto = spec_for(model.name).automatic
    for key in MODEL_OWNED:
        if key.startswith("model."):
            _set(cfg, key, getattr(auto, key.split(".")[1]))
    large = num_items - 1 >= LARGE_CATALOGUE
    _set(cfg, "model.dim", auto.large_dim if large and auto.large_dim is not None else auto.dim)
    _set(cfg, "model.dropout", auto.large_dropout if large and auto.large_dropout is not None else auto.dropout)
    follows = auto.follows_length and typical_length > 0
    _set(cfg, "model.score_cap", length_score_cap(auto.score_cap, typical_length) if follows else auto.score_cap)
    _set(cfg, "model.hidden", HIDDEN_RATIO * cfg.model.dim)
    check_heads(cfg.model)
    return cfg.model


def resolve(cfg: Config, facts: Facts) -> Config:
    """A frozen copy of ``cfg`` with every automatic value decided for its model on ``facts`` (the
    module docstring gives the rules) and ``config_version`` set: the config an experiment runs
    and saves. Resolving a resolved config returns an equal copy.

    Raises :class:`ConfigError` naming the key for a setting the model does not read or cannot
    do (:func:`check`).
    """
    out = copy.deepcopy(cfg)
    typical = facts.typical_length(out.data.max_len)
    out.model = _resolved_model(out.model, facts.num_items, typical)
    spec, t, n = spec_for(out.model.name), out.train, facts.num_items - 1
    auto = spec.automatic
    if not (out.data.item_features and out.model.use_features):  # no item scored without clicks: nothing to choose
        out.model.cold_scale = 1.0 if out.model.cold_scale == CHOOSE_COLD_SCALE else out.model.cold_scale
        share = out.retrieval.new_item_share
        out.retrieval.new_item_share = 0.0 if share == CHOOSE_NEW_ITEM_SHARE else share
    for key in MODEL_OWNED:
        if key.startswith("train."):
            _set(out, key, getattr(auto, key.split(".")[1]))
    several = spec.multi_interest and out.model.num_interests > 1  # K > 1 interests: a readout, a term between them
    # one interest reads itself out: the readout's warm-up and max-scored negatives do nothing there
    _set(out, "train.soft_readout_steps", auto.soft_readout_steps if several else 0)
    _set(out, "train.predict_at", auto.predict_at if trains_densely(out.model) else "last")
    _set(out, "train.draw", auto.draw if t.predict_at == "last" else "users")  # dense windows: train.windows
    _set(out, "train.negative_readout", auto.negative_readout if several else "readout")
    _set(out, "train.predict_next", auto.predict_next if facts.tied_share >= TIED_ORDER else 1)
    # hard negatives are a sampling proposal: asking for them asks for the sampled softmax
    limit = FUSED_EXACT_SOFTMAX_ITEMS if fused_exact_softmax(out, facts.device) else EXACT_SOFTMAX_ITEMS
    _set(out, "train.full_softmax", auto.full_softmax and t.loss == "softmax" and not t.hard_negatives and n < limit)
    reads_every_row = t.full_softmax is True or bool(t.hard_negatives)  # the exact softmax, the hard proposal
    _set(out, "train.item_updates", "sparse" if not reads_every_row and n >= SPARSE_ITEMS else "dense")
    _set(out, "train.attention_reg", auto.attention_reg if several and t.predict_at == "last" else 0.0)
    parting = length_interest_reg(auto.interest_reg, typical) if auto.follows_length else auto.interest_reg
    _set(out, "train.interest_reg", parting if several else 0.0)
    # the batch follows the targets (predict_at resolved above); then what reads it
    most = MAX_DENSE_BATCH if t.predict_at == "all" else MAX_BATCH
    _set(out, "train.batch_size", scaled_batch(facts.targets(min_target(t)), facts.world_size, most, auto.batch))
    # the processes share one draw of negatives: as many as one process draws at the same global batch
    _set(out, "train.num_negatives", NEGATIVES_PER_ROW * t.batch_size * facts.world_size)
    decay = auto.epoch_decay / (t.lr * facts.epoch_steps(t)) if t.optimizer == "adamw" else 0.0
    _set(out, "train.weight_decay", decay)
    _set(out, "train.cpu_threads", cpu_threads(facts.cores, facts.busy_cores, facts.torch_threads))
    # the evaluation's automatic values follow the config alone; written down so the saved config says them
    _set(out, "eval.objective", objective(out.eval))
    _set(out, "eval.exclude_history", excludes_history(out))
    out.config_version = CONFIG_VERSION
    check(out)
    assert not automatic_keys(out), automatic_keys(out)
    return freeze(out)


def trains_densely(model: ModelConfig) -> bool:
    """Whether ``model`` can train on every position of a window: its spec is dense and its output at
    position ``t`` reads clicks ``<= t`` only (a transformer's frequency filter reads the whole window)."""
    spec = spec_for(model.name)
    mixer = spec.automatic.mixer if model.mixer == AUTOMATIC["model.mixer"] else model.mixer
    return spec.dense and ("mixer" not in spec.settings or mixer == "attention" or model.filter_causal)


def unresolved(cfg: Config) -> list[str]:
    """The keys of ``cfg`` still holding an automatic value (:func:`recsys.config.automatic_keys`)."""
    return automatic_keys(cfg)


def check(cfg: Config) -> None:
    """Refuse, naming the key, a value that the model does not read or cannot do: a switch of
    :data:`~recsys.models.spec.STRICT_SETTINGS` its spec does not list, ``train.attention_reg`` on a
    model without attention scores or with dense training, ``train.interest_reg`` (or a readout
    setting) where there are no K > 1 interests, ``train.predict_at = "all"`` on a model that cannot
    train densely, ``train.item_updates = "sparse"`` or ``"sharded"`` where every item row is read
    each step, a ``retrieval.factory`` FAISS cannot build over the model's width (which validation
    would otherwise meet first), a ``data.format`` that no reader is registered for. Automatic
    values are skipped (they resolve to what fits), so this runs on the config as written, before
    the data is read, and again on the resolved one."""
    if cfg.data.format != AUTO:
        reader_for(cfg.data.format)  # the registered formats are data.format's values
    spec = spec_for(cfg.model.name)
    _check_model_reads(cfg, spec)
    _check_between_interests(cfg, spec)
    _check_training_form(cfg, spec)
    if not is_automatic(cfg, "model.dim"):
        check_factory(cfg.retrieval.factory, cfg.model.dim)


def _check_model_reads(cfg: Config, spec: ModelSpec) -> None:
    """A model switch (:data:`~recsys.models.spec.STRICT_SETTINGS`) set away from its default on a
    model whose spec does not read it."""
    neutral = Automatic()  # what a model-owned switch resolves to on a model that does not read it
    off = dataclasses.replace(ModelConfig(), score_cap=0.0)
    for key in STRICT_SETTINGS:
        value = getattr(cfg.model, key)
        default = getattr(neutral, key) if f"model.{key}" in MODEL_OWNED else getattr(off, key)
        automatic = f"model.{key}" in AUTOMATIC and is_automatic(cfg, f"model.{key}")
        if key not in spec.settings and value != default and not automatic:
            readers = [s.name for s in specs() if key in s.settings]
            raise ConfigError(
                f"model.{key}={value!r} has no effect on {cfg.model.name} (only "
                f"{', '.join(sorted(readers)) or 'no model'} read it); set it to {default!r}"
            )


def _check_between_interests(cfg: Config, spec: ModelSpec) -> None:
    """The terms that act on attention scores or between K > 1 interests, where there are none."""
    t, name, k = cfg.train, cfg.model.name, cfg.model.num_interests
    reg = 0.0 if is_automatic(cfg, "train.attention_reg") else t.attention_reg
    if reg and not spec.self_attentive:
        readers = sorted(s.name for s in specs() if s.self_attentive)
        raise ConfigError(
            f"train.attention_reg={reg:g} has no effect on {name} (only "
            f"{' and '.join(readers)} read their clicks through attention scores); set it to 0"
        )
    if reg and t.predict_at == "all":
        raise ConfigError(
            f"train.attention_reg={reg:g}: the attention regulariser reads one history's scores, "
            'which dense training (train.predict_at="all") does not compute; set it to 0 or train.predict_at="last"'
        )
    if spec.multi_interest and k > 1:
        return
    parting = 0.0 if is_automatic(cfg, "train.interest_reg") else t.interest_reg
    if parting:
        raise ConfigError(
            f"train.interest_reg={parting:g} has no effect on {name} with "
            f"model.num_interests={k} (it separates K > 1 interests); set it to 0"
        )
    readout: dict[str, tuple[object, tuple[object, ...], object]] = {  # one interest reads itself out
        "train.soft_readout_steps": (t.soft_readout_steps, (-1, 0), 0),
        "train.negative_readout": (t.negative_readout, (AUTO, "readout"), "readout"),
    }
    for key, (value, idle, neutral) in readout.items():
        if value not in idle:
            raise ConfigError(
                f"{key}={value!r} has no effect on {name} with model.num_interests="
                f"{k} (it reads out K > 1 interests); set it to {neutral!r}"
            )


def _check_training_form(cfg: Config, spec: ModelSpec) -> None:
    """Dense training where the model cannot, the draw and the loss where they do not apply, and an
    item table form that cannot serve a step reading every row."""
    t = cfg.train
    if t.predict_at == "all" and not spec.dense:
        dense = sorted(s.name for s in specs() if s.dense)
        raise ConfigError(
            f'train.predict_at="all": {cfg.model.name} cannot train on every position of a window '
            f'(models that can: {", ".join(dense)}); use "last" or "auto"'
        )
    if t.predict_at == "all" and not trains_densely(cfg.model):
        raise ConfigError(
            f'train.predict_at="all": model.mixer={cfg.model.mixer!r} reads the whole window (its filter is not '
            'causal), so a position would see the click it predicts; use "last" or "auto", or model.filter_causal=true'
        )
    if t.draw != "users" and not is_automatic(cfg, "train.draw") and t.predict_at == "all":
        raise ConfigError(
            f'train.draw="{t.draw}": dense training windows are drawn by train.windows; it applies to '
            'train.predict_at="last"'
        )
    if t.loss != "softmax" and t.full_softmax is True:
        raise ConfigError(
            f'train.full_softmax = true: applies to train.loss = "softmax" (got {t.loss!r}); set it to "auto"'
        )
    if t.item_updates in ("sparse", "sharded") and (t.full_softmax is True or t.hard_negatives):
        why = "train.full_softmax = true scores" if t.full_softmax is True else "train.hard_negatives draws from"
        raise ConfigError(
            f'train.item_updates="{t.item_updates}": {why} every item row each step; set it to "dense" or "auto"'
        )
