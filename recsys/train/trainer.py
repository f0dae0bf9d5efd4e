"""A whole run: :func:`train` reads and splits the data, builds the model, opens the run directory,
optimises (:mod:`recsys.train.loop`, one :class:`~recsys.train.step.TrainStep` a step), and tests
the best weights; :func:`dry_run` shows what a run would do without running it.

One call runs a whole experiment from a :class:`~recsys.config.Config`: validate on the valid
users (``eval.objective``, Recall@max(topn) by default, with the evaluator) on the cadence of
:mod:`recsys.train.plan`, keep the best weights, stop early after ``train.patience`` validations
without improvement (or at the step budget, or where what is left of the ``train.max_minutes``
wall-clock budget of the whole call covers only one last validation and the test), and finally
evaluate the best weights on the test users. Everything lands in a self-contained run directory
(see :mod:`recsys.train.checkpoint`).

The hot path never syncs the host: losses accumulate on the device and are read every
``train.log_every`` steps; batches are built by vectorised numpy and copied from pinned memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from recsys.config import Config, ConfigError, automatic_keys, freeze
from recsys.data.split import EvalSet, Split
from recsys.data.synthetic import planted_for
from recsys.evaluate.diagnostics import health_with_config
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.io import full_disk
from recsys.run import Experiment, RunDir, build_experiment, new_run_dir, unfinished_runs
from recsys.text import count
from recsys.train import distributed
from recsys.train.graphs import GraphPlan, launch_line, plan_graph
from recsys.train.loop import Loop, LoopState, OnValidate, optimise
from recsys.train.losses import (
    loss_names,
)
from recsys.train.memory import check_fits
from recsys.train.new_items import choose_for_new_items
from recsys.train.plan import plan_training
from recsys.train.report import opening_lines
from recsys.train.step import Log
from recsys.train.tracking import track_metrics
from recsys.train.warm_start import WarmStart, follow_model, open_earlier, warm_start

if TYPE_CHECKING:
    import pandas as pd

    from recsys.data import Dataset


@dataclass
class TrainResult:
    """What :func:`train` returns: where the run lives and its final numbers."""

    run_dir: str
    steps: int
    best_step: int
    best_valid: float
    test_metrics: dict[str, float]
    samples_per_s: float
    wall_s: float
    targets_per_s: float = 0.0  # training targets a second: (position, following click) pairs, masked ones not counted
    cuda_graph: bool = False  # the training steps ran as one CUDA graph each (train.cuda_graph)
    out_of_time: bool = False  # train.max_minutes stopped the run (before its plateau stop or step budget)


def train(
    cfg: Config,
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    log: Log = print,
    clicks: pd.DataFrame | None = None,
    progress: bool = False,
    on_validate: OnValidate | None = None,
    init_from: str | Path | None = None,
) -> TrainResult:
    """Run a whole experiment (train, validate, early-stop, test). See the module docstring.

    Args:
        cfg: the config as written; its automatic values are decided once the data is read
            (:func:`recsys.run.build_experiment`), and the resolved copy is saved into the run directory.
        run_dir: where to write; default a new folder under ``cfg.output_dir``.
        resume: continue from ``run_dir``'s last checkpoint (on the dataset saved with it); with
            the same seed the result equals an uninterrupted run.
        log: where progress lines go.
        clicks: a click table to train on instead of ``cfg.data.source`` (see
            :func:`recsys.data.load_dataset`).
        progress: progress bars while preparing the data and over each validation's and the
            test's users (on a terminal).
        on_validate: called as ``on_validate(step, metrics)`` after every validation (its row
            and checkpoint already written); an exception it raises stops training and leaves
            ``train`` (e.g. ``optuna.TrialPruned`` from :mod:`recsys.tune`).
        init_from: a trained run directory to start from (a warm start, :mod:`recsys.train.warm_start`):
            this run's model starts from its best weights, the network by name and the item rows
            by raw id, with a fresh optimiser; the run directory records it (``init_from.json``).
    """
    if resume and run_dir is None:
        raise ValueError("--resume needs the run directory to continue")
    if resume and init_from is not None:
        raise ValueError("--init-from starts a new run from another run's weights; --resume continues a run: use one")
    dist = distributed.setup_distributed(cfg.train.device, graphs=cfg.train.cuda_graph is not False)
    torch.manual_seed(cfg.train.seed + dist.rank)
    t0 = time.perf_counter()
    rd = _reopened(run_dir, dist) if resume and run_dir is not None else None  # (resume without run_dir raised above)
    # resumed on another number of processes: config.json gets the new per-process batch
    kept = _keep_global_batch(cfg, rd.checkpoint_entry("world_size"), dist.world_size, log) if rd else cfg
    cfg, rebatched = kept, kept is not cfg
    dataset = rd.load_dataset() if rd else None
    exp, graph, origin = _prepare(cfg, dist, dataset=dataset, clicks=clicks, progress=progress, init_from=init_from)
    cfg = exp.cfg  # every value resolved
    torch.set_num_threads(cfg.train.cpu_threads)
    exp.model.to(dist.device)
    created = rd is None and (run_dir is None or not Path(run_dir).exists())
    rd = rd or _new_run_dir(cfg, run_dir, dist)
    log(f"run directory: {rd.path}")
    if rebatched and dist.is_main:
        rd.save_config(cfg)
    try:
        return _run(exp, rd, dist, resume, t0, log, on_validate, progress=progress, graph=graph, origin=origin)
    except BaseException as err:
        _stopped(err, rd, dist, created, log)
        raise
    finally:
        if dist.is_main:
            rd.release()


def _reopened(run_dir: str | Path, dist: distributed.DistInfo) -> RunDir:
    """The run directory a resume continues: it must hold a checkpoint, and rank 0 claims it (a run
    still training elsewhere is not resumed under it)."""
    rd = RunDir(run_dir)
    rd.require_checkpoint()
    if dist.is_main:
        rd.claim()
    return rd


def _new_run_dir(cfg: Config, run_dir: str | Path | None, dist: distributed.DistInfo) -> RunDir:
    """The run's new folder: ``run_dir``, or a new one under ``cfg.output_dir`` (beside which an
    unfinished run of the same config is mentioned); rank 0 makes (and claims) it, and under DDP
    the other ranks open the same one."""
    if run_dir is None and not cfg.name and dist.is_main:
        _mention_unfinished(cfg)
    path = None
    if dist.is_main:
        if run_dir is not None:
            explicit = RunDir.create(run_dir)
            explicit.claim()
            path = explicit.path
        else:
            path = new_run_dir(cfg.output_dir, cfg.name, model=cfg.model.name, dataset=_data_name(cfg))
    path = distributed.broadcast_object(path)
    assert path is not None  # rank 0's folder
    return RunDir(path)


def _stopped(err: BaseException, rd: RunDir, dist: distributed.DistInfo, created: bool, log: Log) -> None:
    """A run that raised ``err``: remove a folder this call created with nothing to resume in it,
    and raise what says in one line how to go on (a lost rank, a full disk, an interrupt with a
    checkpoint); else return, and the caller re-raises ``err``."""
    failure = distributed.rank_failure(err)
    if dist.is_main and created and not rd.has_checkpoint():  # a folder this call created, with nothing to resume
        shutil.rmtree(rd.path, ignore_errors=True)
        log(f"removed {rd.path}: the run stopped before its first checkpoint, so there is nothing to resume")
    resumes = rd.resume_hint() if rd.has_checkpoint() else None
    if failure is not None:
        raise distributed.RankFailure(f"{failure}; {resumes or 'there was no checkpoint yet'}") from err
    advice = f"free some space; {resumes}" if resumes else "free some space and start the run again"
    full = full_disk(err, rd.path, advice)  # one line naming the file, and how to go on
    if full is not None:
        raise full from err
    if isinstance(err, KeyboardInterrupt) and resumes:
        raise KeyboardInterrupt(resumes) from err


def _mention_unfinished(cfg: Config) -> None:
    """Warn (one line) when an unnamed run of ``cfg`` (resolved) stopped before its end under
    ``cfg.output_dir`` (e.g. killed): the new run starts beside it, and the line says how to resume it."""
    found = unfinished_runs(cfg.output_dir, cfg, model=cfg.model.name, dataset=_data_name(cfg))
    if found:
        others = f" (and {len(found) - 1} older)" if len(found) > 1 else ""
        warnings.warn(
            f"{found[0].path}{others} holds a run of this config that stopped before its end; "
            f"{found[0].resume_hint()} (this starts a new run)",
            stacklevel=3,
        )


def _keep_global_batch(cfg: Config, saved: int | None, world_size: int, log: Log) -> Config:
    """``cfg`` for a run resumed on ``world_size`` processes from a checkpoint of ``saved``: the
    same global batch (``train.batch_size`` each × processes) and the same number of shared
    negatives, so the run goes on as it would have on the processes it started with (to float
    rounding: the ranks' gradients are summed in another order; the learning rate, saved or
    following the global batch, stays too). ``saved`` None (a checkpoint that does not record it)
    or equal: ``cfg`` unchanged.
    An automatic ``train.batch_size`` (a config as written, not the run's saved one) is refused:
    the rule would decide it anew for ``world_size`` processes."""
    if saved is None or saved == world_size:
        return cfg
    if "train.batch_size" in automatic_keys(cfg):
        raise ValueError(
            f"train.batch_size: automatic in the config given; a run trained on {_processes(saved)} resumes on "
            f"{_processes(world_size)} at its global batch from its saved config (RunDir(run).read_config(), "
            "as recsys train --resume reads it)"
        )
    t = cfg.train
    total = t.batch_size * saved
    if total % world_size:
        raise ValueError(
            f"train.batch_size: the run trained on {_processes(saved)} at {t.batch_size} each (a global batch of "
            f"{total}), which {_processes(world_size)} cannot share; resume on a number of processes dividing it"
        )
    each = total // world_size
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(t, batch_size=each))  # num_negatives as resolved
    log(
        f"resumed on {_processes(world_size)} (trained on {saved}): train.batch_size {t.batch_size} -> "
        f"{each} each, the same global batch of {total}"
    )
    return cfg


def _processes(n: int) -> str:
    return count(n, "process", "processes")


def _prepare(
    cfg: Config,
    dist: distributed.DistInfo,
    *,
    dataset: Dataset | None = None,
    clicks: pd.DataFrame | None = None,
    progress: bool = False,
    init_from: str | Path | None = None,
) -> tuple[Experiment, GraphPlan, WarmStart | None]:
    """The experiment a run on ``dist`` trains, with every automatic value of its config decided
    in ``exp.cfg`` for the data and ``dist``'s device and processes (:func:`recsys.run.build_experiment`,
    which checks the config as written before reading the data, and resolved), whether its step
    is captured as a CUDA graph (:func:`~recsys.train.graphs.plan_graph`, made here once a run), and
    with ``init_from`` the warm start its model's weights came from (:mod:`recsys.train.warm_start`).
    Both :func:`train` and :func:`dry_run` go through here, so a dry run shows what the run uses.

    Raises before any memory is taken where ``train.cuda_graph = true`` cannot capture on this
    device, the model does not fit (:func:`~recsys.train.memory.check_fits`), or the split
    leaves no train, valid or test users."""
    if cfg.train.loss not in loss_names():
        raise ConfigError(f"train.loss: unknown loss {cfg.train.loss!r}; known: {', '.join(loss_names())}")
    graph = plan_graph(cfg, dist.device, dist.world_size)  # train.cuda_graph = true that cannot: fail now
    earlier = open_earlier(init_from) if init_from is not None else None
    if earlier is not None:
        cfg = follow_model(cfg, earlier.cfg)
    exp = build_experiment(
        cfg,
        dataset=dataset,
        clicks=clicks,
        progress=progress,
        check_memory=functools.partial(check_fits, device=dist.device, step_kept=graph[0], world_size=dist.world_size),
        device=dist.device,
        world_size=dist.world_size,
    )
    _check_split(exp.dataset, exp.split)
    return exp, graph, warm_start(exp, earlier) if earlier is not None else None


def dry_run(
    cfg: Config,
    *,
    clicks: pd.DataFrame | None = None,
    progress: bool = False,
    log: Log = print,
    init_from: str | Path | None = None,
) -> Config:
    """What :func:`train` would run, without training or writing a run directory: reads and
    prepares the data, builds the model, logs the lines the run would open its log with (data,
    model, validation, plan, and how the step would launch) and returns the resolved config
    the run would save. ``clicks``, ``progress``, ``init_from``: as in :func:`train` (a warm start
    is checked and its line logged)."""
    dist = distributed.setup_distributed(cfg.train.device)
    try:
        exp, graph, origin = _prepare(cfg, dist, clicks=clicks, progress=progress, init_from=init_from)
    finally:
        distributed.cleanup()
    cfg, split, model = exp.cfg, exp.split, exp.model
    if origin is not None:
        log(origin.line())
    for line in opening_lines(exp, dist.device, len(split.valid.sample(cfg.eval.valid_users, cfg.data.seed))):
        log(line)
    if model.trainable:
        log(plan_training(cfg.train, exp.facts).describe(cfg.train))
        log(launch_line(cfg, *graph))
    return cfg


def _run(
    exp: Experiment,
    rd: RunDir,
    dist: distributed.DistInfo,
    resume: bool,
    t0: float,
    log: Log,
    on_validate: OnValidate | None = None,
    *,
    progress: bool = False,
    graph: GraphPlan = (False, None),
    origin: WarmStart | None = None,
) -> TrainResult:
    """:func:`train` once the data, the model (on ``dist.device``) and the run directory exist.
    ``progress``: rank 0 draws a bar over each validation's and the test's users; ``graph``: the
    run's CUDA-graph plan (:func:`_prepare`); ``origin``: the warm start the model's weights came
    from, recorded in the run directory."""
    cfg, split, model = exp.cfg, exp.split, exp.model
    if dist.is_main and not resume:
        _save_start(rd, exp, origin)
    if origin is not None:
        log(origin.line())
    valid = split.valid.sample(cfg.eval.valid_users, cfg.data.seed)  # a fixed sample: its cost stays bounded
    for line in opening_lines(exp, dist.device, len(valid)):
        log(line)
    bar = progress and dist.is_main
    validate = _validator(exp, valid, dist.is_main, bar)
    key = cfg.eval.objective
    state = LoopState()
    if model.trainable:
        with track_metrics(rd, cfg.train.tensorboard and dist.is_main):
            loop = Loop.start(exp, dist, rd, validate, key, log, on_validate, graph=graph)
            # train.max_minutes bounds the whole call, from before the data was read to the test
            loop.deadline = t0 + 60 * cfg.train.max_minutes if cfg.train.max_minutes else math.inf
            loop.test_share = len(split.test) / max(len(valid), 1)
            state = optimise(loop, resume=resume)
            # the step's DDP wrapper must be freed while its process group lives: distributed.cleanup
            # collects it only once nothing holds it (a reducer outliving its gloo group aborts the exit)
            del loop
        _take_best(exp, rd, dist, valid, log)
    else:
        state.best = validate()[key]
        if dist.is_main:
            rd.save_best(model.state_dict())
    test_metrics = _tested(exp, rd, dist.is_main, bar)
    distributed.cleanup()
    return TrainResult(
        run_dir=str(rd.path),
        steps=state.step,
        best_step=state.best_step,
        best_valid=state.best,
        test_metrics=test_metrics,
        samples_per_s=state.samples_per_s,
        wall_s=time.perf_counter() - t0,
        targets_per_s=state.targets_per_s,
        cuda_graph=state.cuda_graph,
        out_of_time=state.out_of_time,
    )


def _take_best(exp: Experiment, rd: RunDir, dist: distributed.DistInfo, valid: EvalSet, log: Log) -> None:
    """Put the best weights into ``exp``'s model on every rank (the ranks share the test's users),
    then choose on them what is chosen once trained: how items without clicks rank
    (:mod:`recsys.train.new_items`), set in ``exp.cfg`` (the test reads it) and recorded in the
    run's ``config.json``."""
    if dist.is_main and rd.has_best():
        rd.load_best(map_location=dist.device, model=exp.model)
    distributed.broadcast_weights(exp.model)
    chosen = choose_for_new_items(exp.model, valid, exp.cfg, exp.dataset.catalogue_category, log)
    if chosen is not None:
        exp.cfg = freeze(chosen)
        if dist.is_main:
            rd.save_config(exp.cfg)


