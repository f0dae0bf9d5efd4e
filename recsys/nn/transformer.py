"""Transformer blocks and a SASRec-style encoder over right-padded click sequences.

A block is a token mixer and a feed-forward network, each with a residual and a norm; the
transformer models choose both parts (``[model]`` settings, one :class:`EncoderShape`):

- the **mixer**: ``"attention"`` (self-attention on our kernels), ``"frequency"`` (BSARec's
  low/high-band filter, :mod:`recsys.nn.frequency`), ``"hybrid"`` (BSARec's mix:
  ``α · filter + (1 - α) · attention``) or ``"wavelet"`` (WEARec's adaptive frequency filter and
  Haar wavelet, no attention: :mod:`recsys.nn.wavelet`);
- the **block form**: ``"pre_norm"`` (``x + drop(f(LN(x)))``, a final LayerNorm; the default),
  ``"post_norm"`` (``LN(x + drop(f(x)))`` after a LayerNorm of the embeddings, no final norm: BERT's
  form, which SASRec's original code, S3Rec, FMLP-Rec and BSARec use) or ``"ligr"`` (LiGR, Borisyuk
  et al. 2025, as eSASRec uses it: pre-norm with sigmoid-gated residuals
  ``x + σ(W x) ⊙ drop(f(LN(x)))`` and a SwiGLU feed-forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recsys.nn.attention import MultiHeadAttention
from recsys.nn.frequency import FrequencyFilter
from recsys.nn.masking import length_mask
from recsys.nn.positions import PositionEmbedding
from recsys.nn.wavelet import WaveletFilter

MIXERS = ("attention", "frequency", "hybrid", "wavelet")
ATTENTION_MIXERS = ("attention", "hybrid")  # the mixers with an attention branch
# settings that act on the attention branch alone: a mixer without one refuses them
ATTENTION_SWITCHES = ("qk_norm", "softcap", "attention_dropout")
BLOCKS = ("pre_norm", "post_norm", "ligr")
FILTER_PADDING = ("zero", "window")
# BERT's LayerNorm epsilon, which the post-norm lineage (S3Rec, FMLP-Rec, BSARec) keeps
POST_NORM_EPS = 1e-12


@dataclass(frozen=True)
class EncoderShape:
    """How each block is built (the ``[model]`` settings of the transformer family).

    Attributes:
        mixer: ``"attention" | "frequency" | "hybrid" | "wavelet"``.
        block: ``"pre_norm" | "post_norm" | "ligr"``.
        filter_cutoff: BSARec's ``c``: the low band keeps ``c // 2 + 1`` frequencies.
        filter_alpha: the weight ``α`` of the frequency filter: against attention in the hybrid
            (BSARec's ``alpha``), against the Haar branch in the wavelet mixer (WEARec's ``alpha``).
        filter_causal: each position filters the window that ends there (:mod:`recsys.nn.frequency`),
            so the model can train on every position.
        filter_padding: ``"zero"`` (the whole-window filters read zeros at padding rows) or
            ``"window"`` (they read the rows the encoder computed there, as the published blocks do:
            :mod:`recsys.nn.frequency`).
        attention_dropout: attention-probability dropout (training only).
        qk_norm, softcap, backend: those of :class:`MultiHeadAttention`.
    """

    mixer: str = "attention"
    block: str = "pre_norm"
    filter_cutoff: int = 5
    filter_alpha: float = 0.7
    filter_causal: bool = False
    filter_padding: str = "zero"
    attention_dropout: float = 0.0
    qk_norm: str = ""
    softcap: float = 0.0
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS:
            raise ValueError(f"model.mixer: {self.mixer!r} is not one of {list(MIXERS)}")
        if self.block not in BLOCKS:
            raise ValueError(f"model.block: {self.block!r} is not one of {list(BLOCKS)}")
        if abs(self.filter_alpha - 0.5) > 0.5:  # outside [0, 1]
            raise ValueError(f"model.filter_alpha: must be in [0, 1], got {self.filter_alpha}")
        if self.filter_causal and self.mixer == "wavelet":
            raise ValueError("model.filter_causal: the wavelet mixer has no causal form (recsys.nn.wavelet)")
        if self.mixer not in ATTENTION_MIXERS:  # its switches would silently do nothing
            for key in ATTENTION_SWITCHES:
                if getattr(self, key):
                    raise ValueError(f"model.{key}: model.mixer={self.mixer!r} has no attention to apply it to")
        if self.filter_padding not in FILTER_PADDING:
            raise ValueError(f"model.filter_padding: {self.filter_padding!r} is not one of {list(FILTER_PADDING)}")
        if self.filter_causal and self.filter_padding == "window":
            raise ValueError('model.filter_padding="window" reads a whole window; the causal filter has no such form')

    @property
    def causal_mixer(self) -> bool:
        """Whether position ``t``'s output reads clicks ``<= t`` only (the window filter reads the whole window)."""
        return self.mixer == "attention" or self.filter_causal


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) ⊙ up(x))``: ``[..., d] -> [..., d]`` through ``inner`` features, no biases
    (Shazeer 2020; LiGR's and eSASRec's feed-forward)."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.gate = nn.Linear(dim, inner, bias=False)
        self.up = nn.Linear(dim, inner, bias=False)
        self.down = nn.Linear(inner, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class TransformerBlock(nn.Module):
    """One block: the token mixer then a feed-forward network of ``4d`` inner features
    (``Linear → GELU → Linear``; SwiGLU in ``ligr``).

    ``pre_norm``: ``x + drop(mix(LN(x)))`` then ``x + drop(ffn(LN(x)))``, where the hybrid's
    ``mix(u) = α · filter(u) + (1 - α) · attn(u)``. ``ligr``: the same with each residual branch
    scaled by a gate read from the stream, ``x + σ(W_g x + b_g) ⊙ drop(branch)``, so a block can
    pass its input through untouched where a branch does not help. ``post_norm`` (BSARec's form):
    each mixer branch is ``LN_b(x + drop(b(x)))`` with its own norm, mixed ``α : 1 - α``, then
    ``LN(y + drop(ffn(y)))``.

    Args:
        dim: width ``d``.
        num_heads: attention heads (the wavelet mixer's filter heads).
        max_len: the window's rows (the wavelet mixer's parameters are per row).
        dropout: on each branch's output, before its residual add.
        shape: the mixer and the block form (:class:`EncoderShape`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        max_len: int = 0,
        dropout: float = 0.0,
        shape: EncoderShape = EncoderShape(),
    ):
        super().__init__()
        self.post = shape.block == "post_norm"
        eps = POST_NORM_EPS if self.post else 1e-5
        self.alpha = shape.filter_alpha  # the hybrid's weight of the filter
        self.attn = None
        if shape.mixer in ATTENTION_MIXERS:
            self.attn = MultiHeadAttention(
                dim,
                num_heads,
                qk_norm=shape.qk_norm,
                softcap=shape.softcap,
                backend=shape.backend,
                dropout=shape.attention_dropout,
            )
        self.filter = _filter(dim, num_heads, max_len, shape)
        self.norm1 = nn.LayerNorm(dim, eps=eps)  # pre: before the mixer; post: after the attention branch
        self.filter_norm = nn.LayerNorm(dim, eps=eps) if self.post and self.filter is not None else None
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        ligr = shape.block == "ligr"
        self.ffn = (
            SwiGLU(dim, 4 * dim) if ligr else nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        )
        self.mix_gate = nn.Linear(dim, dim) if ligr else None
        self.ffn_gate = nn.Linear(dim, dim) if ligr else None
        self.drop = nn.Dropout(dropout)

    def _branches(self, x: Tensor, lengths: Tensor, causal: bool) -> tuple[Tensor | None, Tensor | None]:
        """The attention and the filter of ``x [B, L, d]`` (None where the mixer has no such branch)."""
        attn = None if self.attn is None else self.attn(x, lengths, causal)
        filt = None if self.filter is None else self.filter(x, lengths)
        return attn, filt

    def _mix(self, attn: Tensor | None, filt: Tensor | None) -> Tensor:
        """``α · filt + (1 - α) · attn`` over the branches the mixer has (one of them alone as it is)."""
        if filt is None or attn is None:
            out = attn if filt is None else filt
            assert out is not None  # a mixer has at least one branch
            return out
        return self.alpha * filt + (1 - self.alpha) * attn

    def forward(self, x: Tensor, lengths: Tensor, causal: bool) -> Tensor:
        """``x [B, L, d]``, ``lengths [B]`` -> ``[B, L, d]``."""
        if self.post:
            attn, filt = self._branches(x, lengths, causal)
            y = self._mix(
                None if attn is None else self.norm1(x + self.drop(attn)),
                None if filt is None or self.filter_norm is None else self.filter_norm(x + self.drop(filt)),
            )
            return self.norm2(y + self.drop(self.ffn(y)))
        mixed = self._mix(*self._branches(self.norm1(x), lengths, causal))
        x = x + _gated(self.mix_gate, x, self.drop(mixed))
        return x + _gated(self.ffn_gate, x, self.drop(self.ffn(self.norm2(x))))


def _filter(dim: int, num_heads: int, max_len: int, shape: EncoderShape) -> nn.Module | None:
    """The mixer's filter branch: BSARec's (``frequency``, ``hybrid``), WEARec's (``wavelet``), or none."""
    if shape.mixer in ("frequency", "hybrid"):
        pads, width = shape.filter_padding == "window", max_len if max_len >= 1 else None
        return FrequencyFilter(dim, shape.filter_cutoff, shape.filter_causal, pads=pads, width=width)
    if shape.mixer == "wavelet":
        if max_len < 1:
            raise ValueError("the wavelet mixer needs the window's max_len")
        return WaveletFilter(dim, num_heads, max_len, shape.filter_alpha, pads=shape.filter_padding == "window")
    return None


def _gated(gate: nn.Linear | None, stream: Tensor, branch: Tensor) -> Tensor:
    """LiGR's residual branch ``σ(gate(stream)) ⊙ branch``; the branch itself without a gate."""
    return branch if gate is None else torch.sigmoid(gate(stream)) * branch


class TransformerEncoder(nn.Module):
    """Learned positions, ``num_layers`` blocks of one :class:`EncoderShape`, and a norm.

    ``forward(h [B, L, d], lengths [B]) -> [B, L, d]``: ``h`` are the (length-masked) item
    embeddings; learned positions (``positions``: ``recent``, ``absolute`` or ``none``, see
    :class:`PositionEmbedding`) are added here, then (post-norm blocks) a LayerNorm, then dropout.
    Pre-norm blocks end in a final LayerNorm. Keys at padded positions are masked in every layer,
    and with ``causal`` (SASRec) attention at position ``i`` only sees clicks ``0..i`` (the
    frequency filter reads the whole window: :mod:`recsys.nn.frequency`). Outputs at padded
    positions are set to zero, so they never leak into a downstream head. A row of length 0 gives
    all zeros: attention returns 0 with no visible key, the filter reads zeros, and LayerNorm of a
    constant vector is finite.
    """

    def __init__(
        self,
        dim: int,
        num_layers: int,
        num_heads: int,
        max_len: int,
        *,
        dropout: float = 0.0,
        causal: bool = True,
        positions: str = "recent",
        shape: EncoderShape = EncoderShape(),
    ):
        super().__init__()
        self.causal = causal
        self.pos = None if positions == "none" else PositionEmbedding(max_len, dim, positions)
        post = shape.block == "post_norm"
        self.embed_norm = nn.LayerNorm(dim, eps=POST_NORM_EPS) if post else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, num_heads, max_len=max_len, dropout=dropout, shape=shape) for _ in range(num_layers)
        )
        self.norm = None if post else nn.LayerNorm(dim)

    def forward(self, h: Tensor, lengths: Tensor) -> Tensor:
        seq_len = h.shape[1]
        mask = length_mask(lengths, seq_len).to(h.dtype)[..., None]  # [B, L, 1]
        h = h * mask  # padding rows hold their positions only (what a filter reading them sees)
        x = h if self.pos is None else h + self.pos(lengths, seq_len)  # [B, L, d]
        x = self.drop(x if self.embed_norm is None else self.embed_norm(x))
        for block in self.blocks:
            x = block(x, lengths, self.causal)
        x = x if self.norm is None else self.norm(x)
        return x * mask.to(x.dtype)
