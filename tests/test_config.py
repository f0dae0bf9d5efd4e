import json
import sys
from pathlib import Path

import pytest

from recsys.config import Config, ConfigError, config_from_dict, load_config, validate, with_values
from recsys.models import model_names, spec_for
from recsys.run.saved_config import run_config_from_dict
from recsys.run.settings import Facts, resolve


def _resolve(cfg: Config, num_items: int = 4001) -> Config:
    """``cfg`` resolved on ``num_items`` ids and 1,000 training sequences of 20 clicks."""
    return resolve(cfg, Facts.of_lengths([20] * 1000, num_items))


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_defaults_round_trip_through_json_and_toml(tmp_path):
    cfg = load_config(None, ["model.dim=32", "eval.topn=[10, 20]", "data.source=/x/y.csv"])
    assert cfg.model.dim == 32 and cfg.eval.topn == [10, 20] and cfg.data.source == "/x/y.csv"
    again = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert load_config(path) == cfg


def test_file_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "exp"\n[model]\nname = "youtube_dnn"\ndim = 16\n[train]\nlr = 1\n')
    cfg = load_config(path, ["model.dim=8"])
    assert (cfg.name, cfg.model.name, cfg.model.dim) == ("exp", "youtube_dnn", 8)
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)  # int widens to float


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.dimm=3", "model.dimm"),
        ("modle.dim=3", "modle"),
        ("model.dim=abc", "model.dim"),
        ("model.dim=1.5", "model.dim"),
        ("train.amp=yes", "train.amp"),
        ("eval.topn=[20, 'x']", "eval.topn"),
        ("model=3", "model"),
        ("train.batch_size=-1", "train.batch_size"),
        ("train.lr=-0.1", "train.lr"),
        ("train.sampler=zipf", "train.sampler"),
        ("model.dropout=1.5", "model.dropout"),
        ("model.filter_padding=left", "model.filter_padding"),
        ("no_equals_sign", "no_equals_sign"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(None, [override])


def test_bad_file_names_file_and_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nbatchsize = 3\n")
    with pytest.raises(ConfigError, match=r"bad.toml.*train.batchsize"):
        load_config(path)
    path.write_text("[train\n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_config_file_that_is_not_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[data]\nsource = "caf\xe9.csv"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"^\S*latin1\.toml:2: not UTF-8 text \(byte 0xe9\); TOML files are UTF-8"):
        load_config(path)


def test_bool_is_not_an_int():
    with pytest.raises(ConfigError, match="model.dim"):
        config_from_dict({"model": {"dim": True}})


def test_default_config_is_valid():
    cfg = Config()
    validate(cfg)
    assert cfg == load_config(None, [])
    assert (cfg.model.score_cap, cfg.train.predict_at) == (-1.0, "auto")  # left for the model spec to resolve


@pytest.mark.parametrize(
    "name,cap,soft",
    [
        ("comirec_sa", 1.5, 1000),  # ln(20) / 2: the cap follows the 20-click histories
        ("sasrec_mi", 1.5, 1000),
        ("youtube_dnn", 0.0, 0),
        ("mind", 0.0, 0),
        ("comirec_dr", 0.0, 0),
    ],
)
def test_automatic_anti_collapse_defaults_resolve_per_model(name, cap, soft):
    cfg = _resolve(load_config(None, [f"model.name={name}"]))
    assert (cfg.model.score_cap, cfg.train.soft_readout_steps) == (cap, soft)
    written = load_config(None, [f"model.name={name}", "model.score_cap=0", "train.soft_readout_steps=7"])
    if spec_for(name).multi_interest:  # K > 1 interests: the readout's warm-up is theirs to set
        explicit = _resolve(written)
        assert (explicit.model.score_cap, explicit.train.soft_readout_steps) == (0.0, 7)
    else:  # one interest reads itself out: a warm-up would do nothing, so it is refused
        with pytest.raises(ConfigError, match="train.soft_readout_steps=7 has no effect"):
            _resolve(written)
    with pytest.raises(ConfigError, match="model.score_cap"):
        load_config(None, ["model.score_cap=-2"])
    with pytest.raises(ConfigError, match="train.soft_readout_steps"):
        load_config(None, ["train.soft_readout_steps=-5"])


def test_saved_runs_without_the_anti_collapse_keys_load_as_trained():
    """A config.json written before model.score_cap / train.soft_readout_steps existed: no cap, argmax readout."""
    saved = Config().to_dict()
    del saved["model"]["score_cap"], saved["train"]["soft_readout_steps"]
    cfg = run_config_from_dict(saved)
    assert cfg.model.score_cap == 0.0 and cfg.train.soft_readout_steps == 0


def test_saved_runs_without_the_new_items_settings_load_as_trained():
    """A config.json written before model.cold_scale / retrieval.new_item_share existed: items without
    clicks scored as trained, no places kept for them."""
    saved = Config().to_dict()
    del saved["model"]["cold_scale"], saved["retrieval"]["new_item_share"]
    cfg = run_config_from_dict(saved)
    assert (cfg.model.cold_scale, cfg.retrieval.new_item_share) == (1.0, 0.0)


def test_saved_runs_without_the_model_owned_settings_load_as_trained():
    """A config.json written before the block settings, the first target and the draw became each
    model's own: the values every model had then."""
    saved = Config().to_dict()
    for key in ("mixer", "block", "init", "num_heads", "filter_alpha", "attention_dropout"):
        del saved["model"][key]
    del saved["train"]["min_target"], saved["train"]["draw"]
    cfg = run_config_from_dict(saved)
    m = cfg.model
    assert (m.mixer, m.block, m.init, m.num_heads, m.filter_alpha, m.attention_dropout) == (
        "attention",
        "pre_norm",
        "scaled",
        2,
        0.7,
        0.0,
    )
    assert (cfg.train.min_target, cfg.train.draw) == (4, "users")


def test_saved_runs_without_the_interest_hinge_load_as_trained():
    """A config.json written before train.interest_reg existed trained without the hinge."""
    saved = Config().to_dict()
    del saved["train"]["interest_reg"], saved["train"]["interest_margin"]
    cfg = run_config_from_dict(saved)
    assert (cfg.train.interest_reg, cfg.train.interest_margin) == (0.0, 0.5)


def test_saved_runs_without_a_weight_average_load_as_trained():
    """A config.json written before train.ema_decay existed validated and kept its last weights."""
    saved = Config().to_dict()
    assert run_config_from_dict(saved).train.ema_decay == Config().train.ema_decay > 0
    del saved["train"]["ema_decay"]
    assert run_config_from_dict(saved).train.ema_decay == 0.0
    for bad in ("1", "1.5", "-0.1"):
        with pytest.raises(ConfigError, match=r"train.ema_decay: must be in \[0, 1\)"):
            load_config(None, [f"train.ema_decay={bad}"])


def test_layered_files_later_wins(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('[data]\nsource = "x.csv"\nmax_len = 50\n[model]\ndim = 16\n')
    b.write_text('[model]\nname = "gru4rec"\ndim = 32\n')
    cfg = load_config([a, b])
    assert (cfg.data.source, cfg.data.max_len, cfg.model.name, cfg.model.dim) == ("x.csv", 50, "gru4rec", 32)


def test_saved_run_config_keeps_what_the_run_was_trained_with():
    saved = json.loads(json.dumps(Config().to_dict()))
    assert run_config_from_dict(saved).model.positions == "recent"
    del saved["model"]["positions"]  # a run saved before the option existed
    assert run_config_from_dict(saved).model.positions == "absolute"
    assert config_from_dict(saved).model.positions == "recent"  # plain config files take today's default
    for name, positions, head_values in [
        ("sasrec_mi", "recent", "encoded"),
        ("comirec_dr", "absolute", "items"),
        ("comirec_sa", "recent", "items"),
    ]:
        saved = json.loads(json.dumps(Config().to_dict()))
        saved["model"]["name"] = name
        del saved["model"]["head_values"]  # saved before sasrec_mi could pool item embeddings
        model = run_config_from_dict(saved).model
        assert (model.positions, model.head_values) == (positions, head_values), name


def test_every_experiment_config_pair_loads():
    """Each dataset config under experiments/configs/ combines with each model config."""
    configs = Path(__file__).resolve().parents[1] / "experiments" / "configs"
    datas, models = sorted((configs / "data").glob("*.toml")), sorted((configs / "models").glob("*.toml"))
    assert len(datas) >= 4 and len(models) == 8
    for data in datas:
        for model in models:
            cfg = load_config([data, model])
            assert cfg.model.name == model.stem, (data.name, model.name)
            named = tomllib.loads(data.read_text()).get("data", {}).get("source", "synthetic")
            assert cfg.data.source == named, (data.name, model.name)  # the model config leaves the data alone


def test_every_recipe_resolves_under_the_rules_it_was_published_with():
    """experiments/configs/recipes/*.toml: a published recipe in recsys's settings, resolved as written."""
    from recsys.run.settings import Facts, resolve

    recipes = sorted((Path(__file__).resolve().parents[1] / "experiments" / "configs" / "recipes").glob("*.toml"))
    assert recipes
    for recipe in recipes:
        cfg = load_config(recipe, ["data.split=leave_one_out", "data.loo_rules=every_user"])
        resolved = resolve(cfg, Facts.of_lengths([9] * 100, num_items=12_102))
        assert resolved.train.predict_at == "last" and resolved.train.batch_size == cfg.train.batch_size, recipe


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "+inf"])
def test_non_finite_floats_are_refused_everywhere(tmp_path, value):
    """Was: train.lr=inf trained 500 steps on NaN loss; nan failed only after loading the data."""
    with pytest.raises(ConfigError, match="train.lr: must be a finite number"):
        load_config(None, [f"train.lr={value}"])
    path = tmp_path / "c.toml"
    path.write_text(f"[model]\ndropout = {value}\n")
    with pytest.raises(ConfigError, match=f"{path}: model.dropout: must be a finite number"):
        load_config(path)
    with pytest.raises(ConfigError, match="eval.diversity_lambda: must be a finite number"):
        config_from_dict({"eval": {"diversity_lambda": float(value)}})


def test_diversity_lambda_has_a_finite_ceiling():
    from recsys.config import MAX_DIVERSITY_LAMBDA

    load_config(None, [f"eval.diversity_lambda={MAX_DIVERSITY_LAMBDA}"])
    with pytest.raises(ConfigError, match="eval.diversity_lambda: must be <="):
        load_config(None, ["eval.diversity_lambda=1e300"])


def test_num_interests_has_a_ceiling():
    """Was: model.num_interests=1000 was accepted, then took 141 s for 50 steps."""
    from recsys.config import MAX_NUM_INTERESTS

    load_config(None, [f"model.num_interests={MAX_NUM_INTERESTS}"])
    with pytest.raises(ConfigError, match=rf"model.num_interests: must be <= {MAX_NUM_INTERESTS} .*got 1000$"):
        load_config(None, ["model.num_interests=1000"])


def test_memory_estimate_names_the_number_and_passes_sane_configs():
    import torch

    from recsys.models import build_model
    from recsys.train.memory import check_fits

    gib = 1024**3
    cfg = _resolve(load_config(None, ["model.backend=torch"]))
    model = build_model(cfg.model, 4001, cfg.data.max_len)
    assert check_fits(cfg, model, 4001, torch.device("cpu"), available=1 * gib) < 1 * gib
    cfg = _resolve(
        load_config(
            None, ["model.backend=torch", "model.num_interests=64", "train.batch_size=65536", "train.predict_next=1"]
        )
    )
    model = build_model(cfg.model, 4001, cfg.data.max_len)
    with pytest.raises(ConfigError, match=r"train.batch_size=65536.*needs about [\d,]+\.\d GiB.*24.0 GiB free"):
        check_fits(cfg, model, 4001, torch.device("cpu"), available=24 * gib)


def test_memory_estimate_counts_the_hard_negative_proposal():
    """``train.hard_negatives`` scores the whole catalogue for every interest of the batch (B·K·N)."""
    import torch

    from recsys.models import build_model
    from recsys.train.memory import check_fits

    gib, items = 1024**3, 1_000_001
    plain = _resolve(load_config(None, ["model.backend=torch", "train.batch_size=1024", "model.dim=16"]), items)
    model = build_model(plain.model, items, plain.data.max_len)
    assert check_fits(plain, model, items, torch.device("cpu"), available=24 * gib) < 24 * gib
    hard = _resolve(
        load_config(None, ["model.backend=torch", "train.batch_size=1024", "model.dim=16", "train.hard_negatives=0.5"]),
        items,
    )
    with pytest.raises(ConfigError, match=r"train.hard_negatives=0.5.*needs about 3\d\.\d GiB"):
        check_fits(hard, model, items, torch.device("cpu"), available=24 * gib)


def test_attention_reg_on_a_model_without_attention_fails_when_resolved():
    with pytest.raises(ConfigError, match="train.attention_reg=1 has no effect on mind"):
        _resolve(load_config(None, ["model.name=mind", "train.attention_reg=1"]))
    assert _resolve(load_config(None, ["model.name=sasrec_mi", "train.attention_reg=1"])).train.attention_reg == 1.0


def test_values_apply_after_files_and_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nname = "youtube_dnn"\ndim = 16\n')
    cfg = load_config(path, ["model.dim=8"], values={"model.name": "mind", "data.max_len": 30})
    assert (cfg.model.name, cfg.model.dim, cfg.data.max_len) == ("mind", 8, 30)
    cfg = _resolve(cfg)
    assert (cfg.model.score_cap, cfg.train.soft_readout_steps) == (0.0, 0)  # resolved for mind, not the default


def test_changing_the_model_resolves_automatic_settings_again():
    from recsys.config import with_values

    mind = with_values(load_config(None, []), {"model.name": "mind"})  # from comirec_sa's automatic values
    assert (_resolve(mind).model.score_cap, _resolve(mind).train.soft_readout_steps) == (0.0, 0)
    explicit = _resolve(
        with_values(
            load_config(None, ["model.score_cap=2", "train.soft_readout_steps=50"]), {"model.name": "sasrec_mi"}
        )
    )
    assert (explicit.model.score_cap, explicit.train.soft_readout_steps) == (2.0, 50)  # set by hand: kept
    back = _resolve(with_values(mind, {"model.name": "comirec_sa"}))
    assert (back.model.score_cap, back.train.soft_readout_steps) == (1.5, 1000)


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("true", True), ("false", False), ('"auto"', "auto")])
def test_cuda_graph_takes_auto_true_or_false(tmp_path, text, value):
    assert Config().train.cuda_graph == "auto"  # the default
    cfg = load_config(None, [f"train.cuda_graph={text}"])
    assert cfg.train.cuda_graph is value if isinstance(value, bool) else cfg.train.cuda_graph == value
    assert config_from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # JSON round trip keeps bool or string
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert load_config(path).train.cuda_graph == value and type(load_config(path).train.cuda_graph) is type(value)


