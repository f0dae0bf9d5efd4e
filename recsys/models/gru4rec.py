"""GRU4Rec as ComiRec's baseline: a GRU over the history, the state after the last click."""

from __future__ import annotations

from torch import Tensor, nn

from recsys.config import ModelConfig
from recsys.models.sequence import SequenceModel
from recsys.models.spec import ModelSpec, register
from recsys.nn.masking import gather_last, length_mask


class GRU4Rec(SequenceModel):
    """One GRU layer (hidden size ``d``) over the padded sequence; interest = output at ``length - 1``.

    The GRU runs over all ``L`` positions (no packing, so no host sync for the lengths); being
    causal, its output at ``length - 1`` does not depend on the padding after it. A row of
    length 0 gives 0. No dropout, as in ComiRec's baseline.
    """

    def __init__(self, num_items: int, dim: int):
        super().__init__(num_items, dim, num_interests=1)
        self.gru = nn.GRU(dim, dim, batch_first=True)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        out, _ = self.gru(h)  # [B, L, d]
        return gather_last(out, lengths)[:, None]  # [B, 1, d]

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        out, _ = self.gru(h)  # [B, L, d]: the state after clicks 0..t
        return (out * length_mask(lengths, h.shape[1]).to(out.dtype)[..., None])[:, :, None]


def build(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> GRU4Rec:
    return GRU4Rec(num_items, cfg.dim)


SPEC = register(ModelSpec(name="gru4rec", build=build, dense=True))
