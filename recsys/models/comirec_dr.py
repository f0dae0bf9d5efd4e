"""ComiRec-DR (Cen et al., KDD 2020): multi-interest extraction by dynamic routing."""

from __future__ import annotations

from torch import Tensor

from recsys.config import ModelConfig
from recsys.models.sequence import SequenceModel
from recsys.models.spec import MULTI_INTEREST_SPACE, ModelSpec, register
from recsys.nn.capsule import CapsuleRouting, routing_scores


class ComiRecDR(SequenceModel):
    """Per-position bilinear predictions, zero initial routing logits, ``iters`` routing iterations.

    Follows ComiRec's ``CapsuleNetwork(bilinear_type=2, relu_layer=False)``: the interests are the
    squashed capsules (norm < 1). See :mod:`recsys.nn.capsule` for the routing and the
    deliberate differences (per-position maps indexed from the latest click by default, initial
    scale of the bilinear weights).
    """

    def __init__(
        self, num_items: int, dim: int, num_interests: int, max_len: int, iters: int, positions: str = "recent"
    ):
        super().__init__(num_items, dim, num_interests)
        self.routing = CapsuleRouting(
            dim,
            num_interests,
            max_len,
            bilinear="per_position",
            init_logits="zeros",
            iters=iters,
            positions=positions,
        )

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self.routing(h, lengths)  # [B, K, d]

    def encode_with_attention(self, h: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        caps, weights = self.routing(h, lengths, return_weights=True)
        return caps, routing_scores(weights)


def build(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> ComiRecDR:
    return ComiRecDR(num_items, cfg.dim, cfg.num_interests, max_len, cfg.routing_iters, cfg.positions)


# routing is iterative over the whole sequence: no cheap prefix form, so it trains on the last position
SPEC = register(
    ModelSpec(
        name="comirec_dr",
        build=build,
        settings=("num_interests", "routing_iters", "positions"),
        multi_interest=True,
        tune_space=MULTI_INTEREST_SPACE,
        saved_defaults={"model.head_values": {"model.positions": "absolute"}},  # its maps ignored positions then
    )
)
