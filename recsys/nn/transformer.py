"""Pre-LN transformer blocks and a SASRec-style encoder over right-padded click sequences."""

from __future__ import annotations

from torch import Tensor, nn

from recsys.nn.attention import MultiHeadAttention
from recsys.nn.embeddings import PositionEmbedding
from recsys.nn.masking import length_mask


class TransformerBlock(nn.Module):
    """``x + drop(attn(LN(x)))`` then ``x + drop(ffn(LN(x)))``; ``ffn = Linear(d, 4d) → GELU → Linear(4d, d)``.

    Args:
        dim: width ``d``.
        num_heads: attention heads.
        dropout: on the attention and feed-forward outputs (before each residual add).
        qk_norm, softcap, backend: passed to :class:`MultiHeadAttention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        qk_norm: str = "",
        softcap: float = 0.0,
        backend: str = "auto",
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, num_heads, qk_norm=qk_norm, softcap=softcap, backend=backend)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, lengths: Tensor, causal: bool) -> Tensor:
        """``x [B, L, d]``, ``lengths [B]`` -> ``[B, L, d]``."""
        x = x + self.drop(self.attn(self.norm1(x), lengths, causal))
        return x + self.drop(self.ffn(self.norm2(x)))


class TransformerEncoder(nn.Module):
    """Learned positions, ``num_layers`` pre-LN blocks, a final LayerNorm.

    ``forward(h [B, L, d], lengths [B]) -> [B, L, d]``: ``h`` are the (length-masked) item
    embeddings; learned positions (``positions``: ``recent``, ``absolute`` or ``none``, see
    :class:`PositionEmbedding`) are added here, then dropout. Keys at padded positions are masked in
    every layer, and with ``causal`` (SASRec) position ``i`` only sees clicks ``0..i``. Outputs
    at padded positions are set to zero, so they never leak into a downstream head. A row of
    length 0 gives all zeros: attention returns 0 with no visible key and LayerNorm of a
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
        qk_norm: str = "",
        softcap: float = 0.0,
        causal: bool = True,
        backend: str = "auto",
        positions: str = "recent",
    ):
        super().__init__()
        self.causal = causal
        self.pos = None if positions == "none" else PositionEmbedding(max_len, dim, positions)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, num_heads, dropout=dropout, qk_norm=qk_norm, softcap=softcap, backend=backend)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, h: Tensor, lengths: Tensor) -> Tensor:
        seq_len = h.shape[1]
        x = self.drop(h if self.pos is None else h + self.pos(lengths, seq_len))  # [B, L, d]
        for block in self.blocks:
            x = block(x, lengths, self.causal)
        return self.norm(x) * length_mask(lengths, seq_len).to(x.dtype)[..., None]
