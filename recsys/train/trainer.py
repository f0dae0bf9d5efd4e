"""The training loop: sampled softmax with ComiRec's hard readout, validation, early stopping.

One call, :func:`train`, runs a whole experiment from a :class:`~recsys.config.Config`: load and
split the data, build the model, optimise, validate on the valid users (``eval.objective``,
Recall@max(topn) by default, with the evaluator) on the cadence of :mod:`recsys.train.plan`,
keep the best weights, stop early after ``train.patience`` validations without improvement (or
at the step budget, or where what is left of the ``train.max_minutes`` wall-clock budget of the
whole call covers only one last validation and the test), and finally evaluate the best
weights on the test users.
Everything lands in a self-contained run directory (see :mod:`recsys.train.checkpoint`).

The hot path never syncs the host: losses accumulate on the device and are read every
``train.log_every`` steps; batches are built by vectorised numpy and copied from pinned memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from recsys.config import Config, ConfigError, automatic_keys, require_resolved
from recsys.data.batches import TrainSampler, WindowSampler
from recsys.data.split import Split
from recsys.data.synthetic import planted_for
from recsys.device import to_device
from recsys.evaluate.diagnostics import health_with_config
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.io import full_disk
from recsys.items import RowUpdates
from recsys.models import InterestModel, spec_for
from recsys.nn.attention import max_attention_logit, set_track_stats
from recsys.nn.masking import gather_last
from recsys.run import Experiment, RunDir, build_experiment, new_run_dir, unfinished_runs
from recsys.run.settings import Facts, check
from recsys.text import count
from recsys.train import distributed
from recsys.train.averaging import WeightAverage
from recsys.train.checkpoint import capture_rng, make_checkpoint, rank_rng, restore_rank_rng, restore_rng
from recsys.train.divergence import DivergenceGuard
from recsys.train.graphs import DDP_WARMUP_STEPS, WARMUP_STEPS, capturing, launch_line, plan_graph, side_stream
from recsys.train.losses import (
    LossOutput,
    LossRows,
    attention_collision,
    interest_cosine,
    loss_names,
    make_loss,
    readouts,
)
from recsys.train.memory import check_fits
from recsys.train.meter import VALID_SHARE, RunMeter
from recsys.train.plan import TrainPlan, plan_training
from recsys.train.tracking import track_metrics

if TYPE_CHECKING:
    import pandas as pd

    from recsys.data import Dataset

Log = Callable[[str], None]
OnValidate = Callable[[int, dict[str, float]], None]


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


def make_optimizer(
    model: torch.nn.Module, cfg: Config, device: torch.device, weight_decay: float, capturable: bool = False
) -> torch.optim.Optimizer:
    """Fused Adam/AdamW (one pass over each parameter per step, on the CPU too: on taobao's
    37k-item table the unfused CPU update was a third of a step) with ``weight_decay`` (the
    config's, or the automatic value of :mod:`recsys.train.plan`) over the parameters that need a
    gradient; ``capturable`` keeps its state on the device for CUDA graphs."""
    cls = torch.optim.AdamW if cfg.train.optimizer == "adamw" else torch.optim.Adam
    return cls(
        [p for p in model.parameters() if p.requires_grad],  # a row-sparse item table updates itself
        lr=cfg.train.lr,
        weight_decay=weight_decay,
        fused=True,
        capturable=capturable and device.type == "cuda",
    )


class TrainStep:
    """One optimisation step: batch -> interests -> readout -> the loss (``train.loss``,
    :mod:`recsys.train.losses`) -> backward -> update.

    With ``train.cuda_graph`` (``"auto"`` by default; see :mod:`recsys.train.graphs`) the whole
    step (forward, backward, the gradient all-reduce under DDP, clipping, fused Adam) is captured
    once into a CUDA graph and replayed: one launch per step instead of hundreds, which is what
    short click sequences need on a GPU whose CPU launch overhead dominates. Negatives are drawn
    outside the graph and copied into its static inputs. Where the step cannot be captured it
    runs with eager launches; one line through ``log`` says how the step runs, and why.

    Args:
        model: the (unwrapped) model; its ``item_embeddings()`` are the output embeddings.
        cfg: the resolved run config (``train`` section: negatives, sampler, logQ, z-loss, AMP,
            clipping); a value still automatic is a ``ValueError`` naming it.
        device: where the batch and the negatives live.
        item_counts: ``[num_items]`` training click counts (for the unigram sampler).
        generator: the negative sampler's random stream (on ``device``).
        world_size: processes training together; above 1 the model is wrapped in
            DistributedDataParallel here (which syncs gradients), on the capture stream.
        log: where the launch line goes.
        weight_decay: the optimiser's (the resolved ``train.weight_decay``, through the plan).
    """

    def __init__(
        self,
        model: InterestModel,
        cfg: Config,
        device: torch.device,
        item_counts: Tensor,
        generator: torch.Generator,
        *,
        world_size: int = 1,
        log: Log = lambda line: None,
        weight_decay: float = 0.0,
    ):
        require_resolved(cfg, "TrainStep")
        self.model, self.cfg, self.device, self.world_size, self.log = model, cfg, device, world_size, log
        t = cfg.train
        self.use_graph, why_not = plan_graph(cfg, device, world_size)
        if not self.use_graph:
            log(launch_line(cfg, False, why_not))
        self.objective = make_loss(cfg, item_counts, device, generator)  # train.loss
        # the item table in the form train.item_updates trains it with, before DDP and the optimiser
        # are built: they then train only what the form leaves to them
        self.items = model.train_items(
            t.item_updates,
            RowUpdates(
                lr=t.lr,
                weight_decay=weight_decay,
                decoupled=t.optimizer == "adamw",
                ema_decay=t.ema_decay,
                world_size=world_size,
            ),
        )
        # warm-up and capture run on this stream; DDP is built on it too (its gradient hooks
        # remember the stream they were made on)
        self.stream = torch.cuda.Stream(device) if self.use_graph else None
        self.forward: torch.nn.Module = model
        if world_size > 1:
            with side_stream(self.stream):
                self.forward = torch.nn.parallel.DistributedDataParallel(
                    model, device_ids=[device.index] if device.type == "cuda" else None
                )
        self.soft = torch.zeros((), device=device)  # the readout's soft share, set before every step
        # the soft readout's warm-up (K > 1 only); afterwards the step is rebuilt with the plain argmax
        self.soft_phase = t.soft_readout_steps > 0 and model.num_interests > 1
        # negatives scored by each row's best-matching interest (K > 1 only; for K = 1 the same)
        self.max_scores = t.negative_readout == "max" and model.num_interests > 1
        # interest 0 is the encoder's next-click state, read out against every target by itself (its spec)
        self.state_interest = spec_for(cfg.model.name).state_interest and model.num_interests > 1
        self.amp = t.amp and device.type == "cuda"
        self.dense = t.predict_at == "all"  # every position of a window is a target (resolved by the model spec)
        self.masked = self.dense or t.predict_next > 1  # the loss averages over the valid rows only
        self.optimizer = make_optimizer(model, cfg, device, weight_decay, capturable=self.use_graph)
        self.loss_fn = torch.compile(self.loss, dynamic=False) if t.compile else self.loss
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: tuple[Tensor, ...] = ()
        self.static_out: tuple[LossOutput, Tensor | None] | None = None
        self._announced = False
        # the weights validation scores (train.ema_decay); None scores the last weights
        self.average = WeightAverage(model, t.ema_decay) if t.ema_decay else None

    def negatives(self) -> tuple[Tensor, Tensor]:
        """The loss's random inputs (:meth:`~recsys.train.losses.CatalogueLoss.draw`): ``([S_base]
        negative ids, [S_hard] uniforms for the hard draws)``, both empty for the exact softmax.
        Drawn outside the step so a CUDA graph replays with fresh ones."""
        return self.objective.draw()

    def counts(self, lengths: Tensor, targets: Tensor) -> Tensor | None:
        """What the masked means of a step divide by under DDP: ``[2]`` float32, the global batch's
        valid target rows and (dense) non-empty prefixes, each over the number of processes; None
        in one process, or when every rank's rows are as many (last-position targets, horizon 1).

        Each rank's loss is then its rows' sum over ``count`` (:func:`~recsys.train.losses.masked_mean`),
        i.e. ``world_size ×`` its share of the global mean, and the gradients DDP averages (and
        the row-sparse table's, which it averages the same way) are one process's at the global
        batch. One all-reduce of two integers on the device: no host sync, and a CUDA graph
        captures it with the step (NCCL, as the gradients' all-reduce)."""
        if self.world_size == 1 or not self.masked:
            return None
        counts = torch.stack([(targets > 0).sum(), lengths.sum()])  # [2] long: this rank's rows
        torch.distributed.all_reduce(counts)
        return counts.clamp_min(1).float() / self.world_size

    def loss(
        self,
        seq: Tensor,
        lengths: Tensor,
        targets: Tensor,
        negatives: Tensor,
        hard_uniforms: Tensor,
        soft: Tensor,
        counts: Tensor | None = None,
    ) -> LossOutput:
        """``seq [B, L]``, ``lengths [B]``, ``targets`` (``[B]``, or ``[B, L]`` with 0 at padding
        when dense; a trailing ``[m]`` with ``train.predict_next`` m > 1), ``negatives [S_base]``,
        ``hard_uniforms [S_hard]``, ``soft`` (0-d readout blend) on the device, ``counts``
        (:meth:`counts`, under DDP) -> the loss.

        Dense (``train.predict_at = "all"``): the interests at every prefix ``[B, L, K, d]`` become
        ``B·L`` rows, each read out against its own next click; padding positions are masked out
        of the loss (no gradient), and the hard-negative proposal reads each window's last prefix.
        With ``train.predict_next`` m > 1 every row repeats m times, once for each of its following clicks (a
        missing one, past the sequence's end, is masked out like padding). Under DDP the masked
        means divide by the global batch's rows (``counts``), so the ranks train what one
        process does.
        """
        t = self.cfg.train
        autocast = (  # the autocast weight cache cannot live across graph replays
            torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not self.use_graph)
            if self.amp
            else contextlib.nullcontext()
        )
        targets = targets.flatten()  # [R] (R = B, or B L dense; times train.predict_next), 0: no click there
        catalogue_ids = (targets, negatives)  # what the sampler's logQ is a function of
        # a form that gathers the step's rows gives the model their positions instead of the ids
        with self.items.step_rows(seq, targets, negatives) as (seq, targets, negatives), autocast:
            if self.dense:
                prefix = self.forward(seq, lengths, prefix=True)  # [B, L, K, d]
                proposal_interests = gather_last(prefix.flatten(2), lengths).view(-1, *prefix.shape[2:])  # [B, K, d]
                interests, scores = prefix.flatten(0, 1), None  # [B L, K, d]
            elif t.attention_reg:  # the attention logits [B, L, K] feed the routing regulariser
                interests, scores = self.forward(seq, lengths, with_attention=True)  # [B, K, d]
                proposal_interests = interests
            else:
                interests, scores = self.forward(seq, lengths), None
                proposal_interests = interests
            # each row's next m clicks, read out against the same interests; max-scored negatives
            # take the unrepeated interests and score each row once (recsys.train.losses.negative_logits)
            per_target = interests.repeat_interleave(t.predict_next, dim=0) if t.predict_next > 1 else interests
            item_emb = self.model.item_embeddings()  # [N, d]
            mask = targets > 0 if self.masked else None  # one mask for every readout's rows
            count = None if counts is None else counts[0]  # the global batch's valid targets, a process
            users = readouts(
                per_target,
                item_emb[targets],
                soft=soft if self.soft_phase else 0.0,
                max_scores=self.max_scores,
                state_interest=self.state_interest,
            )
            outs = [
                self.objective(
                    LossRows(
                        user=user,  # [R, d]
                        targets=targets,
                        item_emb=item_emb,
                        interests=scoring,
                        proposal_interests=proposal_interests,
                        mask=mask,
                        count=count,
                        catalogue_ids=catalogue_ids,
                    ),
                    negatives,
                    hard_uniforms,
                )
                for user, scoring in users
            ]
            out = outs[0] if len(outs) == 1 else _summed(outs)
        if scores is not None:
            out = dataclasses.replace(out, loss=out.loss + t.attention_reg * attention_collision(scores, lengths))
        if t.interest_reg:  # dense: the padding's prefixes have zero interests, which the term skips
            # dense under DDP: over the global batch's prefixes (the ranks' last-position rows are as many)
            prefixes = counts[1] if counts is not None and self.dense else None
            parting = interest_cosine(interests, t.interest_margin, prefixes)
            out = dataclasses.replace(out, loss=out.loss + t.interest_reg * parting)
        return out

    def _update(
        self, seq: Tensor, lengths: Tensor, targets: Tensor, negatives: Tensor, hard_uniforms: Tensor, soft: Tensor
    ) -> tuple[LossOutput, Tensor | None]:
        """Loss, backward, clip, optimizer step (gradients must be None or zero on entry)."""
        counts = self.counts(lengths, targets)  # its all-reduce outside torch.compile
        out = self.loss_fn(seq, lengths, targets, negatives, hard_uniforms, soft, counts)
        out.loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grads += self.items.collect()  # the gradients the table applies itself (every rank's under DDP)
        grad_norm = clip_gradients(grads, self.cfg.train.grad_clip) if self.cfg.train.grad_clip > 0 else None
        self.optimizer.step()
        self.items.update()
        if self.average is not None:
            self.average.update()
        return out, grad_norm

    def _capture(self, batch: tuple[Tensor, ...]) -> None:
        """Warm up on the capture stream, undo those updates in place, then capture one step.

        The optimizer state must exist before capture (its lazy initialisation would otherwise
        be recorded and replayed), so the warm-up creates it and the states are then put back
        in place: copied from before the warm-up where they existed (a resumed run), zeroed
        (Adam's fresh state) where they did not; the weight average is put back too. Under DDP
        the warm-up is the :data:`~recsys.train.graphs.DDP_WARMUP_STEPS` eager iterations DDP
        needs; every rank undoes the same synchronised updates, so the replicas stay equal.
        """
        self.static_in = tuple(x.clone() for x in batch)
        params = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        average = self.average.state_dict() if self.average is not None else None  # undone like the weights
        items = self.items.train_state()  # and the item table's own
        saved = {
            p: {k: v.clone() for k, v in st.items() if torch.is_tensor(v)} for p, st in self.optimizer.state.items()
        }
        try:
            with side_stream(self.stream):
                for _ in range(DDP_WARMUP_STEPS if self.world_size > 1 else WARMUP_STEPS):
                    self.optimizer.zero_grad(set_to_none=True)
                    self._update(*self.static_in)
        finally:  # also when a warm-up step fails: eager launches go on from the same weights
            with torch.no_grad():
                self.model.load_state_dict(params)
                if self.average is not None and average is not None:
                    self.average.load_state_dict(average)
                self.items.load_train_state(items)
                for p, st in self.optimizer.state.items():
                    for k, v in st.items():
                        if torch.is_tensor(v):
                            v.copy_(saved[p][k]) if k in saved.get(p, {}) else v.zero_()
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        assert self.stream is not None
        with capturing(graph, self.stream, thread_local=self.world_size > 1):  # DDP: NCCL's watchdog thread
            out, grad_norm = self._update(*self.static_in)
        # detached: no autograd node of the capture outlives it (a re-capture would find them)
        self.graph, self.static_out = graph, (_detached(out), grad_norm)

    def _try_capture(self, batch: tuple[Tensor, ...]) -> bool:
        """Capture the step (every rank, or none); False after falling back to eager launches."""
        error: Exception | None = None
        try:
            self._capture(batch)
        except Exception as err:  # noqa: BLE001 - "auto" falls back to eager launches, true reports it
            error = err
        captured = distributed.all_true(error is None, self.device)
        if captured:
            if not self._announced:
                self.log(launch_line(self.cfg, True))
                self._announced = True
            return True
        self.use_graph, self.graph, self.static_in, self.static_out = False, None, (), None
        self.optimizer.zero_grad(set_to_none=True)
        reason = (
            "capturing the step failed on another rank"
            if error is None
            else f"capturing the step failed: {type(error).__name__}: {(str(error).strip() or '?').splitlines()[0]}"
        )
        if self.cfg.train.cuda_graph is True:
            raise ValueError(
                f'train.cuda_graph = true: {reason}; set it to "auto" to fall back to eager launches, or false'
            ) from error
        self.log(launch_line(self.cfg, False, reason))
        return False

    def __call__(
        self, seq: Tensor, lengths: Tensor, targets: Tensor, step: int = 0
    ) -> tuple[LossOutput, Tensor | None]:
        """Forward, backward, clip and update at 0-based ``step``; returns the loss and the
        pre-clip gradient norm (a device tensor, or None without clipping). Never syncs the host
        (except once, under DDP, to agree that every rank captured its graph)."""
        self.model.train()
        warm = self.cfg.train.soft_readout_steps
        if self.soft_phase and step >= warm:  # the blend has reached the argmax: drop its cost
            self.soft_phase, self.graph = False, None
        self.soft.fill_(max(0.0, 1.0 - step / warm) if warm else 0.0)
        if self.average is not None:
            self.average.prepare(step)
        batch = (seq, lengths, targets, *self.negatives(), self.soft)
        if self.use_graph and self.graph is None:
            self._try_capture(batch)
        if not self.use_graph:
            self.optimizer.zero_grad(set_to_none=True)
            return self._update(*batch)
        for static, x in zip(self.static_in, batch):
            static.copy_(x, non_blocking=True)
        assert self.graph is not None and self.static_out is not None
        self.graph.replay()
        return self.static_out

    def scale_lr(self, factor: float) -> None:
        """Multiply every parameter group's learning rate by ``factor``. A captured step is
        captured again at its next call: the graph holds the rate as a constant."""
        for group in self.optimizer.param_groups:
            group["lr"] *= factor
        self.items.scale_lr(factor)
        self.graph = None

    @contextlib.contextmanager
    def scored_weights(self) -> Iterator[None]:
        """The model holds the weights validation scores inside the block: every item row brought
        up to the current step (row-sparse), and the weight average where there is one."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.items.scored())
            if self.average is not None:
                stack.enter_context(self.average.swapped_in())
            yield

    def reset_average(self, step: int) -> None:
        """Average afresh from the current weights after ``step`` (a plateau's lr drop)."""
        self.items.reset_average()
        if self.average is not None:
            self.average.reset(step)

    def state_dict(self) -> dict[str, Any]:
        """The step's resume state beside the model's weights: the optimiser's, and the weight
        average's and the row-sparse item table's where they exist (after :meth:`scored_weights`
        has brought the rows up to date)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            **({"average": self.average.state_dict()} if self.average is not None else {}),
            **({"item_rows": items} if (items := self.items.train_state()) else {}),
        }

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Put back :meth:`state_dict`'s entries of a resume checkpoint."""
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.average is not None:
            self.average.load_state_dict(checkpoint["average"])
        self.items.load_train_state(checkpoint.get("item_rows", {}))


def _summed(outs: list[LossOutput]) -> LossOutput:
    """Losses of several readouts of one batch as one: their sum, the first's log-partition, the largest logit."""
    return LossOutput(
        loss=torch.stack([o.loss for o in outs]).sum(),
        log_z=outs[0].log_z,
        max_logit=torch.stack([o.max_logit for o in outs]).max(),
    )


def clip_gradients(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale ``grads`` in place so that their joint L2 norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does for parameters (a row-sparse step's row gradients
    belong to no parameter); returns the norm before clipping (a device tensor, no host sync)."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def _detached(out: LossOutput) -> LossOutput:
    return dataclasses.replace(out, loss=out.loss.detach())


def train(
    cfg: Config,
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    log: Log = print,
    clicks: pd.DataFrame | None = None,
    progress: bool = False,
    on_validate: OnValidate | None = None,
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
    """
    if resume and run_dir is None:
        raise ValueError("--resume needs the run directory to continue")
    check(cfg)  # a setting the model does not read fails before anything starts
    dist = distributed.setup_distributed(cfg.train.device, graphs=cfg.train.cuda_graph is not False)
    device = dist.device
    torch.manual_seed(cfg.train.seed + dist.rank)
    t0 = time.perf_counter()

    rd = RunDir(run_dir) if resume and run_dir is not None else None  # (resume without run_dir raised above)
    rebatched = False  # resumed on another number of processes: config.json gets the new per-process batch
    if rd is not None:
        rd.require_checkpoint()
        if dist.is_main:
            rd.claim()  # a run still training elsewhere is not resumed under it
        kept = _keep_global_batch(cfg, rd.checkpoint_entry("world_size"), dist.world_size, log)
        cfg, rebatched = kept, kept is not cfg
    exp = _prepare(cfg, dist, dataset=rd.load_dataset() if rd else None, clicks=clicks, progress=progress)
    cfg = exp.cfg  # every value resolved
    torch.set_num_threads(cfg.train.cpu_threads)
    exp.model.to(device)

    created = rd is None and (run_dir is None or not Path(run_dir).exists())
    if run_dir is None and not cfg.name and dist.is_main:
        _mention_unfinished(cfg)
    if rd is None:  # rank 0 makes the folder; under DDP the other ranks open the same one
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
        rd = RunDir(path)
    log(f"run directory: {rd.path}")
    if rebatched and dist.is_main:
        rd.save_config(cfg)
    try:
        return _run(exp, rd, dist, resume, t0, log, on_validate, progress=progress)
    except BaseException as err:
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
        raise
    finally:
        if dist.is_main:
            rd.release()


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
) -> Experiment:
    """The experiment a run on ``dist`` trains, with every automatic value of its config decided
    in ``exp.cfg`` for the data and ``dist``'s device and processes (:func:`recsys.run.build_experiment`).
    Both :func:`train` and :func:`dry_run` go through here, so a dry run shows what the run uses.

    Raises before any memory is taken where ``train.cuda_graph = true`` cannot capture on this
    device, the model does not fit (:func:`~recsys.train.memory.check_fits`), or the split
    leaves no train, valid or test users."""
    if cfg.train.loss not in loss_names():
        raise ConfigError(f"train.loss: unknown loss {cfg.train.loss!r}; known: {', '.join(loss_names())}")
    capture, _ = plan_graph(cfg, dist.device, dist.world_size)  # train.cuda_graph = true that cannot: fail now
    exp = build_experiment(
        cfg,
        dataset=dataset,
        clicks=clicks,
        progress=progress,
        check_memory=functools.partial(check_fits, device=dist.device, step_kept=capture),
        device=dist.device,
        world_size=dist.world_size,
    )
    _check_split(exp.dataset, exp.split)
    return exp


def dry_run(cfg: Config, *, clicks: pd.DataFrame | None = None, progress: bool = False, log: Log = print) -> Config:
    """What :func:`train` would run, without training or writing a run directory: reads and
    prepares the data, builds the model, logs the lines the run would open its log with (data,
    model, validation, plan, and how the step would launch) and returns the resolved config
    the run would save. ``clicks``, ``progress``: as in :func:`train`."""
    check(cfg)
    dist = distributed.setup_distributed(cfg.train.device)
    try:
        exp = _prepare(cfg, dist, clicks=clicks, progress=progress)
    finally:
        distributed.cleanup()
    cfg, split, model = exp.cfg, exp.split, exp.model
    log(_data_line(exp.dataset, split))
    log(_model_line(cfg, model))
    if dist.device.type == "cpu":
        log(_threads_line(cfg, exp.facts))
    if model.trainable:
        log(_validation_line(cfg, split, len(split.valid.sample(cfg.eval.valid_users, cfg.data.seed))))
        log(plan_training(cfg.train, exp.facts).describe(cfg.train))
        log(launch_line(cfg, *plan_graph(cfg, dist.device, dist.world_size)))
    return cfg


def _data_line(ds: Dataset, split: Split) -> str:
    return (
        f"data: {count(ds.num_users, 'user')}, {count(ds.num_items - 1, 'item')}, {count(len(ds.items), 'click')}; "
        f"train users {len(split.train_users):,}, valid {len(split.valid.users):,}, test {len(split.test.users):,}"
    )


def _model_line(cfg: Config, model: InterestModel) -> str:
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


def _threads_line(cfg: Config, facts: Facts) -> str:
    """How many threads torch trains with, beside what the automatic count reads (recsys.run.settings.cpu_threads)."""
    return (
        f"CPU threads: {cfg.train.cpu_threads} (train.cpu_threads; this process may run on {facts.cores} cores, "
        f"{facts.busy_cores:.1f} of them busy with other work, torch's default {facts.torch_threads})"
    )


def _validation_line(cfg: Config, split: Split, sampled: int) -> str:
    """Who validation scores: ``sampled`` of the validation users (``eval.valid_users``)."""
    return (
        f"validation: {sampled:,} of the {len(split.valid):,} validation users (eval.valid_users)"
        + ("" if cfg.train.eval_every else f", at most {VALID_SHARE:.0%} of the wall time")
        + f"; the test scores all {len(split.test):,} test users"
    )


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
) -> TrainResult:
    """:func:`train` once the data, the model (on ``dist.device``) and the run directory exist.
    ``progress``: rank 0 draws a bar over each validation's and the test's users."""
    cfg, ds, split, model = exp.cfg, exp.dataset, exp.split, exp.model
    if dist.is_main and not resume:
        rd.save_config(cfg)
        rd.save_dataset(ds)
    log(_data_line(ds, split))
    log(_model_line(cfg, model))
    if dist.device.type == "cpu":
        log(_threads_line(cfg, exp.facts))
    valid = split.valid.sample(cfg.eval.valid_users, cfg.data.seed)  # a fixed sample: its cost stays bounded
    if model.trainable:
        log(_validation_line(cfg, split, len(valid)))
    planted = planted_for(cfg, ds.user_raw[valid.users], ds.category_raw)
    bar = progress and dist.is_main

    def validate() -> dict[str, float]:
        """Every rank's: the ranks share the users; rank 0 adds the interests' health, which it logs."""
        metrics = evaluate_with_config(
            model, valid, cfg, item_category=ds.item_category, progress=bar, across_ranks=True
        )
        if model.trainable and dist.is_main:  # multi-interest health, logged beside the recall (docs/multi-interest.md)
            metrics.update(health_with_config(model, valid, cfg, item_category=ds.item_category, planted=planted))
        return metrics

    key = cfg.eval.objective
    state = _LoopState()
    if model.trainable:
        with track_metrics(rd, cfg.train.tensorboard and dist.is_main):
            loop = _Loop.start(exp, dist, rd, validate, key, log, on_validate)
            # train.max_minutes bounds the whole call, from before the data was read to the test
            loop.deadline = t0 + 60 * cfg.train.max_minutes if cfg.train.max_minutes else math.inf
            loop.test_share = len(split.test) / max(len(valid), 1)
            if resume:
                loop.resume()
            state = _optimise(loop)
            # the step's DDP wrapper must be freed while its process group lives: distributed.cleanup
            # collects it only once nothing holds it (a reducer outliving its gloo group aborts the exit)
            del loop
        if dist.is_main and rd.has_best():
            rd.load_best(map_location=dist.device, model=model)
        distributed.broadcast_weights(model)  # the ranks share the test's users
    else:
        state.best = validate()[key]
        if dist.is_main:
            rd.save_best(model.state_dict())
    test_metrics = evaluate_with_config(
        model, split.test, cfg, item_category=ds.item_category, progress=bar, across_ranks=True
    )
    if dist.is_main:
        rd.save_test_metrics(test_metrics)
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


@dataclass
class _LoopState:
    """The loop's counters: what a checkpoint saves beside the weights, and what the run reports."""

    step: int = 0
    best: float = -math.inf
    best_step: int = 0
    bad_evals: int = 0
    lr_drops: int = 0  # plateaus that went back to the best weights at a lower rate (train.lr_drops)
    samples_per_s: float = 0.0
    targets_per_s: float = 0.0
    last_eval: int = 0  # the step of the latest validation
    cuda_graph: bool = False
    out_of_time: bool = False


@dataclass(eq=False)
class _Loop:
    """What the optimisation loop carries from step to step: the model and its
    :class:`TrainStep`, the batches and the negatives' random stream (both saved in every
    checkpoint, so a resumed run draws what the uninterrupted one would), the plan, the
    divergence guard, the run directory, the validation with its objective ``key`` and its
    ``on_validate`` hook, the counters ``st``, and for ``train.max_minutes`` the clock's time at
    which the call must have ended (``deadline``, :func:`time.perf_counter` seconds) and the test's
    users over a validation's (``test_share``: what the test costs after the last validation)."""

    cfg: Config
    dist: distributed.DistInfo
    model: InterestModel
    step_fn: TrainStep
    batches: TrainSampler | WindowSampler
    generator: torch.Generator
    plan: TrainPlan
    guard: DivergenceGuard
    rd: RunDir
    validate: Callable[[], dict[str, float]]
    key: str
    log: Log
    on_validate: OnValidate | None = None
    st: _LoopState = dataclasses.field(default_factory=_LoopState)
    deadline: float = math.inf
    test_share: float = 1.0

    @classmethod
    def start(
        cls,
        exp: Experiment,
        dist: distributed.DistInfo,
        rd: RunDir,
        validate: Callable[[], dict[str, float]],
        key: str,
        log: Log,
        on_validate: OnValidate | None = None,
    ) -> _Loop:
        """The loop at step 0 for ``exp`` (its model on ``dist.device``); logs the plan."""
        cfg, split, t, device = exp.cfg, exp.split, exp.cfg.train, dist.device
        # one stream of batches and one of negatives, the same on every rank: each rank trains on its
        # slice of the global batch against the shared negatives (docs/training.md, "Several GPUs")
        generator = torch.Generator(device=device)
        generator.manual_seed(t.seed + 1000)
        # the training rows in place in the dataset's (possibly memory-mapped) clicks
        rows = (split.clicks_indptr, split.clicks, cfg.data.max_len)
        part: dict[str, Any] = {"seed": t.seed, "users": split.train_users, "ends": split.train_ends}
        part.update(predict_next=t.predict_next, rank=dist.rank, world_size=dist.world_size)
        batches: TrainSampler | WindowSampler
        if t.predict_at == "all":
            batches = WindowSampler(*rows, tiled=t.windows == "tiled", **part)
        else:
            batches = TrainSampler(*rows, min_target=t.min_target, by_targets=t.draw == "targets", **part)
        plan = plan_training(t, exp.facts)
        if dist.is_main:
            log(plan.describe(t))
        step_fn = TrainStep(
            exp.model,
            cfg,
            device,
            exp.item_counts.to(device),
            generator,
            world_size=dist.world_size,
            log=log if dist.is_main else lambda line: None,
            weight_decay=plan.weight_decay,
        )
        guard = DivergenceGuard(t, rd, device)
        return cls(cfg, dist, exp.model, step_fn, batches, generator, plan, guard, rd, validate, key, log, on_validate)

    def resume(self) -> None:
        """Continue from the run directory's last checkpoint: the weights, the step's state, the
        counters, both random streams, each rank's dropout streams and the guard's start loss; metrics
        rows past it are dropped."""
        ck = self.rd.load_checkpoint(map_location=self.dist.device, model=self.model)
        self.step_fn.load_state_dict(ck)
        self.st = _LoopState(
            ck["step"], ck["best"], ck["best_step"], ck["bad_evals"], ck.get("lr_drops", 0), last_eval=ck["step"]
        )
        restore_rng(ck["rng"], {"batches": self.batches.rng}, {"neg": self.generator})
        streams, rank = ck.get("rank_rng", []), self.dist.rank
        if len(streams) == self.dist.world_size:  # each rank its own dropout streams back
            restore_rank_rng(streams[rank])
        elif rank:  # another number of processes: rank 0's streams, and fresh ones elsewhere
            torch.manual_seed(hash((self.cfg.train.seed, rank, self.st.step)) % 2**63)
        self.guard.start_loss = ck.get("start_loss")
        self.rd.rewind_metrics(self.st.step)
        self.log(f"resumed at step {self.st.step} (best {self.key} {self.st.best:.4f} at step {self.st.best_step})")

    def drop_lr(self) -> None:
        """A plateau's step down (``train.lr_drops``): the rate times ``train.lr_drop_factor``, the
        patience counted afresh and the weight average started again; the caller brings back the
        best weights. The optimizer's moments stay those of the latest weights, a short way from
        the best ones."""
        self.step_fn.scale_lr(self.cfg.train.lr_drop_factor)
        self.step_fn.reset_average(self.st.step)
        self.st.lr_drops += 1
        self.st.bad_evals = 0

    def validation(self, *, can_drop: bool = False) -> str:
        """Evaluate on the valid users, keep the best weights, checkpoint (with the guard's start
        loss). With ``train.ema_decay`` the weight average is what is evaluated and kept as the
        best weights. Every rank calls it: the ranks share the users and reach the same verdict;
        rank 0 writes the run directory and logs.

        Returns ``"stop"`` at a plateau, ``"drop"`` at a plateau with ``train.lr_drops`` left and
        ``can_drop``, after going back to the best weights at the lower rate (so the checkpoint
        records the run as it goes on), else ``""``."""
        st, rd, t, main = self.st, self.rd, self.cfg.train, self.dist.is_main
        with self.step_fn.scored_weights():
            metrics = self.validate()  # the same on every rank (rank 0 adds the interests' health)
            improved = metrics[self.key] > st.best
            if improved and main:
                rd.save_best(self.model.state_dict())
        if improved:
            st.best, st.best_step, st.bad_evals = metrics[self.key], st.step, 0
        else:
            st.bad_evals += 1
        verdict = "stop" if self.plan.plateau_reached(st.step, st.bad_evals, t.patience) else ""
        if verdict and can_drop and st.lr_drops < t.lr_drops:
            verdict = "drop"
            if main:
                rd.load_best(map_location=self.step_fn.device, model=self.model)
            distributed.broadcast_weights(self.model)
            self.drop_lr()
        streams = distributed.all_gather_object(rank_rng())  # each rank's dropout streams, for an exact resume
        if not main:
            return verdict
        rd.append_metrics({"step": st.step, "split": "valid", **metrics})
        health = "  ".join(f"{label} {metrics[k]:.2f}" for k, label in _HEALTH_LABELS.items() if k in metrics)
        self.log(
            f"valid @ {st.step}: "
            + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if "@" in k)
            + ("  (best)" if improved else f"  (no improvement {st.bad_evals}/{t.patience})")
            + (f"\n  interests: {health}" if health else "")
        )
        if verdict == "drop":
            self.log(
                f"plateau at step {st.step}: back to the best weights (step {st.best_step}), lr "
                f"{self.step_fn.optimizer.param_groups[0]['lr']:.3g} (drop {st.lr_drops} of {t.lr_drops})"
            )
        rd.save_checkpoint(
            make_checkpoint(
                self.model,
                step=st.step,
                best=st.best,
                best_step=st.best_step,
                bad_evals=st.bad_evals,
                lr_drops=st.lr_drops,
                world_size=self.dist.world_size,  # a resume on another number keeps the global batch
                **self.step_fn.state_dict(),
                rng=capture_rng({"batches": self.batches.rng}, {"neg": self.generator}),
                rank_rng=streams,
                **self.guard.state(),
            )
        )
        if self.on_validate is not None:
            self.on_validate(st.step, metrics)
        return verdict


def _optimise(loop: _Loop) -> _LoopState:
    """The optimisation loop with periodic logging, validation, checkpoints and early stopping."""
    t, dist, st, device = loop.cfg.train, loop.dist, loop.st, loop.dist.device
    model, step_fn, guard, plan, log = loop.model, loop.step_fn, loop.guard, loop.plan, loop.log
    sums = torch.zeros(4, device=device)  # loss, log Z, max logit, grad norm over the log window
    meter = RunMeter(
        plan,
        t,
        start_step=st.step,
        samples_per_step=t.batch_size * dist.world_size,
        clock=time.perf_counter,
        deadline=loop.deadline,
    )
    window_steps, window_targets = 0, 0
    max_steps = plan.max_steps

    def last_minutes(check: bool) -> bool:
        """``train.max_minutes``: whether the time left covers only one last validation and the
        test, each timed by the latest validation (none before the first), on rank 0's clock."""
        if not (check and st.step < max_steps and loop.deadline < math.inf):
            return False
        ending = meter.last_pause * (1 + loop.test_share)
        return distributed.broadcast_flag(time.perf_counter() + ending >= loop.deadline, device)

    while st.step < max_steps:
        log_now = (st.step + 1) % t.log_every == 0 or st.step + 1 == max_steps
        set_track_stats(model, log_now and not step_fn.use_graph)  # max attention logit, on logging steps
        batch = loop.batches.sample(t.batch_size)
        window_targets += int(np.count_nonzero(batch[2]))  # (position, click) pairs, counted on the host copy
        seq, lengths, targets = to_device(batch, device)
        out, grad_norm = step_fn(seq, lengths, targets, step=st.step)
        guard.watch(out.loss)
        st.step += 1
        window_steps += 1
        sums += torch.stack(
            [
                out.loss.detach(),
                out.log_z,
                out.max_logit,
                grad_norm.float() if grad_norm is not None else sums.new_zeros(()),
            ]
        )
        if log_now:
            # the ranks' losses and log Z averaged: the global batch's, as one process logs them
            sums[:2] = distributed.mean_across_ranks(sums[:2])
            loss, log_z, max_logit, gnorm = (sums / window_steps).tolist()  # the one host sync
            rates = meter.log(window_steps, window_targets * dist.world_size)
            row = {
                "step": st.step,
                "loss": loss,
                "log_z": log_z,
                "max_output_logit": max_logit,
                "grad_norm": gnorm,
                "samples_per_s": round(rates.samples_per_s, 1),
                "targets_per_s": round(rates.targets_per_s, 1),
            }
            attn = max_attention_logit(model)
            if attn is not None:
                row["max_attention_logit"] = float(attn)
            if dist.is_main:
                loop.rd.append_metrics(row)
                left = meter.time_left(
                    st.step, st.last_eval, st.bad_evals, st.last_eval > 0, drops_left=t.lr_drops - st.lr_drops
                )
                log(
                    f"step {st.step}/{max_steps}  loss {loss:.4f}  logZ {log_z:.2f}  |g| {gnorm:.2f}  "
                    f"{rates.describe()}  {left}".rstrip()
                )
            guard.check(st.step, loss, gnorm)
            sums.zero_()
            window_steps, window_targets = 0, 0
        out_of_time = last_minutes(log_now or dist.world_size == 1)  # DDP: agreeing syncs the host
        due = plan.validates_at(st.step, st.last_eval) and (
            st.step >= max_steps or distributed.broadcast_flag(meter.may_validate(), device)  # rank 0's clock
        )
        if due or out_of_time:
            if window_steps:  # the steps since the last log line, before their weights are checkpointed
                guard.check(st.step, *(sums[[0, 3]] / window_steps).tolist())
            st.last_eval = st.step
            with meter.paused():  # with budget left to use a lower rate, a plateau may drop it
                verdict = loop.validation(can_drop=st.step < max_steps and not out_of_time)
            out_of_time = out_of_time or last_minutes(True)  # no time left for another: this one was the last
            if out_of_time:
                log(f"stopped at step {st.step}: train.max_minutes={t.max_minutes:g} reached")
                st.out_of_time = True
                break
            if verdict == "stop":  # every rank's verdict: they scored the same top lists
                log(f"early stop at step {st.step}: no {loop.key} improvement in {t.patience} evaluations")
                break
    set_track_stats(model, False)
    if window_steps:  # an early stop between log steps
        meter.log(window_steps, window_targets * dist.world_size)
    st.samples_per_s, st.targets_per_s = dataclasses.astuple(meter.average())  # the run's, not its last window's
    st.cuda_graph = step_fn.use_graph
    return st


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


_HEALTH_LABELS = {
    "mi_eff_clicks": "effective clicks",
    "mi_readout_share_min": "smallest readout share",
    "mi_served_share_min": "smallest served share",
    "mi_cosine": "cosine",
    "mi_planted_recovery": "planted recovered",
}


def _data_name(cfg: Config) -> str:
    """A readable dataset label for run names: ``synthetic``, or ``<folder>-<file stem>``."""
    if cfg.data.source == "synthetic":
        return "synthetic"
    path = Path(cfg.data.source)
    if path.suffix:
        return f"{path.parent.name}-{path.stem}" if path.parent.name else path.stem
    return path.name
