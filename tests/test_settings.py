"""Settings decided once: :func:`recsys.run.settings.resolve` is the only code that reads an
automatic value (:data:`recsys.config.AUTOMATIC`), and what it returns holds none.

The walk reads every module of the package (``ast``) and fails on a comparison of a config key
with the value that says "automatic": ``x.predict_next == -1``, ``x.predict_at != AUTO``,
``x.weight_decay >= 0`` (the "set or automatic?" test of a key whose automatic value is -1), and
``x.hidden or 4 * d`` (a key whose automatic value is 0, replaced where it is read).
"""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest

import recsys
from recsys.config import AUTO, AUTOMATIC, CONFIG_VERSION, Config, ConfigError, automatic_keys, load_config
from recsys.models import model_names, spec_for
from recsys.run.settings import Facts, cpu_threads, resolve, resolve_model

PACKAGE = Path(recsys.__file__).parent
RESOLVER = PACKAGE / "run" / "settings.py"
SENTINELS = {key.split(".")[1]: value for key, value in AUTOMATIC.items()}  # leaf name -> its automatic value
CHECKS = (ast.If, ast.IfExp, ast.While, ast.Assert)


def _watched(node: ast.AST) -> str | None:
    """The config key leaf that ``node`` reads (``cfg.train.predict_next`` -> ``predict_next``), if watched;
    a command-line option (``args.batch_size``) is not a config key."""
    if not isinstance(node, ast.Attribute) or node.attr not in SENTINELS:
        return None
    return None if isinstance(node.value, ast.Name) and node.value.id == "args" else node.attr


def _is_sentinel(node: ast.AST, leaf: str) -> bool:
    """Whether ``node`` is the automatic value of ``leaf``: its literal, or ``AUTO``/``"auto"`` for a
    string key."""
    automatic = SENTINELS[leaf]
    if isinstance(automatic, str):
        named = (isinstance(node, ast.Name) and node.id == "AUTO") or (
            isinstance(node, ast.Attribute) and node.attr == "AUTO"
        )
        return named or (isinstance(node, ast.Constant) and node.value == AUTO)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = -node.operand.value
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        value = node.value
    else:
        return False
    return value == automatic


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


MIRROR = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}


def _sign_test(op: ast.cmpop, key_on_left: bool) -> bool:
    """Whether ``key op 0`` (or ``0 op key``) asks "is it negative?": ``key < 0`` or ``key >= 0``."""
    kind = type(op) if key_on_left else MIRROR.get(type(op), type(op))
    return kind in (ast.Lt, ast.GtE)


def _bare(node: ast.AST) -> ast.AST:
    """``node`` without the ``not`` in front of it."""
    return node.operand if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) else node


def sentinel_reads(source: str, filename: str = "<snippet>") -> list[str]:
    """``"file:line: code"`` for each place in ``source`` that reads a config key against its
    automatic value (the module docstring lists the forms)."""
    found: list[ast.AST] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                for key_side, other, on_left in ((left, right, True), (right, left, False)):
                    leaf = _watched(key_side)
                    if leaf is None:
                        continue
                    negative = not isinstance(SENTINELS[leaf], str) and SENTINELS[leaf] < 0
                    if _is_sentinel(other, leaf) or (negative and _is_zero(other) and _sign_test(op, on_left)):
                        found.append(node)
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            found += [node for value in node.values[:-1] if (leaf := _watched(value)) and SENTINELS[leaf] == 0]
        elif isinstance(node, CHECKS) and (leaf := _watched(_bare(node.test))) and SENTINELS[leaf] == 0:
            found.append(node)
    lines = source.splitlines()
    return [f"{filename}:{n.lineno}: {lines[n.lineno - 1].strip()}" for n in sorted(found, key=lambda n: n.lineno)]


def test_only_the_resolver_reads_an_automatic_value():
    """Every module but recsys/run/settings.py reads settings as plain values."""
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != RESOLVER
        for hit in sentinel_reads(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    ]
    assert found == [], "automatic values read outside recsys.run.settings.resolve:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "horizon = t.predict_next if t.predict_next != -1 else 5",
        "if cfg.train.predict_at == AUTO: pass",
        "exact = config.AUTO != cfg.train.full_softmax",
        'if ev.objective == "auto": pass',
        "decay = t.weight_decay if t.weight_decay >= 0 else 0.1",
        "if m.dropout == -1.0: pass",
        "hidden = m.hidden or 4 * m.dim",
        "n = 10 * t.batch_size if not t.num_negatives else 1",
        "ok = 0 <= t.attention_reg",
        "n = t.num_negatives or 10 * t.batch_size",
        "b = t.batch_size or 128",
        "if cfg.train.batch_size == 0: pass",
        "if not t.batch_size: pass",
    ],
)
def test_the_walk_catches_a_sentinel_read(snippet):
    """The walk can fail: each of these reads an automatic value where it is used."""
    assert len(sentinel_reads(snippet)) == 1


