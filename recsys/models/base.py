"""The interface every model implements, and :func:`build_model`, which builds one from its spec."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from recsys.config import Config, ModelConfig, automatic_keys
from recsys.data.features import ItemFeatures
from recsys.items import FeatureUse, ItemTable, RowUpdates
from recsys.models.spec import spec_for


class InterestModel(nn.Module):
    """A sequence encoder that turns clicks into ``K`` interest vectors.

    Subclasses set ``num_interests`` and implement :meth:`interests` and
    :meth:`item_embeddings`. Item id 0 is padding: its embedding row exists but is never
    retrieved. ``trainable = False`` marks models with nothing to learn (MostPopular).
    """

    num_interests: int = 1
    trainable: bool = True

    def interests(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """``seq [B, L]`` long (right-padded with 0), ``lengths [B]`` long -> ``[B, K, d]``."""
        raise NotImplementedError

    def interests_with_attention(self, seq: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(interests [B, K, d], scores [B, L, K] or None)``.

        ``scores`` say how much each interest reads each click, in click order: interest ``k``
        reads click ``l`` with weight ``softmax over valid l`` of ``scores[b, :, k]``. For models
        whose spec is ``self_attentive`` (:class:`~recsys.models.spec.ModelSpec`, the one place that
        says so) they are the differentiable attention logits; the capsule models
        return their (gradient-free) routing weights in this form; the others return None.
        """
        return self.interests(seq, lengths), None

    def item_embeddings(self) -> Tensor:
        """``[num_items, d]`` output item embeddings (row 0 = padding)."""
        raise NotImplementedError

    def add_item_features(self, features: ItemFeatures, item_counts: Tensor, use: FeatureUse = FeatureUse()) -> None:
        """Represent items by their ids and ``features`` from now on (:meth:`recsys.items.ItemTable.add_features`)."""
        raise ValueError(f"{type(self).__name__} has no item table to add features to")

    def add_new_items(self, features: ItemFeatures) -> None:
        """Retrieve the new items ``features`` lists after the model's catalogue from now on, by their
        features alone (:meth:`recsys.items.ItemTable.add_items`); the model does not train."""
        raise ValueError(f"{type(self).__name__} has no item table to add items to")

    def train_items(self, form: str, updates: RowUpdates) -> ItemTable:
        """Train the model's item table in ``form`` (``train.item_updates``) from now on and return
        it; a model without a table of its own (MostPopular) has nothing to train."""
        raise ValueError(f"{type(self).__name__} has no item table to train")

    def prefix_interests(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """Interests at every prefix, for dense training (``train.predict_at = "all"``):
        ``seq [B, L]``, ``lengths [B]`` -> ``[B, L, K, d]`` where ``[:, t]`` depends on clicks
        ``0..t`` only and equals :meth:`interests` of the sequence cut after click ``t``
        (up to the positions' reference point, see the model). Positions ``t >= length`` are 0.
        Only models whose spec says ``dense`` implement it."""
        raise NotImplementedError(f"{type(self).__name__} cannot train densely (no prefix_interests)")

    def forward(
        self, seq: Tensor, lengths: Tensor, with_attention: bool = False, prefix: bool = False
    ) -> Tensor | tuple[Tensor, Tensor | None]:
        """:meth:`interests`, :meth:`interests_with_attention` or :meth:`prefix_interests`
        (through ``forward`` so that a DistributedDataParallel wrapper sees the call)."""
        if prefix:
            return self.prefix_interests(seq, lengths)
        if with_attention:
            return self.interests_with_attention(seq, lengths)
        return self.interests(seq, lengths)


def build_model(
    cfg: ModelConfig,
    num_items: int,
    max_len: int,
    item_counts: torch.Tensor | None = None,
    features: ItemFeatures | None = None,
) -> InterestModel:
    """Build ``cfg.name`` for a catalogue of ``num_items`` ids (0 = padding), through its spec
    (:mod:`recsys.models.spec`). ``cfg`` is resolved: :func:`recsys.run.settings.resolve` (or
    :func:`~recsys.run.settings.resolve_model` for a model on its own) decided its automatic values
    and checked its settings; a value still automatic is a ``ValueError`` naming it.

    ``item_counts [num_items]`` (click counts) is passed to models that need it (MostPopular).
    ``features`` (``data.item_features``, with ``model.use_features``): a learned model's item table
    represents items by their ids and features, new items by their features alone
    (:mod:`recsys.items.features`; ``item_counts`` are then the training counts that say which
    items have id rows worth reading); MostPopular ranks by clicks and reads no features.
    """
    left = [key for key in automatic_keys(Config(model=cfg)) if key.startswith("model.")]
    if left:
        raise ValueError(
            f"build_model: {', '.join(left)} still automatic; resolve the model's settings first "
            "(recsys.run.settings.resolve_model(cfg, num_items))"
        )
    spec = spec_for(cfg.name)
    if spec.needs_item_counts:
        if item_counts is None:
            raise ValueError(f"model {cfg.name!r} needs item_counts (training click counts per item id)")
        if len(item_counts) != num_items:
            raise ValueError(f"item_counts: expected {num_items} entries (one per item id), got {len(item_counts)}")
    model = spec.build(cfg, num_items, max_len, item_counts)
    if features is not None and cfg.use_features and spec.trainable:
        if item_counts is None:
            raise ValueError("item features need item_counts (training click counts per item id)")
        model.add_item_features(features, item_counts, FeatureUse(cfg.id_dropout, cfg.cold_rows, cfg.cold_scale))
    return model
