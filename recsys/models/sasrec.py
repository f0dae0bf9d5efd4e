"""SASRec-style causal transformer encoders: single-interest ``sasrec`` and multi-interest ``sasrec_mi``."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from recsys.config import ModelConfig
from recsys.items import ItemTable
from recsys.models.sequence import SequenceModel
from recsys.models.spec import (
    DROPOUT_SPACE,
    MULTI_INTEREST_SPACE,
    SELF_ATTENTIVE_MULTI_INTEREST,
    SELF_ATTENTIVE_SPACE,
    Automatic,
    ModelSpec,
    register,
)
from recsys.nn.masking import gather_last
from recsys.nn.multi_interest import SelfAttentiveHead
from recsys.nn.positions import PositionEmbedding
from recsys.nn.transformer import EncoderShape, TransformerEncoder


def encoder_shape(cfg: ModelConfig) -> EncoderShape:
    """The transformer family's block settings of ``cfg``."""
    return EncoderShape(
        mixer=cfg.mixer,
        block=cfg.block,
        filter_cutoff=cfg.filter_cutoff,
        filter_alpha=cfg.filter_alpha,
        filter_causal=cfg.filter_causal,
        filter_padding=cfg.filter_padding,
        attention_dropout=cfg.attention_dropout,
        qk_norm=cfg.qk_norm,
        softcap=cfg.softcap,
        backend=cfg.backend,
    )


def _encoder(cfg: ModelConfig, max_len: int) -> TransformerEncoder:
    return TransformerEncoder(
        cfg.dim,
        cfg.num_layers,
        cfg.num_heads,
        max_len,
        dropout=cfg.dropout,
        causal=True,
        positions=cfg.positions,
        shape=encoder_shape(cfg),
    )


BERT_INIT_STD = 0.02  # BERT's initializer_range, which S3Rec, FMLP-Rec and BSARec keep


