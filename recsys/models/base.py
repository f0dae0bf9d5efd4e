"""The interface every model implements, and the registry that builds models by name."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor, nn

from recsys.config import SCORE_CAP_MODELS, ModelConfig, resolved_score_cap


class InterestModel(nn.Module):
    """A sequence encoder that turns clicks into ``K`` interest vectors.

    Subclasses set ``num_interests`` and implement :meth:`interests` and
    :meth:`item_embeddings`. Item id 0 is padding: its embedding row exists but is never
    retrieved. ``trainable = False`` marks models with nothing to learn (MostPopular).
    """

    num_interests: int = 1
    trainable: bool = True
    has_attention: bool = False  # differentiable attention over the clicks (train.attention_reg applies)

    def interests(self, seq: Tensor, lengths: Tensor) -> Tensor:
        """``seq [B, L]`` long (right-padded with 0), ``lengths [B]`` long -> ``[B, K, d]``."""
        raise NotImplementedError

    def interests_with_attention(self, seq: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(interests [B, K, d], scores [B, L, K] or None)``.

        ``scores`` say how much each interest reads each click, in click order: interest ``k``
        reads click ``l`` with weight ``softmax over valid l`` of ``scores[b, :, k]``. For models
        with ``has_attention`` they are the differentiable attention logits; the capsule models
        return their (gradient-free) routing weights in this form; the others return None.
        """
        return self.interests(seq, lengths), None

    def item_embeddings(self) -> Tensor:
        """``[num_items, d]`` output item embeddings (row 0 = padding)."""
        raise NotImplementedError

    def forward(self, seq: Tensor, lengths: Tensor, with_attention: bool = False):
        """:meth:`interests`, or :meth:`interests_with_attention` (through ``forward`` so that a
        DistributedDataParallel wrapper sees the call)."""
        if with_attention:
            return self.interests_with_attention(seq, lengths)
        return self.interests(seq, lengths)


ModelFactory = Callable[..., InterestModel]
_REGISTRY: dict[str, ModelFactory] = {}


def register(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Class decorator: make a model buildable as ``model.name = <name>``."""

    def deco(factory: ModelFactory) -> ModelFactory:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def model_names() -> list[str]:
    return sorted(_REGISTRY)


def build_model(
    cfg: ModelConfig, num_items: int, max_len: int, item_counts: torch.Tensor | None = None
) -> InterestModel:
    """Build ``cfg.name`` for a catalogue of ``num_items`` ids (0 = padding).

    ``item_counts [num_items]`` (click counts) is passed to models that need it (MostPopular).
    """
    import recsys.models  # noqa: F401  (registers the built-in models)

    if cfg.name not in _REGISTRY:
        raise ValueError(f"model.name: unknown model {cfg.name!r}; known: {', '.join(model_names())}")
    if cfg.head_values != "items" and cfg.name != "sasrec_mi":
        raise ValueError(f"model.head_values={cfg.head_values!r} has no effect on {cfg.name} (only sasrec_mi's "
                         "head can pool encoder outputs); leave it at \"items\"")
    cfg = dataclasses.replace(cfg, score_cap=resolved_score_cap(cfg))
    if cfg.score_cap > 0 and cfg.name not in SCORE_CAP_MODELS:
        raise ValueError(f"model.score_cap={cfg.score_cap!r} has no effect on {cfg.name} (only comirec_sa and "
                         "sasrec_mi have self-attentive interest scores); set it to 0")
    return _REGISTRY[cfg.name](cfg=cfg, num_items=num_items, max_len=max_len, item_counts=item_counts)