@pytest.mark.parametrize(
    "snippet",
    [
        "soft = t.soft_readout_steps > 0 and k > 1",  # 0 is a plain value of a key automatic at -1
        'dense = t.predict_at == "all"',
        "per_target = x.repeat_interleave(t.predict_next) if t.predict_next > 1 else x",
        "if t.hard_negatives and not t.full_softmax: pass",
        "if targets == AUTO: pass",  # a name, not a config key
        "if args.batch_size <= 0: pass",  # a command-line option, not a config key
        "steps = t.batch_size * t.max_steps",
    ],
)
def test_the_walk_passes_plain_reads(snippet):
    assert sentinel_reads(snippet) == []


FACTS = Facts.of_lengths([20] * 1000, num_items=4001, tied_share=0.3)


@pytest.mark.parametrize("name", model_names())
def test_the_resolved_config_holds_no_automatic_value(name):
    """Every model, the defaults and some keys set: nothing automatic left, the version written,
    and resolving it again changes nothing."""
    cfg = load_config(None, [f"model.name={name}"])
    assert automatic_keys(cfg) == list(AUTOMATIC)  # every automatic key is automatic by default
    resolved = resolve(cfg, FACTS)
    assert automatic_keys(resolved) == [] and resolved.config_version == CONFIG_VERSION
    assert resolve(resolved, FACTS) == resolved
    assert automatic_keys(cfg) == list(AUTOMATIC)  # the config given is left as it was
    explicit = resolve(load_config(None, [f"model.name={name}", "model.dim=32", "train.num_negatives=77"]), FACTS)
    assert (explicit.model.dim, explicit.model.hidden, explicit.train.num_negatives) == (32, 128, 77)


def test_the_facts_decide_the_data_driven_values():
    cfg = load_config(None, ["model.name=sasrec_mi", "train.lr=0.002", "train.batch_size=100"])
    small = resolve(cfg, Facts.of_lengths([14] * 1000, num_items=1_351, tied_share=0.0))
    large = resolve(cfg, Facts.of_lengths([14] * 1000, num_items=12_103, tied_share=0.5))
    assert (small.model.dim, small.model.dropout, small.train.predict_next) == (64, 0.3, 1)
    assert (large.model.dim, large.model.dropout, large.train.predict_next) == (128, 0.2, 5)
    assert small.model.hidden == 4 * 64 and large.model.hidden == 4 * 128
    assert small.train.num_negatives == 10 * 100
    # 1,000 sequences of 14 clicks, 10 targets each: 100 steps an epoch, shrinking by epoch_decay a pass
    assert small.train.weight_decay == pytest.approx(spec_for("sasrec_mi").automatic.epoch_decay / (0.002 * 100))
    two = resolve(cfg, Facts.of_lengths([14] * 1000, num_items=1_351, world_size=2))
    assert two.train.weight_decay == pytest.approx(2 * small.train.weight_decay)
    adam = resolve(load_config(None, ["model.name=sasrec_mi", "train.optimizer=adam"]), FACTS)
    assert adam.train.weight_decay == 0.0
    dense = resolve(load_config(None, ["model.name=sasrec"]), FACTS)
    assert (
        dense.train.predict_at == "all" and dense.train.weight_decay == 0.0 and math.isfinite(dense.train.weight_decay)
    )


