"""The optimisation loop: steps, log lines, validation on the plan's cadence, checkpoints, a
plateau's rate drop or early stop, and the ``train.max_minutes`` deadline.

:class:`Loop` carries what goes from step to step (the :class:`~recsys.train.step.TrainStep`,
the batches and both random streams, the plan, the divergence guard, the counters);
:func:`optimise` runs it until the plateau, the step budget or the deadline ends it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from recsys.config import Config
from recsys.data.batches import TrainSampler, WindowSampler
from recsys.device import to_device
from recsys.models import InterestModel
from recsys.nn.attention import max_attention_logit, set_track_stats
from recsys.run import Experiment, RunDir
from recsys.train import distributed
from recsys.train.checkpoint import capture_rng, make_checkpoint, rank_rng, restore_rank_rng, restore_rng
from recsys.train.divergence import DivergenceGuard
from recsys.train.graphs import GraphPlan
from recsys.train.losses import LossOutput
from recsys.train.meter import RunMeter
from recsys.train.plan import TrainPlan, plan_training
from recsys.train.step import Log, TrainStep

OnValidate = Callable[[int, dict[str, float]], None]


@dataclass
class LoopState:
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
class Loop:
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
    st: LoopState = dataclasses.field(default_factory=LoopState)
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
        *,
        graph: GraphPlan | None = None,
    ) -> Loop:
        """The loop at step 0 for ``exp`` (its model on ``dist.device``); logs the plan. ``graph``:
        the run's CUDA-graph plan (None: the step plans it)."""
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
            by_targets, epochs = t.draw == "targets", t.draw == "epochs"
            batches = TrainSampler(*rows, min_target=t.min_target, by_targets=by_targets, epochs=epochs, **part)
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
            graph=graph,
        )
        guard = DivergenceGuard(t, rd, device)
        return cls(cfg, dist, exp.model, step_fn, batches, generator, plan, guard, rd, validate, key, log, on_validate)

    def resume(self) -> None:
        """Continue from the run directory's last checkpoint: the weights, the step's state, the
        counters, both random streams, each rank's dropout streams and the guard's start loss; metrics
        rows past it are dropped."""
        ck = self.rd.load_checkpoint(map_location=self.dist.device, model=self.model)
        self.step_fn.load_state_dict(ck)
        self.st = LoopState(
            ck["step"], ck["best"], ck["best_step"], ck["bad_evals"], ck.get("lr_drops", 0), last_eval=ck["step"]
        )
        restore_rng(ck["rng"], {"batches": self.batches.rng}, {"neg": self.generator})
        self.batches.restore_epoch(ck.get("batches_epoch"))  # an epoch's order, where targets are drawn by epochs
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
        health = "  ".join(f"{label} {metrics[k]:.2f}" for k, label in HEALTH_LABELS.items() if k in metrics)
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
        self._save_checkpoint(streams)
        if self.on_validate is not None:
            self.on_validate(st.step, metrics)
        return verdict

    def _save_checkpoint(self, streams: list[Any]) -> None:
        """Everything :meth:`resume` reads, at this step; ``streams``: every rank's dropout streams."""
        st = self.st
        self.rd.save_checkpoint(
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
                batches_epoch=self.batches.epoch_state(),
                rank_rng=streams,
                **self.guard.state(),
            )
        )


class _Window:
    """The steps since the last log line: their loss, log Z, max logit and gradient norm summed
    on the device (read once, at the log line), and their training targets counted on the host."""

    def __init__(self, device: torch.device):
        self.sums = torch.zeros(4, device=device)  # loss, log Z, max logit, grad norm
        self.steps, self.targets = 0, 0

    def add(self, out: LossOutput, grad_norm: Tensor | None, targets: int) -> None:
        norm = grad_norm.float() if grad_norm is not None else self.sums.new_zeros(())
        self.sums += torch.stack([out.loss.detach(), out.log_z, out.max_logit, norm])
        self.steps += 1
        self.targets += targets

    def means(self) -> list[float]:
        """The window's mean loss, log Z, max logit and gradient norm; the ranks' losses and log Z
        averaged (the global batch's, as one process logs them). The one host sync."""
        self.sums[:2] = distributed.mean_across_ranks(self.sums[:2])
        return (self.sums / self.steps).tolist()

    def loss_and_norm(self) -> list[float]:
        """This rank's mean loss and gradient norm (the divergence guard's)."""
        return (self.sums[[0, 3]] / self.steps).tolist()

    def clear(self) -> None:
        self.sums.zero_()
        self.steps, self.targets = 0, 0


