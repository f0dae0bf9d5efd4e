"""BSARec and WEARec: sasrec's encoder with the S3Rec lineage's filter blocks, at their published recipes;
next_mi: K interests on WEARec's encoder and recipe.

Both are :class:`~recsys.models.sasrec.SASRec` (one interest, the encoder's output at the last
click) whose automatic settings are what each paper's logged Amazon Beauty run used, so that
``recsys train --model wearec`` trains that model as published, and every setting can still be
overridden (``--set model.block=pre_norm``). Their blocks read the whole window, so they train on
each window's last position (``train.predict_at`` resolves to ``"last"``), every training target
once an epoch in a fresh order (``train.draw = "epochs"``: the lineage's data loader) from the first
click on (``train.min_target = 1``), with the exact softmax over the catalogue where it is cheap.
Where recsys differs from the published runs (docs/models.md, "Transformer blocks"): padding rows
are zeros in the filters (``model.filter_padding``), the weights are averaged
(``train.ema_decay``, recsys's default, which gained over the last weights) and the run stops on
recsys's validation cadence.

- **bsarec** (Shin et al., AAAI 2024): ``model.filter_alpha`` (0.7) x a low/high-band frequency
  filter (its ``c`` = ``model.filter_cutoff``, 5) + 0.3 x attention, one head, dropout 0.5 on the
  hidden states and the attention probabilities, post-norm blocks, BERT's start, Adam at 5e-4.
- **wearec** (AAAI 2026): 0.2 x an adaptive frequency filter + 0.8 x a Haar wavelet, eight filter
  heads, no attention, otherwise as bsarec.
- **next_mi** (:class:`~recsys.models.sasrec.NextMI`): wearec's encoder and recipe for interest 0,
  the encoder's state at the last click, trained on every target as wearec is; ComiRec-SA's
  self-attentive head over the same states for the other ``K - 1``, with the head's score cap,
  cosine hinge and soft readout.

How they compare with the published runs and with sasrec: docs/results.md, "Under the BSARec
lineage's rules".
"""

from __future__ import annotations

import dataclasses

from recsys.models.sasrec import (
    SELF_ATTENTIVE_TRANSFORMER_SPACE,
    TRANSFORMER_SETTINGS,
    build_next_mi,
    build_sasrec,
)
from recsys.models.spec import DROPOUT_SPACE, SELF_ATTENTIVE_MULTI_INTEREST, Automatic, ModelSpec, register
from recsys.nn.transformer import ATTENTION_SWITCHES

# what the two published runs share (their logged arguments), in recsys's automatic settings
LINEAGE_RECIPE = Automatic(
    dim=64,
    dropout=0.5,
    predict_at="last",
    full_softmax=True,
    epoch_decay=0.0,  # Adam without weight decay
    batch=256,
    lr=5e-4,
    draw="epochs",
    min_target=1,
    block="post_norm",
    init="bert",
)

BSAREC = register(
    ModelSpec(
        name="bsarec",
        build=build_sasrec,
        settings=TRANSFORMER_SETTINGS,
        tune_space=DROPOUT_SPACE,
        automatic=dataclasses.replace(
            LINEAGE_RECIPE, mixer="hybrid", filter_alpha=0.7, num_heads=1, attention_dropout=0.5
        ),
    )
)
WEAREC_BLOCKS = dataclasses.replace(LINEAGE_RECIPE, mixer="wavelet", filter_alpha=0.2, num_heads=8)
WEAREC = register(
    ModelSpec(
        name="wearec",
        build=build_sasrec,
        # its blocks have no attention: the attention's switches are not its settings
        settings=tuple(key for key in TRANSFORMER_SETTINGS if key not in ATTENTION_SWITCHES),
        tune_space=DROPOUT_SPACE,
        automatic=WEAREC_BLOCKS,
    )
)
NEXT_MI = register(
    ModelSpec(
        name="next_mi",
        build=build_next_mi,
        settings=(*TRANSFORMER_SETTINGS, "num_interests", "hidden", "score_cap"),
        multi_interest=True,
        self_attentive=True,
        dense=True,  # with a causal mixer (model.mixer = "attention") it can train every position
        state_interest=True,
        # wearec's blocks and recipe for its state (the best one-vector model under both protocols);
        # the self-attentive head's cap, hinge and soft readout for the other K - 1 interests
        automatic=dataclasses.replace(
            WEAREC_BLOCKS,
            score_cap=SELF_ATTENTIVE_MULTI_INTEREST.score_cap,
            follows_length=SELF_ATTENTIVE_MULTI_INTEREST.follows_length,
            interest_reg=SELF_ATTENTIVE_MULTI_INTEREST.interest_reg,
            soft_readout_steps=SELF_ATTENTIVE_MULTI_INTEREST.soft_readout_steps,
            negative_readout=SELF_ATTENTIVE_MULTI_INTEREST.negative_readout,
            predict_next=1,
        ),
        tune_space=SELF_ATTENTIVE_TRANSFORMER_SPACE,
    )
)