@pytest.mark.parametrize("text", ["yes", "1", '"true"', "Auto", "[true]"])
def test_bad_cuda_graph_values_name_the_key(text):
    with pytest.raises(ConfigError, match="train.cuda_graph"):
        load_config(None, [f"train.cuda_graph={text}"])


@pytest.mark.parametrize("saved", [True, False])
def test_runs_saved_with_a_boolean_cuda_graph_load_with_it(tmp_path, saved):
    """config.json of a run trained when train.cuda_graph was a bool (default false) loads unchanged."""
    from recsys.run import RunDir

    values = Config().to_dict()
    values["train"]["cuda_graph"] = saved
    run = RunDir.create(tmp_path / "old")
    run.save_config(values)
    assert run.read_config().train.cuda_graph is saved
    assert run_config_from_dict(values).train.cuda_graph is saved


def test_memory_estimate_adds_evaluation_to_a_captured_step():
    """A captured CUDA graph keeps the step's memory through evaluation: the two add up."""
    import torch

    from recsys.models import build_model
    from recsys.train.memory import check_fits, estimate_bytes

    cfg = _resolve(load_config(None, ["model.backend=torch"]))
    model = build_model(cfg.model, 4001, cfg.data.max_len)
    params = sum(p.numel() for p in model.parameters())
    parts = estimate_bytes(cfg, params, 4001, cfg.model.num_interests)
    eager = check_fits(cfg, model, 4001, torch.device("cpu"), available=1 << 40)
    kept = check_fits(cfg, model, 4001, torch.device("cpu"), available=1 << 40, step_kept=True)
    assert kept - eager == min(parts["training step activations"], parts["evaluation batch"]) > 0