def test_the_batch_follows_the_targets_and_the_rate_does_not():
    """128 a process while an epoch at 128 a process is at most 20,000 steps, else the smallest
    power of two that brings it there (at most 4,096; 512 training every position); the rate stays
    1e-3 at every batch; what reads them (negatives, weight decay) reads the resolved values."""
    from recsys.run.settings import BASE_BATCH, EPOCH_STEPS, scaled_batch

    assert scaled_batch(EPOCH_STEPS * BASE_BATCH) == 128 and scaled_batch(EPOCH_STEPS * BASE_BATCH + 1) == 256
    assert scaled_batch(10**10) == 4096
    cfg = load_config(None, ["model.name=comirec_sa"])
    small = {  # training sequences of these lengths, min_target 4
        "taobao, ~500k targets": [54] * 10_000,
        "amazon-beauty": [9] * 22_363,
        "movielens-1m": [165] * 6_040,
        "synthetic defaults": [Config().synthetic.mean_length] * Config().synthetic.num_users,
    }
    for name, lengths in small.items():
        got = resolve(cfg, Facts.of_lengths(lengths, num_items=40_001))
        assert (got.train.batch_size, got.train.lr) == (128, 1e-3), name
    dense = resolve(load_config(None, ["model.name=sasrec"]), Facts.of_lengths(small["taobao, ~500k targets"], 40_001))
    assert (dense.train.predict_at, dense.train.batch_size, dense.train.lr) == ("all", 128, 1e-3)
    log = [104] * 736_158  # 100 targets each: 73.6M, 575,124 steps an epoch at 128
    large = resolve(cfg, Facts.of_lengths(log, num_items=40_001))
    assert (large.train.batch_size, large.train.lr, large.train.num_negatives) == (4096, 1e-3, 40_960)
    epoch = Facts.of_lengths(log, num_items=40_001).epoch_steps(large.train)
    assert epoch == 17_973
    decay = spec_for("comirec_sa").automatic.epoch_decay
    assert large.train.weight_decay == pytest.approx(decay / (1e-3 * epoch))
    assert resolve(large, Facts.of_lengths(log, num_items=40_001)) == large
    # dense training's logits grow as the batch squared: its batch stops at 512
    dense_large = resolve(load_config(None, ["model.name=sasrec"]), Facts.of_lengths(log, num_items=40_001))
    assert (dense_large.train.predict_at, dense_large.train.batch_size) == ("all", 512)
    medium = resolve(cfg, Facts.of_lengths([104] * 50_000, num_items=40_001))  # 5M targets: 250 -> 256
    assert medium.train.batch_size == 256
    # DDP: the rule is over the global batch; 5M targets on two processes is 19,532 steps at 2 × 128
    two = resolve(cfg, Facts.of_lengths([104] * 50_000, num_items=40_001, world_size=2))
    assert (two.train.batch_size, two.train.lr, two.train.num_negatives) == (128, 1e-3, 2560)
    four = resolve(cfg, Facts.of_lengths(log, num_items=40_001, world_size=4))  # the same global batch as one
    assert (four.train.batch_size, four.train.num_negatives) == (1024, 40_960)


def test_a_rate_or_a_batch_set_by_hand_is_kept():
    log = Facts.of_lengths([104] * 736_158, num_items=40_001)
    kept = resolve(load_config(None, ["train.lr=0.002"]), log)
    assert (kept.train.batch_size, kept.train.lr) == (4096, 0.002)
    both = resolve(load_config(None, ["train.batch_size=128", "train.lr=0.003"]), log)
    assert (both.train.batch_size, both.train.lr) == (128, 0.003)
    small = Facts.of_lengths([20] * 100, num_items=1001)
    assert resolve(load_config(None, ["train.batch_size=512"]), small).train.lr == 1e-3
    with pytest.raises(
        ConfigError, match=r"train.lr: must be > 0 \(or -1: the model's rate\), got 0.0 \(0 no longer means automatic"
    ):
        load_config(None, ["train.lr=0"])


