"""MIND (Li et al., CIKM 2019) as implemented in ComiRec's code: shared-map capsule routing."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from recsys.config import ModelConfig
from recsys.models.sequence import SequenceModel
from recsys.models.spec import MULTI_INTEREST_SPACE, ModelSpec, register
from recsys.nn.capsule import CapsuleRouting, routing_scores


class MIND(SequenceModel):
    """One shared bilinear map, random initial routing logits, then ``ReLU(Linear(capsule))``.

    Follows ComiRec's ``CapsuleNetwork(bilinear_type=0, relu_layer=True)``. Deliberate
    differences: a fixed number of interests ``K`` (as in ComiRec's code, not MIND's
    per-user ``log2(n)`` rule); no user-profile features; no bias in the shared map; in eval
    mode the initial logits come from a fixed table so interests are deterministic (see
    :mod:`recsys.nn.capsule`); a row of length 0 gives zero interests (instead of
    ``ReLU(bias)``).
    """

    def __init__(self, num_items: int, dim: int, num_interests: int, max_len: int, iters: int):
        super().__init__(num_items, dim, num_interests)
        self.routing = CapsuleRouting(dim, num_interests, max_len, bilinear="shared", init_logits="normal", iters=iters)
        self.proj = nn.Linear(dim, dim)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self._interests(self.routing(h, lengths), lengths)

    def encode_with_attention(self, h: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        caps, weights = self.routing(h, lengths, return_weights=True)
        return self._interests(caps, lengths), routing_scores(weights)

    def _interests(self, caps: Tensor, lengths: Tensor) -> Tensor:
        """Capsules ``[B, K, d]`` -> interests ``ReLU(Linear(caps))``, 0 for empty rows."""
        return torch.relu(self.proj(caps)) * (lengths > 0).to(caps.dtype)[:, None, None]


def build(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> MIND:
    return MIND(num_items, cfg.dim, cfg.num_interests, max_len, cfg.routing_iters)


# routing is iterative over the whole sequence: no cheap prefix form, so it trains on the last position
SPEC = register(
    ModelSpec(
        name="mind",
        build=build,
        settings=("num_interests", "routing_iters"),
        multi_interest=True,
        tune_space=MULTI_INTEREST_SPACE,
    )
)