def bert_init(model: nn.Module) -> None:
    """BERT's initial weights on ``model``: every Linear and embedding table ``N(0, 0.02)``, Linear
    biases 0, LayerNorms 1 and 0; the item table's padding row stays 0 (``model.init = "bert"``).
    recsys's own start (``"scaled"``) draws item rows ``N(0, 1/d)`` so that the first logits have
    unit scale; BERT's smaller rows move faster under Adam, whose steps do not scale with the rows."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=BERT_INIT_STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, ItemTable):
            module.init_normal(BERT_INIT_STD)  # its padding row stays 0
        elif isinstance(module, PositionEmbedding):
            nn.init.normal_(module.weight, std=BERT_INIT_STD)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class SASRec(SequenceModel):
    """Causal pre-LN transformer over the clicks; the interest is the output at ``length - 1``.

    Differences from Kang & McAuley's SASRec: pre-LN blocks with a GELU feed-forward of width
    ``4d``, no ``sqrt(d)`` embedding scale, no attention-probability dropout, and the loss is the
    trainer's softmax (by default exact below 100,000 items on CUDA and 10,000 on the CPU, sampled
    above: ``train.full_softmax``)
    at every position of the window (``train.predict_at = "all"``, its default) rather than BCE with one negative.
    """

    def __init__(self, num_items: int, cfg: ModelConfig, max_len: int):
        super().__init__(num_items, cfg.dim, num_interests=1)
        self.encoder = _encoder(cfg, max_len)
        self.mixer, self.causal = cfg.mixer, encoder_shape(cfg).causal_mixer
        if cfg.init == "bert":
            bert_init(self)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        return gather_last(self.encoder(h, lengths), lengths)[:, None]  # [B, 1, d]

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        if not self.causal:  # a whole-window filter: position t would read the clicks after it
            raise NotImplementedError(f"model.mixer={self.mixer!r} reads the whole window: no prefix_interests")
        return self.encoder(h, lengths)[:, :, None]  # [B, L, 1, d]; causal, 0 at padding


class SASRecMI(SequenceModel):
    """The :class:`SASRec` encoder feeding ComiRec-SA's self-attentive head.

    The head's scores read the encoded states ``E`` (plus its own learned positions); what it
    pools is ``model.head_values``: ``"items"`` (default) pools the item embeddings ``H``, so
    interests ``= softmax_L(tanh((E + P) W1) W2)ᵀ H`` ``[B, K, d]`` stay convex combinations of
    item embeddings as in comirec_sa, with the transformer deciding where to attend;
    ``"encoded"`` pools ``E`` itself. On amazon-beauty "items" gave 7.7% more test Recall@50
    than "encoded" (docs/defaults.md, "Positions"). The fused Triton multi-interest kernel pools its own
    input, so "items" runs the head's PyTorch twin.
    """

    def __init__(self, num_items: int, cfg: ModelConfig, max_len: int):
        super().__init__(num_items, cfg.dim, num_interests=cfg.num_interests)
        self.encoder = _encoder(cfg, max_len)
        self.head = SelfAttentiveHead(
            cfg.dim,
            cfg.hidden,
            cfg.num_interests,
            max_len,
            backend=cfg.backend,
            positions=cfg.positions,
            score_cap=cfg.score_cap,
        )
        self.head_values = cfg.head_values
        if cfg.init == "bert":
            bert_init(self)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self.head(self.encoder(h, lengths), lengths, values=h if self.head_values == "items" else None)

    def encode_with_attention(self, h: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        values = h if self.head_values == "items" else None
        return self.head(self.encoder(h, lengths), lengths, values=values, return_scores=True)

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self.head.prefix(self.encoder(h, lengths), lengths, values=h if self.head_values == "items" else None)


class NextMI(SequenceModel):
    """A multi-interest model that gives up nothing to one vector: interest 0 is the
    :class:`SASRec` encoder's state at the last click (its next-click prediction), interests
    ``1 .. K - 1`` ComiRec-SA's self-attentive head over the same encoder's states, pooling the
    item embeddings as :class:`SASRecMI` does.

    Training (its spec's ``state_interest``) reads interest 0 out against every target by itself,
    as a one-vector model trains, and ComiRec's readout picks among the head's interests, so the
    state stays a full next-click ranker while the head's interests win the targets it misses.
    Retrieval searches all ``K`` and merges the lists as for any multi-interest model.
    ``K = 1`` is the encoder alone (no head). Its blocks are the config's: the automatic ones are
    wearec's (:mod:`recsys.models.lineage`), which read the whole window and so train the last
    position of every prefix; with causal attention (``model.mixer = "attention"``) it can train
    every position, as sasrec does.
    """

    def __init__(self, num_items: int, cfg: ModelConfig, max_len: int):
        super().__init__(num_items, cfg.dim, num_interests=cfg.num_interests)
        self.encoder = _encoder(cfg, max_len)
        self.head = None
        if cfg.num_interests > 1:
            self.head = SelfAttentiveHead(
                cfg.dim,
                cfg.hidden,
                cfg.num_interests - 1,
                max_len,
                backend=cfg.backend,
                positions=cfg.positions,
                score_cap=cfg.score_cap,
            )
        if cfg.init == "bert":
            bert_init(self)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        return self.encode_with_attention(h, lengths)[0]

    def encode_with_attention(self, h: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor | None]:
        states = self.encoder(h, lengths)  # [B, L, d]
        state = gather_last(states, lengths)[:, None]  # [B, 1, d]
        if self.head is None:
            return state, None
        rest, scores = self.head(states, lengths, values=h, return_scores=True)  # [B, K - 1, d], [B, L, K - 1]
        return torch.cat([state, rest], dim=1), scores  # [B, K, d]

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        states = self.encoder(h, lengths)  # [B, L, d]; causal, 0 at padding
        if self.head is None:
            return states[:, :, None]
        return torch.cat([states[:, :, None], self.head.prefix(states, lengths, values=h)], dim=2)  # [B, L, K, d]


TRANSFORMER_SETTINGS = (
    "num_layers",
    "num_heads",
    "dropout",
    "qk_norm",
    "softcap",
    "positions",
    "mixer",
    "block",
    "filter_cutoff",
    "filter_alpha",
    "filter_causal",
    "filter_padding",
    "attention_dropout",
    "init",
)


# what `recsys tune` ranges for a transformer encoder feeding the self-attentive head (sasrec_mi, next_mi)
SELF_ATTENTIVE_TRANSFORMER_SPACE = {**MULTI_INTEREST_SPACE, **SELF_ATTENTIVE_SPACE, **DROPOUT_SPACE}


def build_sasrec(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> SASRec:
    return SASRec(num_items, cfg, max_len)


def build_sasrec_mi(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> SASRecMI:
    return SASRecMI(num_items, cfg, max_len)


SASREC = register(
    ModelSpec(
        name="sasrec",
        build=build_sasrec,
        settings=TRANSFORMER_SETTINGS,
        dense=True,
        tune_space=DROPOUT_SPACE,
        # a causal encoder learns from every position; dropout, not weight decay, regularises it; the
        # exact softmax where it is cheap (docs/defaults.md, "sasrec's dropout and softmax")
        automatic=Automatic(predict_at="all", dropout=0.4, epoch_decay=0.0, full_softmax=True),
    )
)


def build_next_mi(cfg: ModelConfig, num_items: int, max_len: int, item_counts: Tensor | None = None) -> NextMI:
    return NextMI(num_items, cfg, max_len)


SASREC_MI = register(
    ModelSpec(
        name="sasrec_mi",
        build=build_sasrec_mi,
        settings=(*TRANSFORMER_SETTINGS, "num_interests", "hidden", "score_cap", "head_values"),
        multi_interest=True,
        self_attentive=True,
        dense=True,
        # comirec_sa's negatives and regulariser; dropout 0.3 (sasrec's 0.4 lost on amazon-beauty), and
        # on a large catalogue comirec_sa's width with dropout 0.2, its best there: docs/defaults.md, "Width and
        # dropout of the multi-interest models"
        automatic=dataclasses.replace(SELF_ATTENTIVE_MULTI_INTEREST, dropout=0.3, large_dropout=0.2),
        tune_space=SELF_ATTENTIVE_TRANSFORMER_SPACE,
        saved_defaults={"model.head_values": {"model.head_values": "encoded"}},  # its head pooled the encoder outputs
    )
)
