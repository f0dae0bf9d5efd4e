"""ComiRec-SA's self-attentive multi-interest head, on top of ``recsys.kernels.multi_interest``."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from recsys.kernels import cap_scores, causal_multi_interest, length_softmax, multi_interest
from recsys.nn.attention import RecordsMaxLogit
from recsys.nn.masking import length_mask, recency_index
from recsys.nn.positions import POSITIONS


class SelfAttentiveHead(RecordsMaxLogit):
    """``A = softmax_L(tanh((H + P) W1) W2)``, interests ``= Aᵀ H``.

    Args:
        dim: item embedding size ``d``.
        hidden: size of the tanh projection (ComiRec uses ``4 d``).
        num_interests: ``K``.
        max_len: longest sequence, for the learned position embeddings ``P [max_len, d]``.
        backend: kernel backend (``auto | triton | torch``).
        positions: ``recent`` (``P[0]`` marks the most recent click), ``absolute`` (``P[0]`` the
            oldest click of the window), ``alibi`` (no table: interest ``k``'s score of click ``l``
            gains ``m_k · l``, a learned per-interest linear recency bias as in ALiBi, Press et al.,
            ICLR 2022; relative to any prefix end ``t`` it is ``-m_k (t - l)`` up to a constant
            that cancels in the softmax, so every prefix of the dense form sees its own recency)
            or ``none``. ``recent`` reverses each row's valid clicks
            before the kernel, which numbers positions from the start: the interests ``Aᵀ H``
            are a sum over positions, so moving the clicks with their positions changes nothing
            else.
        score_cap: if > 0, scores become ``cap · tanh(S / cap)``: the attention of a head on
            one click is then at most ``e^(2 cap)`` times its attention on any other, so a head
            cannot collapse onto a single click of a long history.

    With ``track_stats = True`` the forward pass also records ``last_max_logit``, the largest
    score ``tanh((H + P) W1) W2`` (capped, as the softmax sees it) over valid positions (detached
    0-d tensor, no host sync), read by ``recsys.nn.attention.max_attention_logit``.
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        num_interests: int,
        max_len: int,
        backend: str = "auto",
        positions: str = "recent",
        score_cap: float = 0.0,
    ):
        super().__init__()
        if positions not in (*POSITIONS, "alibi", "none"):
            raise ValueError(f"model.positions: {positions!r} is not one of {[*POSITIONS, 'alibi', 'none']}")
        self.w1 = nn.Parameter(torch.empty(dim, hidden))
        self.w2 = nn.Parameter(torch.empty(hidden, num_interests))
        self.pos = nn.Parameter(torch.empty(max_len, dim)) if positions in POSITIONS else None
        # ALiBi's geometric slopes 2^(-8 k / K), k = 1..K: from a sharp recency preference to almost none
        self.slopes = (
            nn.Parameter(torch.exp2(-8.0 * torch.arange(1, num_interests + 1) / num_interests))
            if positions == "alibi"
            else None
        )
        self.positions = positions
        self.backend = backend
        self.score_cap = score_cap
        nn.init.xavier_uniform_(self.w1)
        nn.init.xavier_uniform_(self.w2)
        if self.pos is not None:
            nn.init.normal_(self.pos, std=1.0 / math.sqrt(dim))

    def forward(
        self, h: Tensor, lengths: Tensor, values: Tensor | None = None, return_scores: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``h [B, L, d]``, ``lengths [B]`` -> interests ``[B, K, d]``: ``Aᵀ h``, or ``Aᵀ values``
        for ``values [B, L, d]`` (the scores still read ``h``).

        With ``return_scores`` also the attention logits ``S [B, L, K]`` in click order (fp32,
        differentiable; ``A`` is their softmax over each row's valid positions, see
        :func:`recsys.kernels.length_softmax`).
        """
        if self.slopes is not None:  # the bias is not in the fused kernel: its PyTorch form
            return self._alibi_forward(h, lengths, values, return_scores)
        index = None
        if self.positions == "recent":  # row i <- the i-th most recent click
            index = recency_index(lengths, h.shape[1])[..., None]
            h = h.gather(1, index.expand_as(h))
            values = None if values is None else values.gather(1, index.expand_as(values))
        need_scores = return_scores or self.track_stats
        out = multi_interest(
            h,
            lengths,
            self.w1,
            self.w2,
            pos=self.pos,
            values=values,
            backend=self.backend,
            score_cap=self.score_cap,
            return_scores=need_scores,
        )
        if not need_scores:
            return out
        out, scores = out
        if self.track_stats:
            valid = length_mask(lengths, h.shape[1])[..., None]
            self.last_max_logit = scores.detach().masked_fill(~valid, float("-inf")).amax()
        if not return_scores:
            return out
        if index is not None:  # the recency permutation is its own inverse: back to click order
            scores = scores.gather(1, index.expand_as(scores))
        return out, scores

    def scores(self, h: Tensor, lengths: Tensor) -> Tensor:
        """Capped scores ``[B, L, K]`` in click order (what the softmax over the clicks reads):
        ``tanh((H + P) W1) W2``, with ``P`` counted from each row's last click (``recent``) or
        from its first (``absolute``). The same for every prefix of the row, which is what lets
        :meth:`prefix` be one scan."""
        if self.pos is not None:
            if self.positions == "recent":
                h = h + self.pos[recency_index(lengths, h.shape[1])]
            else:
                h = h + self.pos[None, : h.shape[1]]
        s = cap_scores(torch.tanh(h @ self.w1) @ self.w2, self.score_cap)  # [B, L, K]
        if self.slopes is not None:
            s = s + torch.arange(h.shape[1], device=h.device, dtype=s.dtype)[None, :, None] * self.slopes.to(s.dtype)
        return s

    def _alibi_forward(
        self, h: Tensor, lengths: Tensor, values: Tensor | None, return_scores: bool
    ) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`forward` with ALiBi positions: ``A = softmax_L(S)`` over the valid clicks of
        :meth:`scores` (bias included), interests ``Aᵀ H`` ``[B, K, d]``."""
        scores = self.scores(h, lengths).float()  # [B, L, K]
        weights = length_softmax(scores, lengths)
        v = h if values is None else values
        out = torch.einsum("blk,bld->bkd", weights.to(v.dtype), v)
        if self.track_stats:
            valid = length_mask(lengths, h.shape[1])[..., None]
            self.last_max_logit = scores.detach().masked_fill(~valid, float("-inf")).amax()
        return (out, scores) if return_scores else out

    def prefix(self, h: Tensor, lengths: Tensor, values: Tensor | None = None) -> Tensor:
        """Interests at every prefix (dense training): ``h [B, L, d]``, ``lengths [B]`` ->
        ``[B, L, K, d]``, where ``[:, t]`` pools clicks ``0..t`` with the softmax of their
        scores over ``l <= t`` (the causal form of :meth:`forward`; its pooled ``values`` as
        there). With ``recent`` positions the scores count back from the window's last click,
        so ``[:, length - 1]`` equals :meth:`forward` and earlier prefixes see the same
        position vectors as the full window."""
        return causal_multi_interest(
            h if values is None else values, self.scores(h, lengths), lengths, backend=self.backend
        )


def interest_cosines(interests: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's pairwise cosines of its interests: ``interests [R, K, d]`` -> ``(cos [R, K, K]
    float32 or wider, ok [R] bool)``. A row with a zero interest (a fully padded prefix) has no
    direction: ``ok`` is False there and its ``cos`` is 0 with no gradient (normalising it would
    scale its gradient by ``1 / eps``). The interest regulariser and the health metrics read it."""
    x = interests.to(torch.promote_types(interests.dtype, torch.float32))  # bf16 under autocast
    norms = x.norm(dim=2, keepdim=True)  # [R, K, 1]
    ok = (norms > 1e-6).all(dim=1).squeeze(1)  # [R]
    unit = torch.where(ok[:, None, None], x / norms.clamp_min(1e-6), 0.0)  # [R, K, d]
    return unit @ unit.transpose(1, 2), ok
