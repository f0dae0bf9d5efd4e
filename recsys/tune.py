"""Hyperparameter search with Optuna (the ``tune`` extra): ``recsys tune``.

:func:`tune` trains trial after trial from a base config, each with values a TPE sampler
proposes from a search space, and prunes a trial whose validation metric (``eval.objective``,
recall@max(topn) by default; reported at every validation through
:func:`recsys.train.trainer.train`'s ``on_validate``) falls below the median
of the earlier trials at the same validation. Trial 0 trains the base config as given, so the
tuned result is never worse than it on the validation users. Everything lives in one folder::

    TUNE/
      study.db        the Optuna study (SQLite): each trial's values, state and validation curve
      trials/NNNN/    each trial's run directory
      best.toml       the best trial's config: the keys that differ from the defaults (data files as absolute paths)
      best-NNNN/      that config retrained from best.toml and tested (a run directory)

Running the same tune again resumes it: finished trials are kept, a trial that was running
when the tune was interrupted (Ctrl-C, the process killed, a full disk, or cut by ``max_minutes``) runs again
with the same values as a new trial, continuing its run directory from the last checkpoint (from
step 0 only when it had none), and ``trials`` counts the finished (complete or pruned) trials of
the whole study. One tune at a time uses a folder (a lock file says so). Every
validation of a running trial prints a line.

The search space is :func:`default_space` for the model, updated by a ``[tune]`` table in a
config file, keyed by config key; the keys between interests (:data:`BETWEEN_INTERESTS`) are set
only in a trial whose model has K > 1 of them::

    [tune]
    "train.lr" = {low = 1e-4, high = 1e-2, log = true}   # a range (ints if both ends are ints; step = ...)
    "model.num_interests" = [1, 2, 4, 8]                  # a choice
    "train.optimizer" = "adamw"                           # a fixed value (also: leave a key out of the search)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import math
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from recsys.config import (
    AUTOMATIC,
    CONFIG_VERSION,
    RENAMED,
    TUNE_TABLE,
    Config,
    ConfigError,
    is_automatic,
    load_config,
    renamed,
    with_values,
)
from recsys.data import IN_MEMORY
from recsys.data.registry import SOURCE_PREFIX
from recsys.extras import install_hint
from recsys.io import DiskFull, atomic_write_text, full_disk
from recsys.models.spec import spec_for
from recsys.run import RunDir
from recsys.run.saved_config import run_config_from_dict
from recsys.run.settings import check, objective
from recsys.train.trainer import train

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    import optuna

__all__ = [
    "Space",
    "TuneResult",
    "default_folder",
    "default_space",
    "open_study",
    "read_tune_tables",
    "trials_table",
    "tune",
]

Log = Callable[[str], None]
STUDY = "study.db"
LOCK = "tune.lock"
TRIALS = "trials"
BEST_CONFIG = "best.toml"
STUDY_NAME = "recsys"


class TrialCut(Exception):
    """A trial stopped by the tune's ``max_minutes`` before its own end: a partial result, which
    must not steer the sampler; its values run again first when the tune resumes."""


# a trial failing with one of these (values that do not fit memory, a bad combination, a
# divergence, the tune's deadline) fails alone
TRIAL_ERRORS = (ValueError, MemoryError, torch.cuda.OutOfMemoryError, TrialCut)

# keys that act between a user's K > 1 interests: a trial sets them only where its model has K > 1 (Optuna's
# define-by-run space), since recsys.run.settings.check refuses a cosine hinge with nothing to part and a
# readout's warm-up or max-scored negatives with one interest, and a margin without a hinge means nothing; a
# search over model.num_interests then never proposes a refused trial
BETWEEN_INTERESTS = (
    "train.interest_reg",
    "train.interest_margin",
    "train.soft_readout_steps",
    "train.negative_readout",
)
REFUSED_AT_ONE = ("train.interest_reg", "train.soft_readout_steps", "train.negative_readout")  # check refuses them

# the searched learning rates as multiples of the base's rate (default_space)
LR_RANGE = (0.3, 3.0)


def default_space(cfg: Config) -> dict[str, Any]:
    """The search space for ``cfg``'s model, in the ``[tune]`` table's format: the shared
    optimisation ranges plus the model spec's own (:attr:`recsys.models.spec.ModelSpec.tune_space`).

    ``train.lr`` ranges over the base's rate (the model's where it is automatic) times
    :data:`LR_RANGE`: 3e-4..3e-3 at sasrec's 1e-3."""
    spec = spec_for(cfg.model.name)
    lr = spec.automatic.lr if is_automatic(cfg, "train.lr") else cfg.train.lr
    space: dict[str, Any] = {
        "train.optimizer": "adamw",
        "train.lr": {"low": _digits(lr * LR_RANGE[0]), "high": _digits(lr * LR_RANGE[1]), "log": True},
        "train.weight_decay": {"low": 1e-2, "high": 1.0, "log": True},
        "model.dim": [64, 128],
        "data.max_len": [10, 20, 50, 100],
    }
    if cfg.train.full_softmax is not True:  # "auto" may sample (and does, once hard negatives are asked for)
        space["train.num_negatives"] = [256, 1024, 4096]
        space["train.hard_negatives"] = [0.0, 0.25, 0.5]
    space.update(spec.tune_space)
    return space


