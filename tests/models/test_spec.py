"""A model is one spec: a toy model declared in this file alone trains, evaluates and tunes
through the public functions, and the library asks its spec instead of its name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor, nn

import recsys
from recsys.config import ConfigError, ModelConfig, load_config
from recsys.models import Automatic, ModelSpec, build_model, model_names, register, spec_for
from recsys.models.sequence import SequenceModel
from recsys.models.spec import EXACT_SOFTMAX_ITEMS, FUSED_EXACT_SOFTMAX_ITEMS, unregister
from recsys.run.settings import Facts, fused_exact_softmax, resolve, resolve_model
from tests.conftest import TINY_RUN_OVERRIDES


def _resolve(cfg, num_items: int = 1_000, device: str = "cpu"):
    """``cfg`` resolved on ``num_items`` ids and 100 training sequences of 14 clicks."""
    return resolve(cfg, Facts.of_lengths([14] * 100, num_items, device=device))


class LastClick(SequenceModel):
    """The interest is a learned map of the last click (dense: of the click at each prefix)."""

    def __init__(self, num_items: int, dim: int):
        super().__init__(num_items, dim, num_interests=1)
        self.proj = nn.Linear(dim, dim)

    def encode(self, h: Tensor, lengths: Tensor) -> Tensor:
        last = h[torch.arange(len(h), device=h.device), (lengths - 1).clamp(min=0)]
        return self.proj(last)[:, None] * (lengths > 0)[:, None, None]

    def encode_prefix(self, h: Tensor, lengths: Tensor) -> Tensor:
        valid = torch.arange(h.shape[1], device=h.device)[None, :] < lengths[:, None]
        return (self.proj(h) * valid[..., None])[:, :, None]


@pytest.fixture
def toy():
    spec = register(
        ModelSpec(
            name="toy_last_click",
            build=lambda cfg, n, max_len, counts: LastClick(n, cfg.dim),
            dense=True,
            automatic=Automatic(predict_at="all", epoch_decay=0.3),
            tune_space={"model.dim": [8, 16]},
        )
    )
    yield spec
    unregister(spec.name)


def _overrides(tmp_path, *extra: str) -> list[str]:
    keep = [o for o in TINY_RUN_OVERRIDES if not o.startswith(("model.num_interests", "model.backend"))]
    return [*keep, "model.name=toy_last_click", f"output_dir={tmp_path}", *extra]


def test_a_toy_model_trains_and_evaluates_through_the_public_functions(toy, tmp_path):
    assert spec_for("toy_last_click") is toy and "toy_last_click" in recsys.models.model_names()
    cfg = load_config(None, _overrides(tmp_path))
    assert _resolve(cfg).train.predict_at == "all"  # its spec's automatic value
    run = recsys.fit(None, config=cfg, log=None)
    assert run.config.train.predict_at == "all"
    assert isinstance(run.model, LastClick)
    metrics = run.evaluate("test")
    assert 0.0 <= metrics["recall@50"] <= 1.0
    assert len(run.recommend(users=run.dataset.user_raw[:2].tolist(), n=5)) == 10
    assert recsys.Run.load(run.path).config.train.predict_at == "all"  # the resolved value is what was saved


def test_a_toy_model_tunes_through_the_public_functions(toy, tmp_path):
    pytest.importorskip("optuna")  # the tune extra
    from recsys.tune import default_space, tune

    cfg = load_config(None, _overrides(tmp_path))

    assert default_space(cfg)["model.dim"] == [8, 16]  # the spec's tuning space joins the shared one
    result = tune(
        load_config(None, _overrides(tmp_path)),
        tmp_path / "tune",
        trials=2,
        space={"train.lr": {"low": 1e-3, "high": 1e-2, "log": True}},
        log=lambda line: None,
    )
    assert len(result.trials) == 2 and result.run_dir


def test_the_automatic_weight_decay_reads_the_spec_s_epoch_decay(toy):
    toy_cfg = _resolve(load_config(None, ["train.lr=0.002", "model.name=toy_last_click", "train.predict_at=last"]))
    default_cfg = _resolve(load_config(None, ["train.lr=0.002", "model.name=comirec_sa"]))
    assert toy_cfg.train.weight_decay == pytest.approx(default_cfg.train.weight_decay * 0.3 / 0.15)


def test_automatic_values_resolve_per_model_and_explicit_ones_are_kept():
    """The measured defaults (docs/defaults.md, "Dense training", "sasrec's dropout and softmax"): the
    self-attentive models score negatives by their best interest and part their interests with the
    cosine hinge (the attention regulariser off), the hinge only where there are several
    interests; sasrec trains densely with dropout 0.4 (sasrec_mi: 0.3) and no automatic decay;
    the models without a transformer keep the shared dropout default."""

    def train_of(*sets: str):
        return _resolve(load_config(None, list(sets))).train

    k4 = train_of("model.name=comirec_sa")
    # the hinge's weight on 14-click histories: 14 / 50
    assert (k4.negative_readout, k4.attention_reg, k4.interest_reg, k4.predict_at) == ("max", 0.0, 0.28, "last")
    assert train_of("model.name=comirec_sa", "model.num_interests=1").interest_reg == 0.0
    assert train_of("model.name=comirec_sa", "train.predict_at=all").attention_reg == 0.0
    assert train_of("model.name=comirec_sa", "train.attention_reg=0.3").attention_reg == 0.3
    assert train_of("model.name=comirec_sa", "train.negative_readout=readout").negative_readout == "readout"
    assert train_of("model.name=sasrec_mi").negative_readout == "max"
    mind = train_of("model.name=mind")
    assert (mind.negative_readout, mind.attention_reg) == ("readout", 0.0)
    sasrec = _resolve(load_config(None, ["model.name=sasrec"]))
    assert (sasrec.model.dropout, sasrec.train.predict_at) == (0.4, "all")
    assert _resolve(load_config(None, ["model.name=sasrec_mi"]), num_items=1_000).model.dropout == 0.3
    assert _resolve(load_config(None, ["model.name=sasrec", "model.num_layers=1"])).model.dropout == 0.4
    assert _resolve(load_config(None, ["model.name=sasrec", "model.dropout=0"])).model.dropout == 0.0
    assert sasrec.train.weight_decay == 0.0
    with pytest.raises(ConfigError, match=r"model.dropout: must be >= 0 \(or -1: automatic\)"):
        load_config(None, ["model.dropout=-0.5"])
    with pytest.raises(ConfigError, match=r"model.dim: must be > 0 \(or -1: automatic\), got 0"):
        load_config(None, ["model.dim=0"])


def test_the_automatic_width_follows_the_catalogue_and_is_what_the_run_saves(tmp_path):
    """128 for the self-attentive multi-interest models from 10,000 items on (docs/models.md), 64
    below and for the others, and sasrec_mi's dropout with it; decided with the catalogue, and
    recorded."""

    def dim(name: str, num_items: int, *sets: str) -> int:
        cfg = load_config(None, [f"model.name={name}", "model.backend=torch", *sets])
        return build_model(resolve_model(cfg.model, num_items), num_items, 10).item_embeddings().shape[1]

    assert (dim("comirec_sa", 10_001), dim("sasrec_mi", 10_001), dim("comirec_sa", 10_000)) == (128, 128, 64)
    assert (dim("sasrec", 20_001), dim("mind", 20_001), dim("comirec_sa", 20_001, "model.dim=32")) == (64, 64, 32)
    large = _resolve(load_config(None, ["model.name=sasrec_mi"]), num_items=12_102).model
    small = _resolve(load_config(None, ["model.name=sasrec_mi"]), num_items=1_350).model
    assert (large.dim, large.dropout, small.dim, small.dropout) == (128, 0.2, 64, 0.3)
    assert _resolve(load_config(None, ["model.name=sasrec_mi", "model.dropout=0.1"]), 12_102).model.dropout == 0.1
    with pytest.raises(ConfigError, match="model.num_heads: 3 does not divide model.dim 128"):
        _resolve(load_config(None, ["model.name=sasrec_mi", "model.num_heads=3"]), num_items=12_102)
    overrides = [o for o in TINY_RUN_OVERRIDES if not o.startswith("model.dim")]
    lines: list[str] = []
    run = recsys.fit(None, config=load_config(None, [*overrides, f"output_dir={tmp_path}"]), log=lines.append)
    assert any(line.startswith("model: comirec_sa, K = 4, 64 wide, ") for line in lines)
    assert run.config.model.dim == 64 and run.model.item_embeddings().shape[1] == 64  # 200 items
    assert recsys.Run.load(run.path).config.model.dim == 64


def test_sasrec_trains_with_the_exact_softmax_where_it_is_cheap_and_samples_elsewhere(tmp_path):
    """The automatic train.full_softmax (docs/defaults.md): exact for sasrec below 100,000 items
    where it runs on the fused kernel (CUDA under autocast), below 10,000 elsewhere, sampled above
    and for every other model; a set value and hard negatives win."""

    def exact(num_items: int, *sets: str, model: str = "sasrec", fused: bool = False) -> bool | str:
        cfg = load_config(None, [f"model.name={model}", *sets])
        return _resolve(cfg, num_items, device="cuda" if fused else "cpu").train.full_softmax

    assert (FUSED_EXACT_SOFTMAX_ITEMS, EXACT_SOFTMAX_ITEMS) == (100_000, 10_000)
    # ids include padding: 100,000 ids are 99,999 items
    assert (exact(100_000, fused=True), exact(100_001, fused=True)) == (True, False)
    assert (exact(10_000), exact(10_001)) == (True, False)
    assert (exact(1_000, "train.full_softmax=false"), exact(200_000, "train.full_softmax=true")) == (False, True)
    assert exact(1_000, "train.hard_negatives=0.25", fused=True) is False  # a sampling proposal asks for sampling
    # the other models sample at any size
    assert exact(1_000, model="sasrec_mi", fused=True) is False and exact(1_000, model="comirec_sa") is False
    # which runs count as fused: CUDA under autocast, kernels not forced to their twins
    assert fused_exact_softmax(load_config(None, []), "cuda") and not fused_exact_softmax(load_config(None, []), "cpu")
    assert not fused_exact_softmax(load_config(None, ["train.amp=false"]), "cuda")
    assert not fused_exact_softmax(load_config(None, ["model.backend=torch"]), "cuda")
    assert exact(50_000, "train.amp=false", fused=True) is False
    with pytest.raises(ConfigError, match="train.full_softmax: must be true, false or \"auto\", got 'yes'"):
        load_config(None, ["train.full_softmax=yes"])
    overrides = [o for o in TINY_RUN_OVERRIDES if not o.startswith("model.")]
    lines: list[str] = []
    sets = [*overrides, "model.name=sasrec", "model.backend=torch", f"output_dir={tmp_path}"]
    run = recsys.fit(None, config=load_config(None, sets), log=lines.append)
    assert any(line.startswith("model: sasrec, K = 1, ") and line.endswith("; exact softmax") for line in lines), lines
    assert recsys.Run.load(run.path).config.train.full_softmax is True  # 200 items: recorded as run


def test_settings_a_model_does_not_read_are_refused_naming_the_key(toy):
    with pytest.raises(ConfigError, match=r"model.qk_norm='rms' has no effect on toy_last_click"):
        resolve_model(ModelConfig(name="toy_last_click", qk_norm="rms"), 10)
    with pytest.raises(ConfigError, match="train.attention_reg=1 has no effect on toy_last_click"):
        _resolve(load_config(None, ["model.name=toy_last_click", "train.attention_reg=1"]))
    with pytest.raises(ValueError, match="model.dim, model.num_heads, model.mixer, .*, model.hidden still automatic"):
        build_model(ModelConfig(name="toy_last_click"), 10, 5)  # a model is built from resolved settings
    with pytest.raises(ConfigError, match="model.name: unknown model 'nope'"):
        spec_for("nope")


def test_registering_a_name_twice_or_an_unknown_setting_fails(toy):
    with pytest.raises(ValueError, match="registered twice"):
        register(toy)
    with pytest.raises(ValueError, match=r"settings \['depth'\] are not \[model\] fields"):
        register(ModelSpec(name="toy_bad", build=toy.build, settings=("depth",)))


@pytest.mark.parametrize("name", model_names())
def test_every_built_in_spec_agrees_with_its_model(name):
    """A spec's capabilities are what its model does: dense models implement prefix_interests,
    multi-interest ones have K = model.num_interests, trainable ones have parameters, and
    self-attentive ones return attention scores a loss can differentiate (train.attention_reg)."""
    spec = spec_for(name)
    counts = torch.ones(30, dtype=torch.long)
    cfg = resolve_model(ModelConfig(name=name, dim=8, num_heads=2, num_interests=3, backend="torch"), 30)
    model = build_model(cfg, 30, 6, item_counts=counts)
    assert model.num_interests == (3 if spec.multi_interest else 1)
    assert any(p.requires_grad for p in model.parameters()) == spec.trainable
    seq, lengths = torch.randint(1, 30, (2, 6)), torch.tensor([6, 3])
    _, scores = model.interests_with_attention(seq, lengths)
    assert (scores is not None and scores.requires_grad) == spec.self_attentive
    if spec.dense:
        assert model.prefix_interests(seq, lengths).shape == (2, 6, model.num_interests, 8)
    else:
        with pytest.raises(NotImplementedError):
            model.prefix_interests(seq, lengths)


@pytest.mark.parametrize("name", ["sasrec", "sasrec_mi"])
def test_bert_init_starts_every_table_and_linear_at_two_hundredths(name):
    from recsys.models.sasrec import BERT_INIT_STD, SASRec, SASRecMI

    torch.manual_seed(0)
    given = load_config(None, [f"model.name={name}", "model.dim=64", "model.dropout=0.1", "model.init=bert"]).model
    cfg = resolve_model(given, 500)
    model = (SASRec if name == "sasrec" else SASRecMI)(500, cfg, 50)
    table = model.embedding.table.weight
    assert table[0].abs().max() == 0  # padding stays zero
    assert table[1:].std().item() == pytest.approx(BERT_INIT_STD, rel=0.05)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            assert module.weight.std().item() == pytest.approx(BERT_INIT_STD, rel=0.2)
            assert module.bias is None or module.bias.abs().max() == 0
    scaled = (SASRec if name == "sasrec" else SASRecMI)(500, dataclasses.replace(cfg, init="scaled"), 50)
    assert scaled.embedding.table.weight[1:].std().item() == pytest.approx(64**-0.5, rel=0.05)
