"""Training losses (``train.loss``) behind one interface, :class:`CatalogueLoss`, and the loss
functions they are made of (:mod:`recsys.train.losses.functions`).

A training step with shared negatives looks like this (no host sync anywhere)::

    loss = make_loss(cfg, item_counts, device, generator)                     # train.loss, resolved cfg
    negatives, hard_uniforms = loss.draw()                                    # outside a CUDA graph
    user = readout(model.interests(seq, lengths), item_emb[targets])          # [B, d]
    rows = LossRows(user, targets, item_emb, None, interests, mask=None, count=None)
    out = loss(rows, negatives, hard_uniforms)                                # LossOutput
    out.loss.backward()

Built in: ``"softmax"`` (exact or sampled, :mod:`recsys.train.losses.softmax`) and ``"bpr"``
(:mod:`recsys.train.losses.bpr`, also the example of adding one).
"""

from recsys.train.losses import bpr as bpr  # registers "bpr"
from recsys.train.losses import softmax as softmax  # registers "softmax"
from recsys.train.losses.catalogue import CatalogueLoss, LossRows, loss_names, make_loss, register_loss
from recsys.train.losses.functions import (
    CATALOGUE_CHUNK,
    SAMPLER_KINDS,
    LogUniformSampler,
    LossOutput,
    Sampler,
    UniformSampler,
    UnigramSampler,
    attention_collision,
    chunked_softmax_loss,
    draw_from,
    full_softmax_loss,
    interest_cosine,
    interest_proposal,
    make_sampler,
    masked_mean,
    mixture_log_expected_count,
    negative_logits,
    readout,
    readouts,
    sampled_softmax_loss,
)

__all__ = [
    "CATALOGUE_CHUNK",
    "SAMPLER_KINDS",
    "CatalogueLoss",
    "LogUniformSampler",
    "LossOutput",
    "LossRows",
    "Sampler",
    "UniformSampler",
    "UnigramSampler",
    "attention_collision",
    "chunked_softmax_loss",
    "draw_from",
    "full_softmax_loss",
    "interest_cosine",
    "interest_proposal",
    "loss_names",
    "make_loss",
    "make_sampler",
    "masked_mean",
    "mixture_log_expected_count",
    "negative_logits",
    "readout",
    "readouts",
    "register_loss",
    "sampled_softmax_loss",
]
