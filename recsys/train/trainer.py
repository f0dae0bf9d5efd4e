"""The training loop: sampled softmax with ComiRec's hard readout, validation, early stopping.

One call, :func:`train`, runs a whole experiment from a :class:`~recsys.config.Config`: load and
split the data, build the model, optimise, validate every ``train.eval_every`` steps on the
valid users (Recall@max(topn) with the evaluator), keep the best weights, stop early after
``train.patience`` evaluations without improvement, and finally evaluate the best weights on
the test users. Everything lands in a self-contained run directory (see
:mod:`recsys.train.checkpoint`).

The hot path never syncs the host: losses accumulate on the device and are read every
``train.log_every`` steps; batches are built by vectorised numpy and copied from pinned memory.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from recsys.config import Config
from recsys.data import load_dataset
from recsys.data.batches import TrainSampler
from recsys.data.prepare import Dataset
from recsys.data.split import Split, split_dataset
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.models import InterestModel, build_model
from recsys.train import distributed
from recsys.train.checkpoint import RunDir, capture_rng, make_checkpoint, new_run_dir, restore_rng
from recsys.train.losses import (
    LossOutput,
    full_softmax_loss,
    make_sampler,
    readout,
    sampled_softmax_loss,
)

Log = Callable[[str], None]


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


def resolve_device(pref: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU."""
    if pref == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if pref == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device: 'cuda' requested but no CUDA device is available")
    return torch.device(pref)


def train_item_counts(split: Split, num_items: int) -> Tensor:
    """``[num_items]`` click counts over the training sequences only (no eval leakage)."""
    return torch.from_numpy(np.bincount(split.train_items, minlength=num_items).astype(np.int64))


def make_optimizer(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """Adam/AdamW with the fused implementation on CUDA."""
    cls = torch.optim.AdamW if cfg.train.optimizer == "adamw" else torch.optim.Adam
    extra = {"fused": True} if device.type == "cuda" else {}
    return cls(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, **extra)


class _Step:
    """One optimisation step: batch -> interests -> readout -> loss -> update."""

    def __init__(self, model: InterestModel, forward: torch.nn.Module, cfg: Config, device: torch.device,
                 num_items: int, item_counts: Tensor, generator: torch.Generator):
        # ``forward`` is ``model`` or its DistributedDataParallel wrapper (which syncs gradients).
        self.model, self.forward, self.cfg, self.device = model, forward, cfg, device
        t = cfg.train
        self.num_negatives = t.num_negatives or 10 * t.batch_size
        self.sampler = None if t.full_softmax else make_sampler(
            t.sampler, num_items, item_counts=item_counts, alpha=t.sampler_alpha
        )
        self.generator = generator
        self.amp = t.amp and device.type == "cuda"

    def loss(self, seq: Tensor, lengths: Tensor, targets: Tensor) -> LossOutput:
        """``seq [B, L]``, ``lengths [B]``, ``targets [B]`` on the device -> the loss."""
        t = self.cfg.train
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()
        )
        with autocast:
            interests = self.forward(seq, lengths)  # [B, K, d]
            item_emb = self.model.item_embeddings()  # [N, d]
            user = readout(interests, item_emb[targets])  # [B, d]
            if self.sampler is None:
                return full_softmax_loss(user, targets, item_emb, z_loss=t.z_loss)
            negatives = self.sampler.sample(self.num_negatives, generator=self.generator, device=self.device)
            log_q_t = log_q_n = None
            if t.logq:
                log_q_t = self.sampler.log_expected_count(targets, self.num_negatives)
                log_q_n = self.sampler.log_expected_count(negatives, self.num_negatives)
            return sampled_softmax_loss(
                user, targets, item_emb, negatives,
                log_q_target=log_q_t, log_q_neg=log_q_n,
                remove_accidental_hits=t.remove_accidental_hits, z_loss=t.z_loss,
            )


def _to_device(arrays: tuple[np.ndarray, ...], device: torch.device) -> tuple[Tensor, ...]:
    out = []
    for a in arrays:
        x = torch.from_numpy(a)
        if device.type == "cuda":
            x = x.pin_memory().to(device, non_blocking=True)
        out.append(x)
    return tuple(out)