def test_the_lineage_models_resolve_to_their_published_recipes():
    """bsarec and wearec take their papers' blocks and recipe as automatic values; sasrec keeps its
    own; a value set by hand wins over the model's; a model that does not read a block setting
    resolves it to the neutral value, and setting it by hand is refused."""
    beauty = Facts.of_lengths([9] * 22_000, num_items=12_102)
    got = {name: resolve(load_config(None, [f"model.name={name}"]), beauty) for name in ("sasrec", "bsarec", "wearec")}
    m, t = got["wearec"].model, got["wearec"].train
    assert (m.mixer, m.block, m.num_heads, m.filter_alpha, m.init, m.dropout) == (
        "wavelet",
        "post_norm",
        8,
        0.2,
        "bert",
        0.5,
    )
    assert (t.lr, t.batch_size, t.draw, t.min_target, t.predict_at, t.weight_decay) == (
        5e-4,
        256,
        "epochs",
        1,
        "last",
        0,
    )
    m = got["bsarec"].model
    assert (m.mixer, m.num_heads, m.filter_alpha, m.attention_dropout) == ("hybrid", 1, 0.7, 0.5)
    assert got["bsarec"].train.predict_at == "last"  # its filter reads the whole window
    m, t = got["sasrec"].model, got["sasrec"].train
    assert (m.mixer, m.block, m.num_heads, m.init, t.lr, t.draw, t.predict_at) == (
        "attention",
        "pre_norm",
        2,
        "scaled",
        1e-3,
        "users",
        "all",
    )
    causal = ["model.name=sasrec", "model.mixer=hybrid", "model.filter_causal=true"]  # BSARec's block, densely
    dense = resolve(load_config(None, causal), beauty)
    assert dense.train.predict_at == "all" and dense.train.draw == "users"
    with pytest.raises(ConfigError, match='train.predict_at="all": bsarec cannot train on every position'):
        resolve(load_config(None, ["model.name=bsarec", "train.predict_at=all"]), beauty)
    mine = resolve(load_config(None, ["model.name=wearec", "model.block=pre_norm", "train.lr=0.001"]), beauty)
    assert (mine.model.block, mine.train.lr, mine.model.mixer) == ("pre_norm", 1e-3, "wavelet")
    sa = resolve(load_config(None, ["model.name=comirec_sa"]), beauty)
    assert (sa.model.mixer, sa.model.block, sa.train.min_target, sa.train.draw) == ("attention", "pre_norm", 4, "users")
    with pytest.raises(ConfigError, match="model.mixer='wavelet' has no effect on comirec_sa"):
        resolve(load_config(None, ["model.name=comirec_sa", "model.mixer=wavelet"]), beauty)


@pytest.mark.parametrize("name", ["comirec_sa", "sasrec_mi"])
def test_the_score_cap_follows_the_histories_and_the_hinge_parts_several_interests(name):
    """The cap is max(1, ln(L) / 2) and the hinge's weight L / 50 within [0.2, 1], L the median
    history cut at data.max_len; the hinge is on for K > 1 only; a value set by hand is kept."""
    cfg = load_config(None, [f"model.name={name}", "data.max_len=50"])
    short = resolve(cfg, Facts.of_lengths([3, 5, 6, 6, 7, 90, 120], num_items=4001))  # median 6
    assert short.model.score_cap == 1.0  # ln(6) / 2 = 0.90: the least cap
    assert short.train.interest_reg == 0.2  # 6 / 50 = 0.12: the least weight
    twelve = resolve(cfg, Facts.of_lengths([12] * 10, num_items=4001))
    assert (twelve.model.score_cap, twelve.train.interest_reg) == (pytest.approx(1.24), pytest.approx(0.24))
    long = resolve(cfg, Facts.of_lengths([20, 60, 400, 400, 900], num_items=4001))  # median 400, cut at 50
    assert long.model.score_cap == pytest.approx(round(math.log(50) / 2, 2))
    assert long.train.interest_reg == 1.0 and long.train.interest_margin == 0.7
    one = resolve(load_config(None, [f"model.name={name}", "model.num_interests=1"]), FACTS)
    assert one.train.interest_reg == 0.0
    hand = resolve(load_config(None, [f"model.name={name}", "model.score_cap=0.5", "train.interest_reg=0"]), FACTS)
    assert (hand.model.score_cap, hand.train.interest_reg) == (0.5, 0.0)
    assert resolve_model(cfg.model, 4001).score_cap == 1.0  # no lengths known: the least cap


@pytest.mark.parametrize("name", ["youtube_dnn", "mind", "comirec_dr", "sasrec"])
def test_models_without_self_attentive_interests_keep_no_cap_and_no_hinge(name):
    cfg = resolve(load_config(None, [f"model.name={name}"]), Facts.of_lengths([50] * 10, num_items=4001))
    assert (cfg.model.score_cap, cfg.train.interest_reg) == (0.0, 0.0)


def test_resolve_refuses_a_setting_the_model_does_not_read():
    with pytest.raises(ConfigError, match="model.qk_norm"):
        resolve(load_config(None, ["model.name=comirec_sa", "model.qk_norm=rms"]), FACTS)
    with pytest.raises(ConfigError, match="model.qk_norm"):
        resolve_model(load_config(None, ["model.name=comirec_sa", "model.qk_norm=rms"]).model, 4001)