def test_a_row_sparse_item_table_keeps_no_gradient_in_the_memory_estimate():
    from recsys.train.memory import estimate_bytes

    cfg = load_config(None, ["model.dim=64"])
    dense, sparse = (
        estimate_bytes(_resolve(with_values(cfg, {"train.item_updates": u}), 10**6), 10**7, 10**6, 4)
        for u in ("dense", "sparse")
    )
    saved = dense["parameters and optimizer state"] - sparse["parameters and optimizer state"]
    assert saved == 10**6 * (64 * 4 - 8)


def test_a_sharded_item_table_keeps_its_share_of_the_optimiser_state_in_the_memory_estimate():
    """Each of 4 processes keeps 1/4 of the rows' two moments, average and step counter: 3/4 of
    those of the row-sparse form are not there (recsys.items.sharded)."""
    from recsys.train.memory import estimate_bytes

    cfg = load_config(None, ["model.dim=64"])
    sparse, sharded, alone = (
        estimate_bytes(_resolve(with_values(cfg, {"train.item_updates": u}), 10**6), 10**7, 10**6, 4, world)[
            "parameters and optimizer state"
        ]
        for u, world in (("sparse", 4), ("sharded", 4), ("sharded", 1))
    )
    assert sparse - sharded == 10**6 * 3 // 4 * (3 * 64 * 4 + 8)  # the default keeps a weight average
    assert alone == sparse


def test_saved_runs_without_item_updates_or_a_validation_sample_load_as_trained():
    saved = Config().to_dict()
    del saved["train"]["item_updates"], saved["eval"]["valid_users"]
    loaded = run_config_from_dict(saved)
    assert loaded.train.item_updates == "dense" and loaded.eval.valid_users == 0


@pytest.mark.parametrize("name", model_names())
def test_saved_runs_without_a_horizon_load_as_trained(name):
    """A config.json written before train.predict_next existed predicted the next click only."""
    saved = Config().to_dict()
    saved["model"]["name"] = name
    del saved["train"]["predict_next"]
    assert run_config_from_dict(saved).train.predict_next == 1


def test_window_padding_with_the_causal_filter_is_refused():
    """The causal filter reads no padding row, so reading the padding as the published block does cannot apply."""
    with pytest.raises(ConfigError, match='model.filter_padding="window"'):
        load_config(
            None, ["model.name=sasrec", "model.mixer=hybrid", "model.filter_causal=true", "model.filter_padding=window"]
        )
