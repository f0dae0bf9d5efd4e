"""The shared shape of the learned models: item embeddings in, an encoder, interests out."""

from __future__ import annotations

from torch import Tensor

from recsys.data.features import ItemFeatures
from recsys.items import FeatureUse, ItemTable, RowUpdates
from recsys.models.base import InterestModel
from recsys.nn.masking import check_batch


class SequenceModel(InterestModel):
    """Embeds the clicks with a tied item table, then :meth:`encode` turns them into interests.

    Subclasses implement ``encode(h [B, L, d], lengths [B]) -> [B, K, d]``; ``h`` is already
    zero at padded positions. Contract kept by every subclass: interests never depend on the
    ids at padded positions, and a row of length 0 gives finite (zero) interests.
    """

    def __init__(self, num_items: int, dim: int, num_interests: int):
        super().__init__()
        self.embedding = ItemTable(num_items, dim)
        self.num_interests = num_interests

    def item_embeddings(self) -> Tensor:
        """``[num_items, d]``: the input table itself (tied input/output embeddings); inside a
        training step of a form that gathers rows, the ``[T, d]`` rows the step reads."""
        return self.embedding.weight

    def add_item_features(self, features: ItemFeatures, item_counts: Tensor, use: FeatureUse = FeatureUse()) -> None:
        self.embedding.add_features(features, item_counts, use)

    def add_new_items(self, features: ItemFeatures) -> None:
        self.embedding.add_items(features)

    def train_items(self, form: str, updates: RowUpdates) -> ItemTable:
        """Train the item table in ``form`` (``train.item_updates``) from now on: returns the table
        in that form, which the model then reads (:meth:`recsys.items.ItemTable.trained_as`)."""
        self.embedding = self.embedding.trained_as(form, updates, name="embedding.table.weight")
        return self.embedding

    def interests(self, seq: Tensor, lengths: Tensor) -> Tensor:
        check_batch(seq, lengths)
        return self.encode(self.embedding(seq, lengths), lengths)

    def interests_with_attention(self, seq: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor | None]:
        check_batch(seq, lengths)
        return self.encode_with_attention(self.embedding(seq, lengths), lengths)

    def prefix_interests(self, seq: Tensor, lengths: Tensor) -> Tensor:
        check_batch(seq, lengths)
        return self.encode_prefix(self.embedding(seq, lengths), lengths)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        """``h [B, L, d]`` (masked embeddings), ``lengths [B]`` -> interests ``[B, K, d]``."""
        raise NotImplementedError

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        """``h [B, L, d]``, ``lengths [B]`` -> interests at every prefix ``[B, L, K, d]``
        (:meth:`InterestModel.prefix_interests`); dense-trainable models implement it."""
        raise NotImplementedError(f"{type(self).__name__} cannot train densely (no encode_prefix)")

    def encode_with_attention(self, h: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(interests [B, K, d], attention logits [B, L, K] or None)``; see
        :meth:`InterestModel.interests_with_attention`."""
        return self.encode(h, lengths), None