@pytest.mark.parametrize("name", ["sasrec", "sasrec_mi"])
def test_a_filter_that_reads_the_whole_window_trains_on_the_last_position(name):
    """The frequency filter is not causal: the automatic predict_at becomes "last", "all" is refused."""
    hybrid = resolve(load_config(None, [f"model.name={name}", "model.mixer=hybrid"]), FACTS)
    assert hybrid.train.predict_at == "last"
    assert resolve(load_config(None, [f"model.name={name}", "model.mixer=attention"]), FACTS).train.predict_at == (
        spec_for(name).automatic.predict_at
    )
    with pytest.raises(ConfigError, match="not causal"):
        resolve(load_config(None, [f"model.name={name}", "model.mixer=frequency", "train.predict_at=all"]), FACTS)
    causal = resolve(load_config(None, [f"model.name={name}", "model.mixer=hybrid", "model.filter_causal=true"]), FACTS)
    assert causal.train.predict_at == spec_for(name).automatic.predict_at


def test_the_block_settings_belong_to_the_transformers_and_drawing_by_targets_to_last_position_training():
    for key in ("model.mixer=hybrid", "model.block=post_norm", "model.attention_dropout=0.5"):
        with pytest.raises(ConfigError, match=key.split("=")[0]):
            resolve(load_config(None, ["model.name=comirec_sa", key]), FACTS)
    for draw in ("targets", "epochs"):
        with pytest.raises(ConfigError, match=f'train.draw="{draw}"'):
            resolve(load_config(None, ["model.name=sasrec", "train.predict_at=all", f"train.draw={draw}"]), FACTS)
        last = resolve(load_config(None, ["model.name=comirec_sa", f"train.draw={draw}"]), FACTS)
        assert last.train.draw == draw and last.train.predict_at == "last"


def test_saved_configs_carry_their_version():
    """A config.json without config_version (version 1) loads with its automatic values for the
    experiment to decide as they were decided then; a newer version than this code reads is refused."""
    from recsys.run.saved_config import run_config_from_dict

    old = Config().to_dict()
    del old["config_version"]
    old["train"].update(batch_size=128, lr=0.001)  # plain numbers before they followed the data
    loaded = run_config_from_dict(old)
    assert loaded.config_version == 1 and "train.weight_decay" in automatic_keys(loaded)
    assert "train.batch_size" not in automatic_keys(loaded) and "train.lr" not in automatic_keys(loaded)
    large = Facts.of_lengths([104] * 736_158, num_items=40_001)  # where the rule would pick 4,096
    assert resolve(loaded, FACTS).config_version == CONFIG_VERSION
    assert (resolve(loaded, large).train.batch_size, resolve(loaded, large).train.lr) == (128, 0.001)
    del old["train"]["batch_size"], old["train"]["lr"]  # missing: the values in force then
    assert (run_config_from_dict(old).train.batch_size, run_config_from_dict(old).train.lr) == (128, 0.001)
    saved = resolve(load_config(None, ["train.batch_size=64", "train.lr=0.02"]), FACTS).to_dict()
    assert (run_config_from_dict(saved).train.batch_size, run_config_from_dict(saved).train.lr) == (64, 0.02)
    current = resolve(load_config(None, []), FACTS).to_dict()
    assert run_config_from_dict(current) == resolve(load_config(None, []), FACTS)
    with pytest.raises(ConfigError, match="config_version: 3 is newer than this recsys reads"):
        run_config_from_dict({**current, "config_version": CONFIG_VERSION + 1})


def test_renamed_keys_still_load_under_their_old_names(tmp_path):
    """train.targets, train.horizon and train.negative_scores are now train.predict_at,
    train.predict_next and train.negative_readout: a file, --set or values= with an old name is read
    with one warning naming the new key; both names at once is an error."""
    from recsys.config import RENAMED, with_values

    assert set(RENAMED) == {"train.targets", "train.horizon", "train.negative_scores"}
    with pytest.warns(FutureWarning, match=r"^train.targets is now train.predict_at; the old name still works"):
        assert load_config(None, ["train.targets=all"]).train.predict_at == "all"
    path = tmp_path / "old.toml"
    path.write_text('[train]\nhorizon = 3\nnegative_scores = "max"\n')
    with pytest.warns(FutureWarning) as caught:
        cfg = load_config(path)
    assert (cfg.train.predict_next, cfg.train.negative_readout) == (3, "max")
    assert sorted(str(w.message).split(" is now ")[1].split(";")[0] for w in caught) == [
        "train.negative_readout",
        "train.predict_next",
    ]
    with pytest.warns(FutureWarning, match="train.horizon is now train.predict_next"):
        assert with_values(cfg, {"train.horizon": 5}).train.predict_next == 5
    with pytest.warns(FutureWarning, match="train.horizon is now train.predict_next"):
        assert load_config(None, values={"train.horizon": 2}).train.predict_next == 2
    path.write_text("[train]\nhorizon = 3\npredict_next = 2\n")
    with pytest.raises(ConfigError, match="train.horizon and train.predict_next are one setting"):
        load_config(path)


