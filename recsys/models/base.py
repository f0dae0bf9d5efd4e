"""The interface every model implements, and the registry that builds models by name."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from recsys.config import ModelConfig


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

    def item_embeddings(self) -> Tensor:
        """``[num_items, d]`` output item embeddings (row 0 = padding)."""
        raise NotImplementedError

    def forward(self, seq: Tensor, lengths: Tensor) -> Tensor:
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
    return _REGISTRY[cfg.name](cfg=cfg, num_items=num_items, max_len=max_len, item_counts=item_counts)