def _log_line(loop: Loop, meter: RunMeter, window: _Window) -> None:
    """Log the window (a metrics row, and rank 0's progress line), check it for divergence and clear it."""
    t, st, world_size = loop.cfg.train, loop.st, loop.dist.world_size
    loss, log_z, max_logit, gnorm = window.means()
    rates = meter.log(window.steps, window.targets * world_size)
    row = {
        "step": st.step,
        "loss": loss,
        "log_z": log_z,
        "max_output_logit": max_logit,
        "grad_norm": gnorm,
        "samples_per_s": round(rates.samples_per_s, 1),
        "targets_per_s": round(rates.targets_per_s, 1),
    }
    attn = max_attention_logit(loop.model)
    if attn is not None:
        row["max_attention_logit"] = float(attn)
    if loop.dist.is_main:
        loop.rd.append_metrics(row)
        left = meter.time_left(
            st.step, st.last_eval, st.bad_evals, st.last_eval > 0, drops_left=t.lr_drops - st.lr_drops
        )
        loop.log(
            f"step {st.step}/{loop.plan.max_steps}  loss {loss:.4f}  logZ {log_z:.2f}  |g| {gnorm:.2f}  "
            f"{rates.describe()}  {left}".rstrip()
        )
    loop.guard.check(st.step, loss, gnorm)
    window.clear()


def optimise(loop: Loop, *, resume: bool = False) -> LoopState:
    """The optimisation loop with periodic logging, validation, checkpoints and early stopping;
    ``resume``: from the run directory's last checkpoint (:meth:`Loop.resume`)."""
    if resume:
        loop.resume()
    t, dist, st, device = loop.cfg.train, loop.dist, loop.st, loop.dist.device
    samples = t.batch_size * dist.world_size
    meter = RunMeter(
        loop.plan, t, start_step=st.step, samples_per_step=samples, clock=time.perf_counter, deadline=loop.deadline
    )
    window, max_steps = _Window(device), loop.plan.max_steps

    def last_minutes(check: bool) -> bool:
        """``train.max_minutes``: whether the time left covers only one last validation and the
        test, each timed by the latest validation (none before the first), on rank 0's clock."""
        if not (check and st.step < max_steps and loop.deadline < math.inf):
            return False
        ending = meter.last_pause * (1 + loop.test_share)
        return distributed.broadcast_flag(time.perf_counter() + ending >= loop.deadline, device)

    while st.step < max_steps:
        log_now = (st.step + 1) % t.log_every == 0 or st.step + 1 == max_steps
        set_track_stats(loop.model, log_now and not loop.step_fn.use_graph)  # max attention logit, on logging steps
        batch = loop.batches.sample(t.batch_size)
        targets = int(np.count_nonzero(batch[2]))  # (position, click) pairs, counted on the host copy
        seq, lengths, target_ids = to_device(batch, device)
        out, grad_norm = loop.step_fn(seq, lengths, target_ids, step=st.step)
        loop.guard.watch(out.loss)
        st.step += 1
        window.add(out, grad_norm, targets)
        if log_now:
            _log_line(loop, meter, window)
        out_of_time = last_minutes(log_now or dist.world_size == 1)  # DDP: agreeing syncs the host
        due = loop.plan.validates_at(st.step, st.last_eval) and (
            st.step >= max_steps or distributed.broadcast_flag(meter.may_validate(), device)  # rank 0's clock
        )
        if not (due or out_of_time):
            continue
        if window.steps:  # the steps since the last log line, before their weights are checkpointed
            loop.guard.check(st.step, *window.loss_and_norm())
        st.last_eval = st.step
        with meter.paused():  # with budget left to use a lower rate, a plateau may drop it
            verdict = loop.validation(can_drop=st.step < max_steps and not out_of_time)
        if out_of_time or last_minutes(True):  # no time left for another: this one was the last
            loop.log(f"stopped at step {st.step}: train.max_minutes={t.max_minutes:g} reached")
            st.out_of_time = True
            break
        if verdict == "stop":  # every rank's verdict: they scored the same top lists
            loop.log(f"early stop at step {st.step}: no {loop.key} improvement in {t.patience} evaluations")
            break
    set_track_stats(loop.model, False)
    if window.steps:  # an early stop between log steps
        meter.log(window.steps, window.targets * dist.world_size)
    st.samples_per_s, st.targets_per_s = dataclasses.astuple(meter.average())  # the run's, not its last window's
    st.cuda_graph = loop.step_fn.use_graph
    return st


HEALTH_LABELS = {
    "mi_eff_clicks": "effective clicks",
    "mi_readout_share_min": "smallest readout share",
    "mi_served_share_min": "smallest served share",
    "mi_cosine": "cosine",
    "mi_planted_recovery": "planted recovered",
}
