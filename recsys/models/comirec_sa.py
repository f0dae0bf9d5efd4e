"""ComiRec-SA (Cen et al., KDD 2020): self-attentive multi-interest extraction."""

from __future__ import annotations

from torch import Tensor

from recsys.config import ModelConfig
from recsys.models.sequence import SequenceModel
from recsys.models.spec import (
    MULTI_INTEREST_SPACE,
    SELF_ATTENTIVE_MULTI_INTEREST,
    SELF_ATTENTIVE_SPACE,
    ModelSpec,
    register,
)
from recsys.nn.multi_interest import SelfAttentiveHead


class ComiRecSA(SequenceModel):
    """``A = softmax_L(tanh((H + P) W1) W2)`` with padding masked; interests ``= Aᵀ H`` ``[B, K, d]``.

    Learned positions ``P`` enter the attention scores only, as in ComiRec's code. Deliberate
    differences: positions count back from the most recent click by default
    (``model.positions = "recent"``; ComiRec's code numbers them from the oldest click of the
    right-padded window, ``"absolute"``, and on taobao its heads then learned to attend to fixed
    window slots: one-hot attention at position 2, see docs/defaults.md, "Positions"); ``W1`` and
    ``W2`` have no bias (ComiRec's ``tf.layers.dense`` layers have one; the bias of ``W2``
    cancels in the softmax over ``L`` anyway, the bias of ``W1`` is dropped). The hidden size
    defaults to ``4 d`` as in ComiRec.
    """

    def __init__(
        self,
        num_items: int,
        dim: int,
        num_interests: int,
        hidden: int,
        max_len: int,
        backend: str,
        positions: str = "recent",
        score_cap: float = 0.0,
    ):
        super().__init__(num_items, dim, num_interests)
        self.head = SelfAttentiveHead(
            dim, hidden, num_interests, max_len, backend=backend, positions=positions, score_cap=score_cap
        )

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self.head(h, lengths)

    def encode_with_attention(self, h: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.head(h, lengths, return_scores=True)

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self.head.prefix(h, lengths)


def build(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> ComiRecSA:
    return ComiRecSA(
        num_items,
        cfg.dim,
        cfg.num_interests,
        cfg.hidden,
        max_len,
        cfg.backend,
        cfg.positions,
        cfg.score_cap,
    )


SPEC = register(
    ModelSpec(
        name="comirec_sa",
        build=build,
        settings=("num_interests", "hidden", "positions", "score_cap"),
        multi_interest=True,
        self_attentive=True,
        dense=True,
        # the defaults against collapse it shares with sasrec_mi (recsys.models.spec)
        automatic=SELF_ATTENTIVE_MULTI_INTEREST,
        tune_space={**MULTI_INTEREST_SPACE, **SELF_ATTENTIVE_SPACE},
    )
)
