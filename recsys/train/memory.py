"""An early memory estimate: refuse a training config that cannot fit before it is started.

Without it, ``train.batch_size=65536`` at 64 interests on the synthetic data is killed by the operating
system's out-of-memory killer minutes later, with no message. The estimate is deliberately
simple (float32 everywhere, the largest tensors of one training step and one evaluation
batch); it is meant to catch settings that are off by orders of magnitude, not to predict
usage to the byte, so a config is refused only when the estimate exceeds the memory that is
free on the training device.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from recsys.config import Config, ConfigError, require_resolved
from recsys.train.losses import CATALOGUE_CHUNK

__all__ = ["available_bytes", "check_fits", "estimate_bytes"]

_FLOAT = 4  # bytes
_GIB = 1024**3


def estimate_bytes(
    cfg: Config, num_params: int, num_items: int, num_interests: int, world_size: int = 1
) -> dict[str, int]:
    """The largest memory users of training and evaluation, in bytes, by name, on each process
    (the resolved ``train.num_negatives`` is the global batch's, which the processes share).

    Args:
        cfg: the resolved run config (batch sizes, ``max_len``, dim, hidden, negatives, top-N).
        num_params: trainable parameters of the built model (weights, gradients and two Adam
            moments are kept for each, and their average with ``train.ema_decay``; a row-sparse
            item table keeps no gradient, and a sharded one keeps its moments and average for
            ``1 / world_size`` of its rows).
        num_items: catalogue size (with padding).
        num_interests: K of the built model (1 for single-interest models).
        world_size: the torchrun processes sharing a sharded item table's optimiser state.
    """
    require_resolved(cfg, "estimate_bytes")
    m, t, e = cfg.model, cfg.train, cfg.eval
    b, seq_len, k, d = t.batch_size, cfg.data.max_len, num_interests, m.dim
    # the exact softmax holds one chunk of the catalogue's logits at a time
    negatives = min(num_items, CATALOGUE_CHUNK) if t.full_softmax else t.num_negatives
    positions = b * seq_len if t.predict_at == "all" else b  # dense training: a target at every position
    rows = positions * t.predict_next  # loss rows: one for each of a position's following clicks
    # forward activations kept for backward, and their gradients: x 3
    step = 3 * b * (seq_len * (m.hidden + k) + k * d + m.num_layers * seq_len * d * 12) + 2 * rows * (negatives + 1)
    if t.predict_at == "all":  # interests at every prefix, and the causal twin's [B, K, L, L] weights
        step += 3 * positions * k * d + 2 * b * k * seq_len * seq_len
    if t.predict_next > 1:  # the interests repeated for each following click
        step += 3 * rows * k * d
    if t.negative_readout == "max" and k > 1:
        # every interest's score of every negative, once per position whatever train.predict_next (the PyTorch
        # twin; the bf16/fp16 CUDA kernel keeps none)
        step += 2 * positions * k * negatives
    if t.hard_negatives and not t.full_softmax:
        step += 2 * b * k * num_items  # the hard-negative proposal's scores and softmax over the catalogue
    eval_batch = e.batch_size * k * (d + 3 * max(e.topn))  # interests and per-interest search results
    per_param = 5 if t.ema_decay else 4  # weight, gradient, two Adam moments, the average
    state = per_param * num_params * _FLOAT
    if t.item_updates in ("sparse", "sharded"):  # the item table keeps no gradient, but a step counter per row
        state += num_items * (8 - d * _FLOAT)
    if t.item_updates == "sharded":  # each process keeps its 1 / world_size of the rows' moments, average, counters
        state -= round(num_items * (1 - 1 / world_size) * ((per_param - 2) * d * _FLOAT + 8))
    return {
        "parameters and optimizer state": state,
        "training step activations": (step + negatives * d) * _FLOAT,
        "evaluation batch": eval_batch * _FLOAT,
    }


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's free memory, or the host's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(
    cfg: Config,
    model: torch.nn.Module,
    num_items: int,
    device: torch.device,
    available: int | None = None,
    *,
    step_kept: bool = False,
    world_size: int = 1,
) -> int:
    """Raise :class:`ConfigError` when :func:`estimate_bytes` for ``model`` (``cfg`` resolved) exceeds the memory
    ``available`` on ``device`` (default: :func:`available_bytes`); returns the estimate.

    ``step_kept``: the training step's memory stays allocated during evaluation (a captured
    CUDA graph keeps its memory pool), so the two add up instead of taking turns. ``world_size``:
    the processes sharing a sharded item table (:func:`estimate_bytes`).
    """
    num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    parts = estimate_bytes(cfg, num_params, num_items, int(getattr(model, "num_interests", 1)), world_size)
    step, evaluation = parts["training step activations"], parts["evaluation batch"]
    total = parts["parameters and optimizer state"] + (step + evaluation if step_kept else max(step, evaluation))
    available = available_bytes(device) if available is None else available
    if total > available:
        m = cfg.model
        raise ConfigError(
            f"model.num_interests={m.num_interests}, model.dim={m.dim}, train.batch_size={cfg.train.batch_size}, "
            + (f"train.hard_negatives={cfg.train.hard_negatives:g}, " if cfg.train.hard_negatives else "")
            + f"eval.batch_size={cfg.eval.batch_size}, {num_items - 1:,} items: needs about {total / _GIB:,.1f} GiB "
            f"({', '.join(f'{name} {v / _GIB:,.1f}' for name, v in parts.items())}), more than the "
            f"{available / _GIB:,.1f} GiB free on {device}; lower one of them"
        )
    return total
