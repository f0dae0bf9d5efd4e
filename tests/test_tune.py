"""`recsys tune`: TPE trials with pruning, a resumable study, the best config written and retrained."""

import json

import pytest

from recsys.cli import main
from recsys.config import ConfigError, automatic_keys, load_config
from recsys.run import RunDir

from conftest import TINY_RUN_OVERRIDES

optuna = pytest.importorskip("optuna")

from recsys.tune import Space, default_space, open_study, read_tune_tables, trials_table, tune  # noqa: E402

BASE = TINY_RUN_OVERRIDES + ["train.eval_every=10", "train.lr=0.02"]


def _space_file(tmp_path, cfg) -> str:
    """A [tune] table that fixes every default key at the base's value and searches lr in {0.02, 1e-9}."""
    values = cfg.to_dict()
    lines = ["[tune]"]
    for key in default_space(cfg).keys() - {"train.lr"}:
        section, leaf = key.split(".")
        lines.append(f'"{key}" = {json.dumps(values[section][leaf])}')
    lines.append('"train.lr" = [0.02, 1e-9]')
    path = tmp_path / "space.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_tune_prunes_resumes_and_writes_a_config_that_trains(tmp_path, capsys):
    cfg = load_config(None, BASE)
    space_file = _space_file(tmp_path, cfg)
    folder = tmp_path / "tune"
    first = tune(
        load_config(space_file, BASE), folder, trials=2, space=read_tune_tables([space_file]), log=lambda line: None
    )
    assert [t.state.name for t in first.trials] == ["COMPLETE", "COMPLETE"]
    assert first.trials[0].user_attrs["base"] and first.trials[0].params == {}
    before = {t.number: (t.datetime_start, t.value) for t in first.trials}

    study = open_study(folder)
    study.ask()  # a trial left running by an interrupted tune
    study.enqueue_trial({"train.lr": 1e-9})  # a trial that learns nothing: pruned at its second validation
    args = ["tune", "--config", space_file, "--trials", "4", "--out", str(folder)]
    assert main(args + [a for o in BASE for a in ("--set", o)]) == 0
    out = capsys.readouterr().out

    trials = open_study(folder).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED", "COMPLETE"]
    assert {t.number: (t.datetime_start, t.value) for t in trials[:2]} == before  # not rerun
    assert trials[3].params == {"train.lr": 1e-9} and sorted(trials[3].intermediate_values) == [0, 1]
    assert "trial 2 was interrupted" in out and "| 3 | pruned |" in out
    assert sorted(p.name for p in (folder / "trials").iterdir()) == ["0000", "0001", "0003", "0004"]

    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    best_toml = folder / "best.toml"
    assert f"best: trial {best.number}, valid recall@50 {best.value:.4f}" in out
    best_cfg = load_config(best_toml)
    assert best_cfg.train.lr == 0.02 and best_cfg.synthetic.num_users == 400  # the keys that differ from the defaults
    assert "[tune]" not in best_toml.read_text() and "[serve]" not in best_toml.read_text()
    retrained = RunDir(folder / f"best-{best.number:04d}")
    expected = best_cfg.to_dict()
    saved = retrained.read_config().to_dict()
    assert automatic_keys(retrained.read_config()) == []  # the run decided every automatic value ...
    # ... which best.toml leaves to the data, as written, like how items without clicks rank (1 and 0: no features)
    for key in [*automatic_keys(best_cfg), "model.cold_scale", "retrieval.new_item_share"]:
        section, leaf = key.split(".")
        expected[section][leaf] = saved[section][leaf]
    assert saved == expected
    # from the synthetic data's untied times, the catalogue's size and the steps per epoch
    assert saved["train"]["predict_next"] == 1 and saved["train"]["item_updates"] == "dense"
    assert saved["train"]["weight_decay"] > 0
    valid = max(r["recall@50"] for r in retrained.read_metrics() if r.get("split") == "valid")
    assert valid == pytest.approx(best.value)  # the same seed trains the same model
    assert f"{retrained.read_test_metrics()['recall@50']:.4f}" in out


