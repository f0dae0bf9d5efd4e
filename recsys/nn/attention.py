"""Multi-head self-attention on ``recsys.kernels.attention``, with QK-norm and logit soft-capping.

Stability switches (both from ``ModelConfig``):

- ``qk_norm = "rms" | "layer"``: ``q`` and ``k`` are normalised over the head dimension
  (RMSNorm or LayerNorm, each with its own learned scale) before ``q kᵀ``.
- ``softcap = c > 0``: logits ``s = q kᵀ / sqrt(D)`` become ``c · tanh(s / c)`` inside the kernel.

For monitoring, a module with ``track_stats = True`` records ``last_max_logit``: the largest
scaled logit ``q kᵀ / sqrt(D)`` (before the soft-cap) over visible query/key pairs of the last
forward pass, as a detached 0-d tensor (no host sync; ``-inf`` when nothing is visible).
:func:`set_track_stats` and :func:`max_attention_logit` switch and read this on a whole model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from recsys.kernels import attention
from recsys.nn.masking import length_mask

QK_NORMS = ("", "rms", "layer")


def make_qk_norm(kind: str, head_dim: int) -> nn.Module | None:
    """``"rms"`` -> ``RMSNorm``, ``"layer"`` -> ``LayerNorm`` over ``head_dim``; ``""`` -> None."""
    if kind not in QK_NORMS:
        raise ValueError(f"qk_norm must be one of {QK_NORMS}, got {kind!r}")
    if kind == "rms":
        return nn.RMSNorm(head_dim, eps=1e-6)
    if kind == "layer":
        return nn.LayerNorm(head_dim, eps=1e-6)
    return None


def visible_max_logit(q: Tensor, k: Tensor, lengths: Tensor, causal: bool, scale: float) -> Tensor:
    """Largest ``scale · q kᵀ`` over visible pairs: ``q, k [B, H, L, D]`` -> detached 0-d tensor."""
    with torch.no_grad():
        s = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [B, H, Lq, Lk]
        lq, lk = s.shape[-2:]
        visible = length_mask(lengths, lk)[:, None, None, :]  # [B, 1, 1, Lk]
        if causal:  # and the query rows past the length are padding, as in the kernel
            visible = visible & torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril()
            visible = visible & length_mask(lengths, lq)[:, None, :, None]
        return s.masked_fill(~visible, float("-inf")).amax()


class RecordsMaxLogit(nn.Module):
    """A module whose forward records its largest attention logit in ``last_max_logit``
    (detached 0-d) while ``track_stats`` is on: see :func:`set_track_stats` and
    :func:`max_attention_logit`."""

    def __init__(self) -> None:
        super().__init__()
        self.track_stats = False
        self.last_max_logit: Tensor | None = None


class MultiHeadAttention(RecordsMaxLogit):
    """Self-attention over right-padded sequences: ``x [B, L, d]``, ``lengths [B]`` -> ``[B, L, d]``.

    Keys at positions ``>= lengths[b]`` are masked; with ``causal`` query ``i`` sees keys
    ``j <= i`` and the query rows ``i >= lengths[b]`` are padding. Rows with no visible key (causal:
    the padded rows) get a zero attention output (the kernel's contract).
    ``dropout`` drops attention probabilities while training (BERT's and SASRec's attention
    dropout); the kernels do not implement it, so a module with ``dropout > 0`` trains on the
    attention's PyTorch twin and evaluates on the kernels. The transformer block applies its own
    dropout to this module's output.

    Args:
        dim: model width ``d`` (divisible by ``num_heads``).
        num_heads: ``H``; head size ``D = d / H``.
        qk_norm: ``"" | "rms" | "layer"``.
        softcap: attention logit soft-cap ``c``; 0 disables.
        backend: kernel backend, ``auto | triton | torch``.
        dropout: attention-probability dropout while training.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        qk_norm: str = "",
        softcap: float = 0.0,
        backend: str = "auto",
        dropout: float = 0.0,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"num_heads {num_heads} does not divide dim {dim}")
        if softcap < 0:
            raise ValueError(f"softcap must be >= 0, got {softcap}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.softcap = softcap
        self.backend = backend
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.q_norm = make_qk_norm(qk_norm, self.head_dim)
        self.k_norm = make_qk_norm(qk_norm, self.head_dim)

    def forward(self, x: Tensor, lengths: Tensor, causal: bool = False) -> Tensor:
        b, seq_len, dim = x.shape
        qkv = self.qkv(x).view(b, seq_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, L, D]
        if self.q_norm is not None and self.k_norm is not None:  # in at least fp32, back to the kernel's dtype
            wide = torch.promote_types(v.dtype, torch.float32)
            q, k = self.q_norm(q.to(wide)).to(v.dtype), self.k_norm(k.to(wide)).to(v.dtype)
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.track_stats:
            self.last_max_logit = visible_max_logit(q, k, lengths, causal, scale)
        o = attention(
            q,
            k,
            v,
            key_lengths=lengths,
            causal=causal,
            scale=scale,
            softcap=self.softcap or None,
            backend=self.backend,
            dropout=self.dropout if self.training else 0.0,
        )  # [B, H, L, D]
        return self.out(o.transpose(1, 2).reshape(b, seq_len, dim))


def set_track_stats(model: nn.Module, on: bool) -> None:
    """Switch ``last_max_logit`` recording on or off in every attention module of ``model``."""
    for module in model.modules():
        if isinstance(module, RecordsMaxLogit):
            module.track_stats = on
            if not on:
                module.last_max_logit = None


def max_attention_logit(model: nn.Module) -> Tensor | None:
    """Largest ``last_max_logit`` over ``model``'s attention modules (detached 0-d), or None.

    Set :func:`set_track_stats` before the forward pass whose logits should be measured.
    """
    values = [
        m.last_max_logit for m in model.modules() if isinstance(m, RecordsMaxLogit) and m.last_max_logit is not None
    ]
    return torch.stack(values).amax() if values else None