def train(cfg: Config, *, run_dir: str | None = None, resume: bool = False, log: Log = print) -> TrainResult:
    """Run a whole experiment (train, validate, early-stop, test). See the module docstring.

    Args:
        cfg: the resolved config (saved into the run directory).
        run_dir: where to write; default a new folder under ``cfg.output_dir``.
        resume: continue from ``run_dir``'s last checkpoint; with the same seed the result equals
            an uninterrupted run.
        log: where progress lines go.
    """
    dist = distributed.setup_distributed(cfg.train.device)
    device = dist.device
    torch.manual_seed(cfg.train.seed + dist.rank)
    t0 = time.perf_counter()

    ds: Dataset = load_dataset(cfg)
    split = split_dataset(ds, cfg.data)
    item_counts = train_item_counts(split, ds.num_items)
    model = build_model(cfg.model, ds.num_items, cfg.data.max_len, item_counts=item_counts).to(device)

    if resume and run_dir is None:
        raise ValueError("--resume needs the run directory to continue")
    if run_dir is not None:
        rd = RunDir(run_dir)
    else:
        rd = RunDir(new_run_dir(cfg.output_dir, cfg.name, model=cfg.model.name, dataset=_data_name(cfg)))
    if dist.is_main and not resume:
        rd.save_config(cfg.to_dict())
        ds.save(rd.path / "dataset")
    log(f"run directory: {rd.path}")
    log(f"data: {ds.num_users} users, {ds.num_items - 1} items, {len(ds.items)} clicks; "
        f"train users {len(split.train_users)}, valid {len(split.valid.users)}, test {len(split.test.users)}")

    def validate() -> dict[str, float]:
        return evaluate_with_config(model, split.valid, cfg, item_category=ds.item_category)

    topk = max(cfg.eval.topn)
    key = f"recall@{topk}"
    step = best_step = 0
    best = -math.inf
    bad_evals = 0
    samples_per_s = 0.0

    if model.trainable:
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg.train.seed + 1000 + dist.rank)
        batches = TrainSampler(split.train_indptr, split.train_items, cfg.data.max_len,
                               seed=cfg.train.seed + dist.rank, min_target=cfg.train.min_target)
        trainer_model = model
        if dist.world_size > 1:
            trainer_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = make_optimizer(model, cfg, device)
        stepper = _Step(model, trainer_model, cfg, device, ds.num_items, item_counts.to(device), generator)
        if resume:
            ck = rd.load_checkpoint(map_location=device)
            model.load_state_dict(ck["model"])
            optimizer.load_state_dict(ck["optimizer"])
            step, best, best_step, bad_evals = ck["step"], ck["best"], ck["best_step"], ck["bad_evals"]
            restore_rng(ck["rng"], {"batches": batches.rng}, {"neg": generator})
            rd.rewind_metrics(step)
            log(f"resumed at step {step} (best {key} {best:.4f} at step {best_step})")
        t = cfg.train
        step_fn = torch.compile(stepper.loss, dynamic=False) if t.compile else stepper.loss
        loss_sum = torch.zeros((), device=device)
        logz_sum = torch.zeros((), device=device)
        window_start, window_steps = time.perf_counter(), 0
        run_start_step, run_start = step, time.perf_counter()
        while step < t.max_steps:
            model.train()
            seq, lengths, targets = _to_device(batches.sample(t.batch_size), device)
            out = step_fn(seq, lengths, targets)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            grad_norm = None
            if t.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            optimizer.step()
            step += 1
            window_steps += 1
            loss_sum += out.loss.detach()
            logz_sum += out.log_z
            if step % t.log_every == 0 or step == t.max_steps:
                elapsed = time.perf_counter() - window_start
                samples_per_s = window_steps * t.batch_size * dist.world_size / max(elapsed, 1e-9)
                rate = (step - run_start_step) / max(time.perf_counter() - run_start, 1e-9)
                eta = (t.max_steps - step) / max(rate, 1e-9)
                row = {"step": step, "loss": (loss_sum / window_steps).item(),
                       "log_z": (logz_sum / window_steps).item(), "samples_per_s": round(samples_per_s, 1)}
                if grad_norm is not None:
                    row["grad_norm"] = float(grad_norm)
                if dist.is_main:
                    rd.append_metrics(row)
                    log(f"step {step}/{t.max_steps}  loss {row['loss']:.4f}  logZ {row['log_z']:.2f}  "
                        f"{samples_per_s:,.0f} samples/s  ETA {eta:,.0f}s")
                loss_sum.zero_()
                logz_sum.zero_()
                window_start, window_steps = time.perf_counter(), 0
            if step % t.eval_every == 0 or step == t.max_steps:
                stop = False
                if dist.is_main:
                    metrics = validate()
                    improved = metrics[key] > best
                    if improved:
                        best, best_step, bad_evals = metrics[key], step, 0
                        rd.save_best(model.state_dict())
                    else:
                        bad_evals += 1
                    rd.append_metrics({"step": step, "split": "valid", **metrics})
                    log(f"valid @ {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if "@" in k)
                        + ("  (best)" if improved else f"  (no improvement {bad_evals}/{t.patience})"))
                    rd.save_checkpoint(make_checkpoint(
                        model, optimizer, step=step, best=best, best_step=best_step, bad_evals=bad_evals,
                        rng=capture_rng({"batches": batches.rng}, {"neg": generator}),
                    ))
                    stop = t.patience > 0 and bad_evals >= t.patience
                if distributed.broadcast_flag(stop, device):
                    log(f"early stop at step {step}: no {key} improvement in {t.patience} evaluations")
                    break
        if dist.is_main and rd.has_best():
            model.load_state_dict(rd.load_best(map_location=device))

    test_metrics: dict[str, float] = {}
    if dist.is_main:
        if not model.trainable:
            best = validate()[key]
        test_metrics = evaluate_with_config(model, split.test, cfg, item_category=ds.item_category)
        rd.save_test_metrics(test_metrics)
        if not model.trainable:
            rd.save_best(model.state_dict())
    distributed.cleanup()
    return TrainResult(
        run_dir=str(rd.path), steps=step, best_step=best_step, best_valid=best,
        test_metrics=test_metrics, samples_per_s=samples_per_s, wall_s=time.perf_counter() - t0,
    )


def _data_name(cfg: Config) -> str:
    from pathlib import Path

    return "synthetic" if cfg.data.source == "synthetic" else Path(cfg.data.source).stem