def test_search_space_table_is_checked_naming_the_key(tmp_path):
    cfg = load_config(None, ["model.name=sasrec_mi"])
    space = Space.parse(
        {
            **default_space(cfg),
            "model.dim": [32, 64],
            "train.lr": {"low": 1e-3, "high": 0.1, "log": True},
            "model.num_layers": {"low": 1, "high": 3},
            "train.optimizer": "adam",
        },
        cfg,
    )
    keys = {p.key: p for p in space.params}
    assert keys["model.dim"].choices == (32, 64) and keys["model.num_layers"].integer
    assert "model.dropout" in keys and "model.score_cap" in keys  # a transformer with self-attentive scores
    assert space.fixed == {"train.optimizer": "adam"}
    assert "model.score_cap" not in default_space(load_config(None, ["model.name=youtube_dnn"]))
    for table, message in [
        ({"train.lrr": [0.1]}, "unknown config key 'train.lrr'"),
        ({"model.dim": [32, 0]}, "model.dim: must be > 0"),
        ({"train.lr": {"low": 0.1, "high": 0.01}}, "need numbers low < high"),
        ({"train.lr": {"low": 0.0, "high": 0.1, "log": True}}, "log = true needs low > 0"),
        ({"train.lr": {"min": 0.0}}, "a range is"),
        ({"model.num_interests": []}, "empty list"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Space.parse(table, cfg)
    path = tmp_path / "c.toml"
    path.write_text('[train]\nlr = 0.01\n\n[tune]\n"model.dim" = [16, 32]\n')
    assert load_config(path).train.lr == 0.01  # load_config skips [tune]
    assert read_tune_tables([path]) == {"model.dim": [16, 32]}


def test_the_searched_rates_follow_the_base_rate():
    """The lr range is 0.3-3x the base config's rate: 3e-4..3e-3 at the default 1e-3, whatever the
    batch, and around a rate the base sets."""
    default = {"low": 3e-4, "high": 3e-3, "log": True}
    assert default_space(load_config(None, []))["train.lr"] == default
    assert default_space(load_config(None, ["train.batch_size=4096"]))["train.lr"] == default
    assert default_space(load_config(None, BASE))["train.lr"] == {"low": 0.006, "high": 0.06, "log": True}


def test_the_hinge_is_searched_only_where_there_are_interests_to_part():
    """comirec_sa's space searches the cosine hinge (not the attention regulariser) and a score cap
    around its automatic values; a trial at K = 1 gets no hinge, so the config check refuses none,
    even where the base config asks for one."""
    from recsys.config import with_values
    from recsys.run.settings import check, length_score_cap

    for name in ("comirec_sa", "sasrec_mi"):
        cfg = load_config(None, [f"model.name={name}"])
        space = Space.parse(default_space(cfg), cfg)
        keys = {p.key: p for p in space.params}
        assert {"train.interest_reg", "train.interest_margin"} <= keys.keys() and "train.attention_reg" not in keys
        assert 0.0 in keys["train.interest_reg"].choices
        cap = keys["model.score_cap"]
        assert all(cap.low <= length_score_cap(1.0, n) <= cap.high for n in (1, 7, 50, 100))
        assert space.describe()["train.interest_reg"].endswith("(K > 1)")

    for base in (cfg, with_values(cfg, {"train.interest_reg": 0.5})):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        seen = set()
        for _ in range(40):
            trial = study.ask()
            values = space.suggest(trial, base)
            trial_cfg = with_values(base, values)
            check(trial_cfg)  # never a refused combination
            several = trial_cfg.model.num_interests > 1
            assert several == ("train.interest_reg" in trial.params) == ("train.interest_margin" in trial.params)
            if not several:
                assert trial_cfg.train.interest_reg == -1.0  # left to the model: no hinge at K = 1
            seen.add(several)
            study.tell(trial, 0.0)
        assert seen == {True, False}


def test_tune_refuses_another_config_in_the_same_folder(tmp_path):
    space = {key: [value] for key, value in {"model.dim": 16}.items()}
    folder = tmp_path / "tune"
    tune(load_config(None, BASE), folder, trials=1, space=space, log=lambda line: None)
    with pytest.raises(ConfigError, match="differs in train.lr"):
        tune(load_config(None, BASE + ["train.lr=0.01"]), folder, trials=2, space=space, log=lambda line: None)


def test_a_study_saved_before_the_resolver_resumes_on_its_saved_base(tmp_path):
    """Was: a study whose base config was saved partly resolved, without config_version and under
    old key names, refused to resume (its decided values differ from today's automatic ones)."""
    cfg = load_config(None, BASE)
    space: dict = {key: cfg.to_dict()[key.split(".")[0]][key.split(".")[1]] for key in default_space(cfg)}
    space["model.dim"] = [16, 32]
    folder = tmp_path / "tune"
    tune(cfg, folder, trials=1, space=space, log=lambda line: None)
    study = open_study(folder)
    legacy = cfg.to_dict()
    del legacy["config_version"], legacy["train"]["ema_decay"], legacy["eval"]["valid_users"]  # keys added since
    for new, old, value in [("predict_next", "horizon", 1), ("predict_at", "targets", "last")]:
        del legacy["train"][new]
        legacy["train"][old] = value
    legacy["train"]["attention_reg"] = 1.0  # decided by the rules of then
    legacy["model"]["score_cap"] = 1.0
    study.set_user_attr("base_config", legacy)
    saved_space = study.user_attrs["space"]
    saved_space["train.horizon"] = saved_space.pop("train.predict_next").replace("predict_next", "horizon")
    study.set_user_attr("space", saved_space)

    with pytest.raises(ConfigError, match=r"another config \(differs in train.lr\)"):
        tune(load_config(None, BASE + ["train.lr=0.01"]), folder, trials=2, space=space, log=lambda line: None)
    lines: list[str] = []
    result = tune(cfg, folder, trials=2, space=space, log=lines.append)
    assert any("saved by an older recsys" in line for line in lines), lines
    assert [t.state.name for t in result.trials] == ["COMPLETE", "COMPLETE"]
    resumed = RunDir(result.trials[1].user_attrs["run_dir"]).read_config().train
    # as the study trained then (where its space leaves the key alone): its attention regulariser, no weight average
    assert (resumed.attention_reg, resumed.ema_decay) == (1.0, 0.0)

    legacy["train"]["no_longer_a_key"] = 1
    study.set_user_attr("base_config", legacy)
    with pytest.raises(ConfigError, match=r"saved by an older recsys whose base config no longer loads .*--out$"):
        tune(cfg, folder, trials=3, space=space, log=lambda line: None)


def test_tune_refuses_another_search_space_in_the_same_folder(tmp_path):
    folder = tmp_path / "tune"
    tune(load_config(None, BASE), folder, trials=1, space={"model.dim": [16]}, log=lambda line: None)
    with pytest.raises(ConfigError, match=r"another search space \(differs in model.dim\)"):
        tune(load_config(None, BASE), folder, trials=2, space={"model.dim": [16, 32]}, log=lambda line: None)
    result = tune(load_config(None, BASE), folder, trials=1, space={"model.dim": [16]}, log=lambda line: None)
    assert [t.number for t in result.trials] == [0]  # the same space resumes (nothing left to run)


def test_a_trial_whose_values_do_not_fit_fails_alone(tmp_path):
    lines: list[str] = []
    space = {"train.full_softmax": [True], "train.hard_negatives": [0.5]}  # valid alone, not together
    result = tune(load_config(None, BASE), tmp_path / "tune", trials=2, space=space, log=lines.append)
    assert [t.state.name for t in result.trials] == ["COMPLETE", "FAIL"] and result.best_trial == 0
    assert any(line.startswith("trial 1: fail") for line in lines)
    assert any("train.hard_negatives: has no effect with train.full_softmax" in line for line in lines), lines
    # a running trial prints a line per validation (was: nothing while a trial trained)
    finished = f"trial 0: complete  valid {result.trials[0].value:.4f}  (the base config)"
    assert lines.index("trial 0: training (the base config)") < lines.index(finished)
    assert [line.split(":")[0] for line in lines if line.startswith("trial 0 @")] == [
        "trial 0 @ step 10",
        "trial 0 @ step 20",
    ]


def test_a_base_config_that_does_not_train_stops_the_tune(tmp_path):
    lines: list[str] = []
    (tmp_path / "clicks.csv").write_text("user,item\n1,2\n")  # too few clicks to split
    with pytest.raises(ValueError, match="no trial has completed"):
        tune(
            load_config(None, [f"data.source={tmp_path / 'clicks.csv'}", "data.time_col="]),
            tmp_path / "tune",
            trials=3,
            log=lines.append,
        )
    assert [t.state.name for t in open_study(tmp_path / "tune").get_trials()] == ["FAIL"]
    assert lines[-1].startswith("trial 0: fail") and lines[-1].endswith(
        "no clicks left after filtering (data.min_item_count=5, data.min_user_count=5, data.kcore=False)"
    ), lines


def test_a_trial_stopped_by_ctrl_c_is_queued_again(tmp_path, monkeypatch):
    import recsys.tune

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(recsys.tune, "train", interrupted)
    with pytest.raises(KeyboardInterrupt) as raised:
        tune(load_config(None, BASE), tmp_path / "tune", trials=2, log=lambda line: None)
    assert str(raised.value) == f"running the same recsys tune again (folder {tmp_path / 'tune'}) resumes it"
    trials = open_study(tmp_path / "tune").get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"] and trials[1].user_attrs["base"]


@pytest.mark.slow
def test_jobs_train_trials_in_processes_with_their_share_of_threads(tmp_path):
    import os

    """The queued base config is taken from the study before the workers start (two processes could
    pop the same queued trial from the SQLite study) and trains in this process beside them: one
    worker process for the other trials, each of the two with half the cores."""
    result = tune(load_config(None, BASE), tmp_path / "tune", trials=3, jobs=2, log=lambda line: None)
    states = [t.state.name for t in result.trials]
    assert len(states) == 3 and set(states) <= {"COMPLETE", "PRUNED"}  # exactly --trials, none extra
    assert result.trials[0].user_attrs["base"] and states[0] == "COMPLETE"
    threads = {RunDir(t.user_attrs["run_dir"]).read_config().train.cpu_threads for t in result.trials}
    assert threads == {max(1, len(os.sched_getaffinity(0)) // 2)}


def test_each_trial_keeps_its_max_minutes_on_a_simulated_clock(tmp_path, monkeypatch, simulated_clock):
    """Was: trials with train.max_minutes=1.5 ran about 4x their cap: the data, the last validation
    and the test came on top of the training loop's budget, read every train.log_every steps. On
    a simulated clock (reading the data 5 s, a step 1 s, a user evaluated 0.1 s) each trial ends
    within max(5%, one validation) of its minute."""
    import recsys.tune

    spans: list[float] = []
    real_train = recsys.tune.train

    def timed(*args, **kwargs):
        start = simulated_clock.now
        result = real_train(*args, **kwargs)
        spans.append(simulated_clock.now - start)
        return result

    monkeypatch.setattr(recsys.tune, "train", timed)
    base = load_config(None, BASE + ["train.max_minutes=1", "train.max_steps=1000", "train.patience=0"])
    result = tune(base, tmp_path / "tune", trials=2, space={"model.dim": [16, 32]}, log=lambda line: None)
    assert [t.state.name for t in result.trials] == ["COMPLETE", "COMPLETE"]
    validation = simulated_clock.user_s * simulated_clock.evaluated[0]
    assert len(spans) == 3  # the two trials and the best config's retrain
    assert all(60 - validation <= s <= 60 + max(0.05 * 60, validation) for s in spans), (spans, validation)


def test_max_minutes_fails_a_cut_trial_queues_it_again_and_bounds_the_retrain(tmp_path, monkeypatch):
    """Was: a trial cut by --max-minutes counted as complete (its partial curve steering the
    sampler), and the best config's retrain ran past the budget. Validations are slowed down to
    0.4 s so a trial outlasts a 1.2 s budget."""
    import shutil
    import time

    from recsys.train import trainer

    real_evaluate = trainer.evaluate_with_config

    def slow_evaluate(*args, **kwargs):
        time.sleep(0.4)
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate_with_config", slow_evaluate)
    base = load_config(None, BASE + ["train.eval_every=4", "train.log_every=1"])
    folder, space = tmp_path / "tune", {"model.dim": [16, 32]}
    tune(base, folder, trials=1, space=space, log=lambda line: None)  # trial 0: the base config, no budget
    shutil.rmtree(folder / "best-0000")  # its retrain, so the next call decides again
    lines: list[str] = []
    result = tune(base, folder, trials=2, max_minutes=0.02, space=space, log=lines.append)
    states = [t.state.name for t in result.trials]
    assert states == ["COMPLETE", "FAIL", "WAITING"]
    cut, queued = result.trials[1], result.trials[2]
    assert "stopped by the tune's max_minutes at step" in cut.user_attrs["error"]
    assert queued.system_attrs["fixed_params"] == cut.params  # it runs again first on resume
    assert result.best_trial == 0 and result.run_dir == "" and result.test_metrics == {}
    assert any("the best config is not retrained" in line and "recsys train --config" in line for line in lines)
    assert not (folder / "best-0000").exists()

    # Resumed: the cut trial continues its run from its last checkpoint (was: from step 0).
    cut_dir = RunDir(cut.user_attrs["run_dir"])
    cut_steps = [r["step"] for r in cut_dir.read_metrics() if "loss" in r]
    monkeypatch.setattr(trainer, "evaluate_with_config", real_evaluate)
    lines.clear()
    result = tune(base, folder, trials=2, space=space, log=lines.append)
    resumed = result.trials[2]
    assert resumed.state.name in ("COMPLETE", "PRUNED") and resumed.user_attrs["run_dir"] == str(cut_dir.path)
    assert any(f"trial 2: resuming {cut_dir.path} from its last checkpoint" in line for line in lines)
    steps = [r["step"] for r in cut_dir.read_metrics() if "loss" in r]
    assert steps[: len(cut_steps)] == cut_steps and steps == sorted(set(steps))  # continued, never restarted
    assert steps[-1] > cut_steps[-1]


def test_best_toml_names_the_data_file_absolutely(tmp_path, monkeypatch):
    """Was: a relative data.source in best.toml, so `--config best.toml` failed from another folder."""
    from recsys.config import SyntheticConfig
    from recsys.data.synthetic import generate

    synthetic = load_config(None, TINY_RUN_OVERRIDES).synthetic
    assert isinstance(synthetic, SyntheticConfig)
    monkeypatch.chdir(tmp_path)
    generate(synthetic).rename(columns={"time": "timestamp"}).to_csv("clicks.csv", index=False)
    cfg = load_config(None, BASE + ["data.source=clicks.csv"])
    result = tune(cfg, tmp_path / "tune", trials=1, space={"model.dim": [16]}, log=lambda line: None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_config(result.best_config).data.source == str(tmp_path / "clicks.csv")


def test_the_objective_is_eval_objective(tmp_path):
    """Under leave-one-out with eval.objective = ndcg@10, trials are ranked by their best valid NDCG@10."""
    cfg = load_config(None, BASE + ["data.split=leave_one_out", "eval.objective=ndcg@10"])
    result = tune(cfg, tmp_path / "tune", trials=1, log=lambda line: None)
    records = RunDir(result.trials[0].user_attrs["run_dir"]).read_metrics()
    valid = [r["ndcg@10"] for r in records if r.get("split") == "valid"]
    assert result.key == "ndcg@10" and result.best_valid == max(valid) and len(valid) >= 2
    assert "valid ndcg@10" in trials_table(result).splitlines()[0]