def test_a_run_saved_under_the_old_names_loads_and_evaluates_as_trained(tiny_run, tmp_path, recwarn):
    """A run folder whose config.json holds the old names (and no config_version) loads without a
    warning, with the values it was trained with, and evaluates as the run itself does."""
    import json
    import shutil

    import recsys
    from recsys.io import manifest

    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    path = old / "config.json"
    values = json.loads(path.read_text())
    train = values["train"]
    train["targets"], train["horizon"] = train.pop("predict_at"), train.pop("predict_next")
    train["negative_scores"] = train.pop("negative_readout")
    del values["config_version"]
    path.write_text(json.dumps(values))
    manifest.record(old, path)  # an old run's manifest matched its config
    run, trained = recsys.Run.load(old), recsys.Run.load(tiny_run)
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]
    assert run.config == trained.config
    assert run.evaluate("test") == trained.evaluate("test")


def test_the_resolved_config_is_frozen_and_its_copies_are_not():
    import copy
    import dataclasses

    from recsys.config import with_values

    cfg = resolve(load_config(None, []), FACTS)
    with pytest.raises(dataclasses.FrozenInstanceError, match="TrainConfig.lr: a resolved config is frozen"):
        cfg.train.lr = 0.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "other"
    mine = copy.deepcopy(cfg)
    mine.train.lr = 0.1
    assert with_values(cfg, {"train.lr": 0.2}).train.lr == 0.2 and cfg.train.lr == 1e-3
    assert resolve(cfg, FACTS) == cfg  # resolving again: an equal, frozen copy


def test_the_threads_are_the_cores_other_work_leaves_free():
    """Was: train.cpu_threads = 0 kept torch's default, every core, which on a busy 2-core machine
    trained at a tenth of one thread's samples/s. A core half busy or more counts as taken."""
    assert [cpu_threads(2, busy, 2) for busy in (0.0, 0.4, 0.6, 1.0, 1.9, 2.0)] == [2, 2, 1, 1, 1, 1]
    assert cpu_threads(16, 3.2, 8) == 8  # never above torch's own default (physical cores, OMP_NUM_THREADS)
    assert cpu_threads(16, 12.7, 16) == 3
    cfg = load_config(None, [])
    busy = resolve(cfg, dataclasses.replace(FACTS, cores=2, busy_cores=1.0, torch_threads=2))
    quiet = resolve(cfg, dataclasses.replace(FACTS, cores=2, busy_cores=0.1, torch_threads=2))
    assert (busy.train.cpu_threads, quiet.train.cpu_threads) == (1, 2)
    given = resolve(load_config(None, ["train.cpu_threads=3"]), dataclasses.replace(FACTS, cores=2))
    assert given.train.cpu_threads == 3


def test_the_machine_counts_other_processes_busy(steady_machine):
    """With a spinning process on every core the measurement finds them all busy, and the rule
    trains on one thread."""
    import os
    import subprocess
    import sys
    import time

    cores = len(os.sched_getaffinity(0))
    spin = [sys.executable, "-c", "while True: pass"]
    spinners = [subprocess.Popen(spin) for _ in range(cores)]
    try:
        time.sleep(0.5)
        measured, busy = steady_machine()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert measured == cores and busy >= cores - 0.5, busy
    assert cpu_threads(measured, busy, cores) == 1


def test_how_items_without_clicks_rank_is_left_to_the_run_only_with_item_features():
    """Without features no item is scored without its clicks: the scale is 1 and no place is kept;
    with them both stay -1 for the trainer to choose (recsys.train.new_items); given values stay."""
    plain = resolve(load_config(None, []), FACTS)
    assert (plain.model.cold_scale, plain.retrieval.new_item_share) == (1.0, 0.0)
    featured = resolve(load_config(None, ["data.item_features=items.csv"]), FACTS)
    assert (featured.model.cold_scale, featured.retrieval.new_item_share) == (-1.0, -1.0)
    given = resolve(load_config(None, ["data.item_features=items.csv", "retrieval.new_item_share=0.1"]), FACTS)
    assert given.retrieval.new_item_share == 0.1