def _save_start(rd: RunDir, exp: Experiment, origin: WarmStart | None) -> None:
    """What a new run is, written before its first step: its resolved config, its prepared data and,
    for a warm start, the run its weights came from."""
    rd.save_config(exp.cfg)
    rd.save_dataset(exp.dataset)
    if origin is not None:
        rd.save_origin(origin.record())


def _tested(exp: Experiment, rd: RunDir, main: bool, bar: bool) -> dict[str, float]:
    """The test of ``exp``'s model (its best weights) on the test users, which every rank calls (the
    ranks share the users); rank 0 (``main``) saves the metrics; ``bar``: a progress bar."""
    metrics = evaluate_with_config(
        exp.model,
        exp.split.test,
        exp.cfg,
        item_category=exp.dataset.catalogue_category,
        progress=bar,
        across_ranks=True,
    )
    if main:
        rd.save_test_metrics(metrics)
    return metrics


def _validator(exp: Experiment, valid: EvalSet, main: bool, bar: bool) -> Callable[[], dict[str, float]]:
    """The validation of ``exp``'s model on the ``valid`` users, which every rank calls: the ranks
    share the users; rank 0 (``main``) adds the interests' health, which it logs; ``bar``: a
    progress bar over the users."""
    cfg, ds, model = exp.cfg, exp.dataset, exp.model
    planted = planted_for(cfg, ds.user_raw[valid.users], ds.category_raw)

    def validate() -> dict[str, float]:
        metrics = evaluate_with_config(
            model, valid, cfg, item_category=ds.catalogue_category, progress=bar, across_ranks=True
        )
        if model.trainable and main:  # multi-interest health, logged beside the recall (docs/multi-interest.md)
            metrics.update(health_with_config(model, valid, cfg, item_category=ds.catalogue_category, planted=planted))
        return metrics

    return validate


def _check_split(ds: Dataset, split: Split) -> None:
    """A dataset too small to train, validate and test on is an error before the run starts."""
    sizes = {"train": len(split.train_users), "valid": len(split.valid.users), "test": len(split.test.users)}
    empty = [name for name, size in sizes.items() if size == 0]
    if empty:
        raise ValueError(
            f"data: too small to split: {count(ds.num_users, 'user')} after filtering, so no {' and no '.join(empty)} "
            f"users ({', '.join(f'{k} {v}' for k, v in sizes.items())}); use more data, or lower "
            "data.min_item_count / data.min_user_count"
        )


def _data_name(cfg: Config) -> str:
    """A readable dataset label for run names: ``synthetic``, or ``<folder>-<file stem>``."""
    if cfg.data.source == "synthetic":
        return "synthetic"
    path = Path(cfg.data.source)
    if path.suffix:
        return f"{path.parent.name}-{path.stem}" if path.parent.name else path.stem
    return path.name