def _digits(x: float) -> float:
    return float(f"{x:.2g}")


def read_tune_tables(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The ``[tune]`` tables of the TOML files ``paths`` merged in order (later files win per key)."""
    table: dict[str, Any] = {}
    for path in map(Path, paths):
        try:
            values = tomllib.loads(path.read_text()).get(TUNE_TABLE, {})
        except (OSError, tomllib.TOMLDecodeError) as err:  # load_config reads the files first and says more
            raise ConfigError(f"{path}: {err}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: [{TUNE_TABLE}] must be a table of config keys")
        table.update(values)
    return table


@dataclass(frozen=True)
class Param:
    """One searched key: a ``choices`` list, or a range ``low``..``high`` (``log`` scale, ``step``)."""

    key: str
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None

    @property
    def integer(self) -> bool:
        return not self.choices and all(isinstance(v, int) for v in (self.low, self.high))

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.choices:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)

    def describe(self) -> str:
        if self.choices:
            return f"{self.key} in {list(self.choices)}"
        return f"{self.key} in [{self.low:g}, {self.high:g}]" + (" (log)" if self.log else "")


@dataclass(frozen=True)
class Space:
    """A search space: searched :class:`Param` s and fixed values, both keyed by config key."""

    params: tuple[Param, ...] = ()
    fixed: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, table: Mapping[str, Any], base: Config, where: str = f"[{TUNE_TABLE}]") -> Space:
        """Parse a ``[tune]``-format table; every end of a range, every choice and every fixed value
        must be a valid value of its key in ``base`` (else :class:`ConfigError` naming it)."""
        params, fixed = [], {}
        for key, spec in table.items():
            if isinstance(spec, dict):
                param = _range(key, spec, where)
                values = [param.low, param.high]
            elif isinstance(spec, list):
                if not spec:
                    raise ConfigError(f"{where} {key!r}: an empty list of choices")
                param, values = Param(key, choices=tuple(spec)), spec
            else:
                param, values = None, [spec]
            for value in values:
                try:
                    with_values(base, {key: value})
                except ConfigError as err:
                    raise ConfigError(f"{where} {key!r} = {spec!r}: {err}") from None
            if param is None:
                fixed[key] = spec
            else:
                params.append(param)
        return cls(tuple(params), fixed)

    def describe(self) -> dict[str, str]:
        """Config key -> how it is searched (a range, the choices) or fixed (``= value``), with
        ``(K > 1)`` where it applies only then (:data:`BETWEEN_INTERESTS`)."""
        described = {**{p.key: p.describe() for p in self.params}, **{k: f"{k} = {v!r}" for k, v in self.fixed.items()}}
        return {k: v + (" (K > 1)" if k in BETWEEN_INTERESTS else "") for k, v in described.items()}

    def suggest(self, trial: optuna.Trial, base: Config) -> dict[str, Any]:
        """The fixed values and one proposal for every searched key, those of :data:`BETWEEN_INTERESTS`
        only where the trial's model (``base`` with the other values) has K > 1 interests. At K = 1 a
        hinge or readout setting that ``base`` sets is left to the model, which has none there."""
        values = {**self.fixed, **{p.key: p.suggest(trial) for p in self.params if p.key not in BETWEEN_INTERESTS}}
        name = values.get("model.name", base.model.name)
        if spec_for(name).multi_interest and values.get("model.num_interests", base.model.num_interests) > 1:
            return values | {p.key: p.suggest(trial) for p in self.params if p.key in BETWEEN_INTERESTS}
        values = {k: v for k, v in values.items() if k not in BETWEEN_INTERESTS}
        for key in REFUSED_AT_ONE:
            if not is_automatic(base, key):
                values[key] = AUTOMATIC[key]
        return values


def _range(key: str, spec: dict[str, Any], where: str) -> Param:
    unknown = set(spec) - {"low", "high", "log", "step"}
    if unknown or not {"low", "high"} <= set(spec):
        raise ConfigError(
            f"{where} {key!r}: a range is {{low = ..., high = ..., log = true|false, step = ...}}, got {spec!r}"
        )
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) or not low < high:
        raise ConfigError(f"{where} {key!r}: need numbers low < high, got {spec!r}")
    if not isinstance(log, bool) or (log and low <= 0) or (log and step is not None):
        raise ConfigError(f"{where} {key!r}: log = true needs low > 0 and no step, got {spec!r}")
    return Param(key, low=low, high=high, log=log, step=step)


def default_folder(cfg: Config) -> Path:
    """``<output_dir>/tune-<model>-<data file stem>``: the same command finds its tune again."""
    return Path(cfg.output_dir) / f"tune-{cfg.model.name}-{Path(cfg.data.source).stem or 'data'}"


def open_study(folder: str | Path, *, seed: int = 0, pruner: optuna.pruners.BasePruner | None = None) -> optuna.Study:
    """The study stored in ``folder`` (created if missing): maximises the validation metric with a
    seeded TPE sampler; the default pruner is the median rule from the second validation on."""
    optuna = _optuna()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{folder / STUDY}", engine_kwargs={"connect_args": {"timeout": 60}}
    )  # several processes
    return optuna.create_study(
        study_name=STUDY_NAME,
        storage=storage,
        direction="maximize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=5),
        pruner=pruner or optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
    )


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ImportError(f"recsys tune needs optuna: {install_hint('tune')}") from None
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial's reason is on its own line
    return optuna


@dataclass
class TuneResult:
    """What :func:`tune` returns."""

    folder: Path
    trials: list[Any]  # optuna FrozenTrials, by number
    key: str  # the validation metric, e.g. "recall@50"
    best_trial: int
    best_valid: float
    best_config: Path  # best.toml
    run_dir: str  # the best config retrained ("" when max_minutes left no time for it)
    test_metrics: dict[str, float]


class _Objective:
    """One trial: the base config with the trial's values, trained with pruning at each validation."""

    def __init__(self, folder: Path, base: Config, space: Space, deadline: float, threads: int, log: Log):
        self.folder, self.base, self.space, self.deadline, self.threads = folder, base, space, deadline, threads
        self.log = log

    def __call__(self, trial: optuna.Trial) -> float:
        values = {} if trial.user_attrs.get("base") else self.space.suggest(trial, self.base)
        trial.set_user_attr("values", values)
        try:
            return self._train(trial, with_values(self.base, values))
        except TRIAL_ERRORS as err:
            trial.set_user_attr("error", (str(err).strip() or type(err).__name__).splitlines()[0])
            raise
        except (KeyboardInterrupt, DiskFull):  # optuna records the trial as failed; its values run first on resume
            _requeue(trial.study, trial, trial.user_attrs.get("run_dir"))
            raise

    def _train(self, trial: optuna.Trial, cfg: Config) -> float:
        """Train ``cfg`` into the trial's run directory; its best validation ``eval.objective``."""
        optuna = _optuna()
        if self.threads and is_automatic(cfg, "train.cpu_threads"):  # the jobs share the cores
            cfg.train.cpu_threads = self.threads
        cut_by_deadline = _bound_by(cfg, self.deadline)
        key = objective(cfg.eval)
        resume_from = trial.user_attrs.get("resume_from") or ""
        resume = bool(resume_from) and Path(resume_from).is_dir() and RunDir(resume_from).has_checkpoint()
        run_dir = Path(resume_from) if resume else self.folder / TRIALS / f"{trial.number:04d}"
        if resume:
            self.log(f"trial {trial.number}: resuming {run_dir} from its last checkpoint, {_params(trial)}")
        else:
            self.log(f"trial {trial.number}: training {_params(trial)}")

        def report(step: int, metrics: dict[str, float]) -> None:
            self.log(f"trial {trial.number} @ step {step}: valid {key} {metrics[key]:.4f}")
            # the validation's ordinal in the run (its row is written), counting those before a resume
            ordinal = sum(1 for r in RunDir(run_dir).read_metrics() if r.get("split") == "valid") - 1
            trial.report(metrics[key], ordinal)
            if trial.should_prune():
                raise optuna.TrialPruned(f"{key} {metrics[key]:.4f} at step {step}")

        trial.set_user_attr("run_dir", str(run_dir))
        result = train(cfg, run_dir=run_dir, resume=resume, log=lambda line: None, on_validate=report)
        if result.out_of_time and cut_by_deadline:
            _requeue(trial.study, trial, str(run_dir))
            raise TrialCut(
                f"stopped by the tune's max_minutes at step {result.steps} (valid {key} "
                f"{result.best_valid:.4f} so far); it runs again first when the tune resumes"
            )
        return result.best_valid


def _bound_by(cfg: Config, deadline: float) -> bool:
    """Lower ``cfg``'s ``train.max_minutes`` (in place) to the time left before ``deadline``
    (``time.time()`` seconds); True when the deadline, not the config's own budget, is the bound."""
    if deadline == math.inf:
        return False
    left = max((deadline - time.time()) / 60, 1e-3)
    if 0 < cfg.train.max_minutes <= left:
        return False
    cfg.train.max_minutes = left
    return True


def _requeue(study: optuna.Study, trial: optuna.Trial | optuna.trial.FrozenTrial, run_dir: str | None) -> None:
    """Queue ``trial``'s values (or the base config) to run again as a new trial, continuing
    ``run_dir`` (its run directory) from its last checkpoint when it has one."""
    attrs: dict[str, Any] = {"base": True} if trial.user_attrs.get("base") else {}
    if run_dir and Path(run_dir).is_dir() and RunDir(run_dir).has_checkpoint():
        attrs["resume_from"] = run_dir
    study.enqueue_trial({} if attrs.get("base") else trial.params, user_attrs=attrs or None)


def _value(trial: optuna.trial.FrozenTrial) -> float:
    """A completed trial's objective value (optuna sets it on completion)."""
    assert trial.value is not None
    return trial.value


def _log_trial(log: Log, trial: optuna.trial.FrozenTrial) -> None:
    """One line for a finished trial (and its error, if it failed)."""
    value = trial.value if trial.value is not None else _last_value(trial)
    error = trial.user_attrs.get("error")
    log(
        f"trial {trial.number}: {trial.state.name.lower()}  valid {_fmt(value)}  {_params(trial)}"
        + (f"\n  {error}" if error else "")
    )


def _optimize(
    folder: Path, base: Config, space: Space, trials: int, deadline: float, threads: int, seed: int, log: Log
) -> None:
    """Run ``trials`` trials, or fewer when the deadline passes."""
    states = _optuna().trial.TrialState
    study = open_study(folder, seed=seed + 1000 * len(open_study(folder).trials))  # fresh proposals on a resume

    def report(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        _log_trial(log, trial)
        if trial.state == states.FAIL and trial.user_attrs.get("base"):
            study.stop()  # the base config itself does not train: no trial will

    study.optimize(
        _Objective(folder, base, space, deadline, threads, log),
        n_trials=trials,
        timeout=None if deadline == math.inf else max(deadline - time.time(), 0.0),
        callbacks=[report],
        catch=TRIAL_ERRORS,
    )


def _run_claimed(
    folder: Path, base: Config, space: Space, claimed: list[optuna.Trial], deadline: float, threads: int, log: Log
) -> None:
    """Train trials already taken from the queue (``study.ask()``) and record their outcome."""
    optuna = _optuna()
    objective = _Objective(folder, base, space, deadline, threads, log)
    for trial in claimed:
        try:
            frozen = trial.study.tell(trial, objective(trial))
        except optuna.TrialPruned:
            frozen = trial.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        except TRIAL_ERRORS:
            frozen = trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        except (KeyboardInterrupt, DiskFull):  # the objective queued its values again; this attempt failed
            trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        _log_trial(log, frozen)


def _work(folder: Path, base: Config, space: Space, trials: int, deadline: float, threads: int, seed: int) -> None:
    """One worker process of ``--jobs``: prints its trials' lines to the shared stdout."""
    _optimize(folder, base, space, trials, deadline, threads, seed, lambda line: print(line, flush=True))


def _prepare(folder: Path, base: Config, space: Space, trials: int, log: Log) -> tuple[int, Config]:
    """Create or reopen the study; how many trials are missing from ``trials`` finished ones, and
    the base config its trials train from (:func:`_study_base`). A new study queues the base config
    as trial 0; a reopened one must have the same base config and search space (a study saved
    without its space takes this one; keys saved under an old name count under their new one), and
    a trial left running by an interrupted tune is queued again."""
    optuna = _optuna()
    study = open_study(folder)
    searched, saved_space = space.describe(), study.user_attrs.get("space")
    if saved_space is not None:
        saved_space = {RENAMED.get(k, k): v.replace(k, RENAMED.get(k, k), 1) for k, v in saved_space.items()}
    if saved_space is None:
        study.set_user_attr("space", searched)
    elif saved_space != searched:
        diff = sorted(k for k in searched.keys() | saved_space.keys() if searched.get(k) != saved_space.get(k))
        raise ConfigError(
            f"{folder} holds a tune over another search space (differs in {', '.join(diff)}); "
            "resume with the same space ([tune] table and recsys version), or tune into another --out"
        )
    saved = study.user_attrs.get("base_config")
    if saved is None:
        study.set_user_attr("base_config", base.to_dict())
        study.enqueue_trial({}, user_attrs={"base": True})
    else:
        base = _study_base(folder, saved, base, log)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        log(f"trial {trial.number} was interrupted; it runs again as a new trial")
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        _requeue(study, trial, trial.user_attrs.get("run_dir"))
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return max(trials - len(study.get_trials(deepcopy=False, states=finished)), 0), base


def _study_base(folder: Path, saved: dict[str, Any], base: Config, log: Log) -> Config:
    """The base config of a reopened study whose saved one is ``saved``: ``base`` (the config given
    now) where the two agree, else a :class:`ConfigError` naming the keys that differ.

    A study saved by an older recsys lacks the keys added since, and one saved before the settings
    resolver (no ``config_version``) holds its base partly resolved by the rules of then, some keys
    under old names. Its trials trained on that config, so its later ones do too: it is read as a
    saved run's config is (:func:`recsys.run.saved_config.run_config_from_dict`: the values in
    force then fill the missing keys, and it is written in today's format), and only the keys it
    holds must agree with ``base``, less those that ``base`` leaves automatic and the old study decided."""
    try:
        study_base = run_config_from_dict(saved)
        study_base.config_version = CONFIG_VERSION
        check(study_base)
    except ConfigError as err:
        raise ConfigError(
            f"{folder} holds a tune saved by an older recsys whose base config no longer loads ({err}); "
            "tune into another --out"
        ) from None
    held, then, now = _flat(renamed(saved, warn=False)), _flat(study_base.to_dict()), _flat(base.to_dict())
    decided = "config_version" not in saved  # its automatic values were decided when it was saved
    differs = [
        k
        for k, v in now.items()
        if k in held and then[k] != v and not (decided and k in AUTOMATIC and is_automatic(base, k))
    ]
    if differs:
        raise ConfigError(
            f"{folder} holds a tune of another config (differs in {', '.join(differs)}); "
            "resume with the same --config/--set/--data/--model, or tune into another --out"
        )
    if then == now:
        return base
    log(f"{folder} was saved by an older recsys: its trials go on from its saved base config, as trained then")
    return study_base


def _flat(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A nested config dict as ``{"section.key": value}`` (top-level values under their own name)."""
    return {
        f"{s}.{k}" if isinstance(v, Mapping) else s: leaf
        for s, v in tree.items()
        for k, leaf in (v.items() if isinstance(v, Mapping) else [(s, v)])
    }


@contextlib.contextmanager
def _only_tune_of(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock (released when the process ends, however it ends)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{folder}: another recsys tune is running in this folder") from None
        yield


def tune(
    cfg: Config,
    folder: str | Path | None = None,
    *,
    trials: int = 20,
    max_minutes: float = 0.0,
    jobs: int = 1,
    space: Mapping[str, Any] | None = None,
    log: Log = print,
) -> TuneResult:
    """Search hyperparameters for ``cfg``, write the best config, retrain it and test it.

    Args:
        cfg: the base config (its model, data and every key the search leaves alone).
        folder: the tune folder (default :func:`default_folder`); an existing one is resumed.
        trials: finished trials the study should hold (complete or pruned, over all runs of it).
        max_minutes: wall-clock budget of this call, the retrain included (0: none). A trial
            running at the limit stops there (``train.max_minutes``) and is recorded as failed
            (a partial curve must not steer the sampler), its values queued to run first when
            the tune resumes; the best config is retrained only when the time left covers what
            its trial took (else ``run_dir`` is ``""`` and ``test_metrics`` empty).
        jobs: trials trained at once, each in its own process; on the CPU each gets
            ``cores // jobs`` torch threads unless ``train.cpu_threads`` is set.
        space: a ``[tune]``-format table updating :func:`default_space`.
        log: where progress lines go.
    """
    if trials <= 0 or jobs <= 0 or max_minutes < 0:
        raise ValueError(f"need trials > 0, jobs > 0 and max_minutes >= 0, got {trials}, {jobs}, {max_minutes}")
    if not spec_for(cfg.model.name).trainable:
        raise ConfigError(f"model.name: {cfg.model.name} has nothing to train or tune")
    _optuna()  # fails here, naming the extra, when optuna is missing
    check(cfg)  # the study keeps the config as written (each trial's run decides its automatic values)
    folder = Path(folder) if folder is not None else default_folder(cfg)
    parsed = Space.parse({**default_space(cfg), **(space or {})}, cfg)
    log(f"tune folder: {folder}; searching " + "; ".join(parsed.describe().values()))
    with _only_tune_of(folder):
        try:
            return _tune(cfg, folder, parsed, trials, max_minutes, jobs, log)
        except BaseException as err:  # say how to go on: the same tune resumes (not `recsys train --resume` a trial)
            resumes = f"running the same recsys tune again (folder {folder}) resumes it"
            full = full_disk(err, folder, f"free some space; {resumes}")
            if full is not None:
                raise full from err
            if isinstance(err, KeyboardInterrupt):
                raise KeyboardInterrupt(resumes) from err
            raise


def _tune(cfg: Config, folder: Path, parsed: Space, trials: int, max_minutes: float, jobs: int, log: Log) -> TuneResult:
    states = _optuna().trial.TrialState
    missing, cfg = _prepare(folder, cfg, parsed, trials, log)
    deadline = time.time() + 60 * max_minutes if max_minutes else math.inf
    claimed: list[optuna.Trial] = []
    if jobs > 1:  # the queued trials (the base config, re-queued interrupted ones) are taken here before the
        # workers start (two processes can pop the same queued trial from the SQLite study) and run in
        # this process, which then trains its share of the rest, beside jobs - 1 worker processes
        study = open_study(folder)
        queued = len(study.get_trials(deepcopy=False, states=(states.WAITING,)))
        claimed = [study.ask() for _ in range(min(queued, missing))]
        missing -= len(claimed)
    shares = [missing // jobs + (i < missing % jobs) for i in range(jobs)]  # slot 0: this process
    threads = max(1, len(os.sched_getaffinity(0)) // jobs) if jobs > 1 else 0
    if jobs == 1:
        if shares[0]:
            _optimize(folder, cfg, parsed, shares[0], deadline, 0, cfg.train.seed, log)
    else:
        with concurrent.futures.ProcessPoolExecutor(jobs - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [
                pool.submit(_work, folder, cfg, parsed, n, deadline, threads, cfg.train.seed + i)
                for i, n in enumerate(shares)
                if i and n
            ]
            _run_claimed(folder, cfg, parsed, claimed, deadline, threads, log)
            if shares[0]:
                _optimize(folder, cfg, parsed, shares[0], deadline, threads, cfg.train.seed, log)
            for future in futures:
                future.result()

    study = open_study(folder)
    done = [t for t in study.get_trials() if t.state == states.COMPLETE]
    if not done:
        raise ValueError(f"{folder}: no trial has completed yet (failed, pruned or interrupted: see the trial lines)")
    best = max(done, key=_value)
    best_cfg = _absolute_paths(with_values(cfg, best.user_attrs["values"]))
    path = folder / BEST_CONFIG
    atomic_write_text(
        path,
        f"# recsys tune: trial {best.number} of {folder}, valid {objective(cfg.eval)} {best.value:.4f}\n"
        + best_cfg.to_toml(base=load_config()),
    )
    assert best.datetime_complete is not None and best.datetime_start is not None  # a completed trial's
    took = (best.datetime_complete - best.datetime_start).total_seconds()
    run_dir, test = _retrain(path, folder / f"best-{best.number:04d}", deadline, took, log)
    return TuneResult(
        folder=folder,
        trials=study.get_trials(),
        key=objective(cfg.eval),
        best_trial=best.number,
        best_valid=_value(best),
        best_config=path,
        run_dir=run_dir,
        test_metrics=test,
    )


def _absolute_paths(cfg: Config) -> Config:
    """``cfg`` with a relative ``data.source``, ``data.categories``, ``data.item_features`` or
    ``data.held_out_items`` file made absolute, so the written config trains from any folder
    (``synthetic`` and ``dataset:NAME/...`` stay)."""
    paths = {
        f"data.{key}": os.path.abspath(value)
        for key in ("source", "categories", "item_features", "held_out_items")
        if (value := getattr(cfg.data, key))
        and value != "synthetic"
        and not value.startswith(SOURCE_PREFIX)
        and value != IN_MEMORY
        and not os.path.isabs(value)
    }
    return with_values(cfg, paths) if paths else cfg


def _retrain(config: Path, run_dir: Path, deadline: float, took_s: float, log: Log) -> tuple[str, dict[str, float]]:
    """Train the config file ``config`` into ``run_dir`` and test it (kept if already done),
    within ``deadline``: when less time is left than its trial took (``took_s``), it is skipped
    (``("", {})``) with a line saying how to run it."""
    if run_dir.is_dir():
        try:
            return str(run_dir), RunDir(run_dir).read_test_metrics()
        except FileNotFoundError:
            shutil.rmtree(run_dir)  # an interrupted retrain
    left = deadline - time.time()
    if left < took_s:
        log(
            f"the best config is not retrained: {max(left, 0):.0f}s of the tune's max_minutes are left and its "
            f"trial took {took_s:.0f}s; `recsys train --config {config}` retrains and tests it"
        )
        return "", {}
    cfg = load_config(config)
    _bound_by(cfg, deadline)
    log(f"retraining the best config ({config}) into {run_dir}")
    result = train(cfg, run_dir=run_dir, log=log)
    return result.run_dir, result.test_metrics


def _last_value(trial: Any) -> float | None:
    values = trial.intermediate_values
    return values[max(values)] if values else None


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _params(trial: Any) -> str:
    if trial.user_attrs.get("base"):
        return "(the base config)"
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())


def trials_table(result: TuneResult) -> str:
    """A Markdown table of every trial: number, state, validation metric (a pruned trial's last
    reported value), and its values."""
    lines = [f"| trial | state | valid {result.key} | params |", "|---:|---|---:|---|"]
    for t in result.trials:
        value = t.value if t.value is not None else _last_value(t)
        mark = " (best)" if t.number == result.best_trial else ""
        lines.append(f"| {t.number} | {t.state.name.lower()}{mark} | {_fmt(value)} | {_params(t)} |")
    return "\n".join(lines)
