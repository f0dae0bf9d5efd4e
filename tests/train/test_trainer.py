"""End-to-end training runs on small synthetic data (PyTorch kernels; CPU)."""

import itertools
import json

import pytest
import torch

from recsys.api import Run
from recsys.cli import main
from recsys.config import ConfigError, load_config
from recsys.run import RunDir
from recsys.train.trainer import train
from tests.conftest import TINY_TRAIN_OVERRIDES

TINY = TINY_TRAIN_OVERRIDES


def _cfg(tmp_path, *extra):
    return load_config(None, TINY + [f"output_dir={tmp_path}", *extra])


class _Crash(Exception):
    pass


@pytest.mark.parametrize("updates", ["dense", "sparse", "sharded", "dense, by epochs"])
def test_resume_reproduces_uninterrupted_run(tmp_path, updates):
    extra = ["model.dropout=0.1", f"train.item_updates={updates.split(',')[0]}"]
    extra += ["train.draw=epochs"] if "epochs" in updates else []  # the epoch's order resumes where it was
    full = train(_cfg(tmp_path, "name=full", *extra), log=lambda s: None)

    def crash_after_first_checkpoint(line: str) -> None:
        if line.startswith("step 30/"):
            raise _Crash

    cfg = _cfg(tmp_path, "name=resumed", *extra)
    with pytest.raises(_Crash):
        train(cfg, log=crash_after_first_checkpoint)
    assert RunDir(tmp_path / "resumed").load_checkpoint()["step"] == 20
    resumed = train(cfg, run_dir=str(tmp_path / "resumed"), resume=True, log=lambda s: None)

    assert resumed.steps == full.steps == 40
    assert resumed.test_metrics == full.test_metrics
    a, b = RunDir(full.run_dir).load_checkpoint(), RunDir(resumed.run_dir).load_checkpoint()
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, rtol=0, atol=0, msg=name)
    steps = [r["step"] for r in RunDir(resumed.run_dir).read_metrics()]
    assert steps == [r["step"] for r in RunDir(full.run_dir).read_metrics()]  # no duplicated records


def test_wall_clock_budget_validates_then_stops(tmp_path):
    lines: list[str] = []
    result = train(_cfg(tmp_path, "name=budget", "train.max_minutes=1e-9"), log=lines.append)
    assert result.steps == 1  # the clock is read after every step
    assert any("train.max_minutes=1e-09 reached" in line for line in lines), lines
    valid = [r for r in RunDir(result.run_dir).read_metrics() if r.get("split") == "valid"]
    assert [r["step"] for r in valid] == [1] and result.best_step == 1
    assert result.test_metrics["recall@50"] >= 0


@pytest.mark.parametrize("data_s", [5.0, 1.0])
def test_max_minutes_bounds_the_whole_run_on_a_simulated_clock(tmp_path, simulated_clock, data_s):
    """Was: the clock was read every train.log_every steps and counted the training loop only, so the
    data, the last steps, the last validation and the test came on top (a 4-minute cap ran 368 s).
    On a simulated clock (reading the data ``data_s``, a step 1 s, a user evaluated 0.1 s: about
    6 s a validation, every 20 steps) a 1-minute budget ends within max(5%, one validation) of it,
    having used it. Reading the data in 1 s puts a validation due at 47 s, after which no time is
    left for another: it is the last one (was: validated again at the next step)."""
    simulated_clock.data_s = data_s
    sets = ("train.max_minutes=1", "train.max_steps=1000", "train.patience=0", "train.log_every=25")
    start = simulated_clock.now
    result = train(_cfg(tmp_path, "name=capped", *sets), log=lambda line: None)
    spent, validation = simulated_clock.now - start, simulated_clock.user_s * simulated_clock.evaluated[0]
    assert result.out_of_time
    assert 60 - validation <= spent <= 60 + max(0.05 * 60, validation), (spent, validation)
    steps = [r["step"] for r in RunDir(result.run_dir).read_metrics() if r.get("split") == "valid"]
    assert all(b - a > 1 for a, b in itertools.pairwise(steps)), steps


def test_a_busy_machine_trains_on_the_cores_left_free(tmp_path, monkeypatch):
    """Was: torch's default threads (every core) however busy the machine; now the resolved
    train.cpu_threads, saved with the run and logged."""
    from recsys.run import settings

    monkeypatch.setattr(settings, "machine_cores", lambda: (2, 1.3))
    monkeypatch.setattr(settings, "TORCH_THREADS", 2)
    before = torch.get_num_threads()
    lines: list[str] = []
    try:
        result = train(_cfg(tmp_path, "name=busy", "train.max_steps=2"), log=lines.append)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert RunDir(result.run_dir).read_config().train.cpu_threads == 1
    assert "CPU threads: 1 (train.cpu_threads; this process may run on 2 cores, 1.3 of them busy" in "\n".join(lines)


def test_run_directory_is_self_contained(tmp_path):
    result = train(_cfg(tmp_path, "name=run", "model.name=youtube_dnn"), log=lambda s: None)
    run = RunDir(result.run_dir)
    for name in ("config.json", "model.pt", "best.pt", "metrics.jsonl", "test_metrics.json"):
        assert run.file(name).exists(), name
    saved = torch.load(run.file("model.pt"), weights_only=True)
    assert saved["step"] == 40 and "optimizer" in saved
    logged = run.read_metrics()
    assert {"loss", "log_z", "grad_norm", "samples_per_s"} <= set(logged[0])
    assert all(r["loss"] == r["loss"] for r in logged if "loss" in r)  # no NaN
    # `recsys evaluate RUN` needs nothing but the directory and reproduces the test metrics
    assert Run.load(run.path).evaluate() == pytest.approx(result.test_metrics)


@pytest.mark.parametrize(
    "override, key",
    [("train.lr=-0.5", "train.lr"), ("model.name=nope", "model.name"), ("train.sampler=zipf", "train.sampler")],
)
def test_bad_config_fails_before_training(tmp_path, capsys, override, key):
    code = main(["train", "--set", f"output_dir={tmp_path}", "--set", override])
    assert code == 2
    assert key in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was written


def test_cli_train_prints_table_and_writes_json(tmp_path, capsys):
    args = ["train"] + [a for o in TINY + [f"output_dir={tmp_path}", "name=cli"] for a in ("--set", o)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Recall@50" in out and "comirec_sa" in out
    metrics = json.loads((tmp_path / "cli" / "test_metrics.json").read_text())
    assert 0.0 <= metrics["recall@50"] <= 1.0


def test_cli_resume_extends_the_budget_and_refuses_other_changes(tmp_path, capsys):
    first = train(_cfg(tmp_path, "name=run"), log=lambda s: None)
    run = first.run_dir
    for args, key in [(["--set", "train.lr=0.5"], "train.lr"), (["--model", "youtube_dnn"], "--model")]:
        assert main(["train", "--resume", run, *args]) == 2
        assert key in capsys.readouterr().err
    assert RunDir(run).read_config().train.max_steps == 40  # refused changes wrote nothing
    assert main(["train", "--resume", run, "--set", "train.max_steps=60"]) == 0
    assert main(["train", "--resume", run, "--set", "train.max_epochs=3"]) == 0  # the automatic budget's size
    assert RunDir(run).read_config().train.max_epochs == 3
    assert RunDir(run).read_config().train.max_steps == 60
    steps = [r["step"] for r in RunDir(run).read_metrics() if "loss" in r]
    assert steps == [10, 20, 30, 40, 50, 60]  # continued from step 40, nothing repeated


def test_unknown_config_key_is_a_config_error():
    with pytest.raises(ConfigError, match="train.max_step"):
        load_config(None, ["train.max_step=3"])


LEARN = [
    "synthetic.num_users=4000",
    "synthetic.num_items=2000",
    "synthetic.num_categories=100",
    "synthetic.interests_per_user=4",
    "synthetic.popularity_alpha=1.0",
    "model.dim=32",
    "model.backend=torch",
    "train.batch_size=128",
    "train.lr=0.01",
    "train.max_steps=600",
    "train.eval_every=300",
    "train.log_every=300",
    "data.max_len=20",
]


@pytest.mark.slow
def test_comirec_sa_recovers_planted_interests(tmp_path):
    """Issue 3 acceptance: Recall@50 of comirec_sa >= 3x MostPopular's and above youtube_dnn's."""
    recall = {}
    for name in ("popular", "youtube_dnn", "comirec_sa"):
        cfg = load_config(None, LEARN + [f"model.name={name}", f"output_dir={tmp_path}", f"name={name}"])
        recall[name] = train(cfg, log=lambda s: None).test_metrics["recall@50"]
    assert recall["comirec_sa"] >= 3 * recall["popular"], recall
    assert recall["comirec_sa"] > recall["youtube_dnn"], recall


def test_a_plateau_with_lr_drops_left_goes_back_to_the_best_weights_at_a_lower_rate(tmp_path, monkeypatch):
    """With a rate so low that nothing moves, every validation after a drop scores the best
    weights exactly, and the run stops at the plateau after the last drop."""
    monkeypatch.setattr("recsys.train.plan.MIN_STOP_EPOCHS", 1)  # plateaus from the first epoch on
    lines: list[str] = []
    drops = ["train.lr_drops=2", "train.lr_drop_factor=1e-12", "train.patience=1", "model.dropout=0"]
    cfg = _cfg(tmp_path, "name=drops", "train.max_steps=640", "train.eval_every=10", *drops)
    result = train(cfg, log=lines.append)
    plateaus = [line for line in lines if line.startswith("plateau at step")]
    assert len(plateaus) == 2 and f"back to the best weights (step {result.best_step})" in plateaus[0], plateaus
    assert any(line.startswith("early stop at step") for line in lines) and result.steps < 640
    run = RunDir(result.run_dir)
    valid = [r for r in run.read_metrics() if r.get("split") == "valid"]
    first_drop = int(plateaus[0].split()[3].rstrip(":"))
    after = [r["recall@50"] for r in valid if r["step"] > first_drop]
    assert len(after) == 2 and after == [result.best_valid] * 2
    last = run.load_checkpoint()
    assert last["lr_drops"] == 2 and last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-3 * 1e-24)
    for name, tensor in run.load_best().items():
        torch.testing.assert_close(last["model"][name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("updates", ["dense", "sparse"])
def test_a_run_resumed_after_an_lr_drop_trains_as_the_uninterrupted_one(tmp_path, updates, monkeypatch):
    monkeypatch.setattr("recsys.train.plan.MIN_STOP_EPOCHS", 1)  # plateaus from the first epoch on
    drops = ["train.lr_drops=1", "train.patience=1", "model.dropout=0.1", "train.max_steps=320", "train.eval_every=10"]
    drops.append(f"train.item_updates={updates}")
    full = train(_cfg(tmp_path, "name=full", *drops), log=lambda s: None)
    seen: list[str] = []

    def crash_after_the_drop(line: str) -> None:
        seen.append(line)
        if line.startswith("step ") and any(s.startswith("plateau at step") for s in seen):
            raise _Crash

    cfg = _cfg(tmp_path, "name=resumed", *drops)
    with pytest.raises(_Crash):
        train(cfg, log=crash_after_the_drop)
    assert RunDir(tmp_path / "resumed").load_checkpoint()["lr_drops"] == 1  # saved after the drop
    resumed = train(cfg, run_dir=str(tmp_path / "resumed"), resume=True, log=lambda s: None)
    assert (resumed.steps, resumed.best_step) == (full.steps, full.best_step)
    assert resumed.test_metrics == full.test_metrics


def test_the_weight_average_is_what_is_validated_kept_and_tested(tmp_path):
    """train.ema_decay: best.pt holds the bias-corrected average (not the last weights), and the
    checkpoint carries the running sums a resume continues from."""
    steps = ["train.max_steps=20", "train.eval_every=20", "model.dropout=0.1"]
    result = train(_cfg(tmp_path, "name=avg", "train.ema_decay=0.9", *steps), log=lambda s: None)
    run = RunDir(result.run_dir)
    ck, best = run.load_checkpoint(), run.load_best()
    assert ck["average"]["start"] == 0 and ck["average"]["decay"] == 0.9 and result.best_step == 20
    params = [n for n, p in Run.load(result.run_dir).model.named_parameters() if p.requires_grad]
    assert sorted(ck["average"]["weights"]) == sorted(params)
    for name, average in ck["average"]["weights"].items():
        assert torch.equal(best[name], average), name
    assert any(not torch.equal(best[n], ck["model"][n]) for n in params)  # the last weights differ
    last = RunDir(train(_cfg(tmp_path, "name=last", "train.ema_decay=0", *steps), log=lambda s: None).run_dir)
    assert "average" not in last.load_checkpoint()
    for name, tensor in last.load_best().items():
        torch.testing.assert_close(last.load_checkpoint()["model"][name], tensor, rtol=0, atol=0, msg=name)


def test_lr_drops_need_a_plateau_to_wait_for_and_a_factor_below_one(tmp_path):
    with pytest.raises(ConfigError, match=r"train.lr_drop_factor: must be in \(0, 1\)"):
        _cfg(tmp_path, "train.lr_drop_factor=1")
    with pytest.raises(ConfigError, match="train.lr_drops: needs train.patience > 0"):
        _cfg(tmp_path, "train.lr_drops=1", "train.patience=0")


@pytest.mark.parametrize("extra", [[], ["model.name=sasrec"]])
def test_a_horizon_trains_counts_its_targets_and_is_saved(tmp_path, extra):
    """train.predict_next: every history (or position) learns from its next 3 clicks; throughput counts each
    (history, click) pair that feeds the loss, and the saved run reloads with the horizon."""
    one = train(_cfg(tmp_path, "name=one", *extra), log=lambda s: None)
    lines: list[str] = []
    three = train(_cfg(tmp_path, "name=three", "train.predict_next=3", *extra), log=lines.append)
    where = "every position (tiled windows)" if extra else "the last position"
    assert any(line.startswith("model: ") and f"; {where} predicts its next 3 clicks; " in line for line in lines)
    assert three.test_metrics["recall@50"] > 0
    # nearly every synthetic history has three clicks after it: close to 3x the pairs a sample
    ratio = (three.targets_per_s / three.samples_per_s) / (one.targets_per_s / one.samples_per_s)
    assert 2.5 < ratio <= 3.0
    assert Run.load(three.run_dir).config.train.predict_next == 3


def test_the_automatic_horizon_reads_the_data_s_timestamps(tmp_path):
    """comirec_sa at its defaults: the next click on data in time order, the next 5 clicks where most
    consecutive clicks share their (weekly) timestamp; the run records which."""
    from recsys.data.synthetic import generate

    cfg = _cfg(tmp_path, "name=exact", "model.name=comirec_sa")
    clicks = generate(cfg.synthetic).rename(columns={"time": "timestamp"})[["user", "item", "timestamp"]]
    weekly = clicks.assign(timestamp=(clicks["timestamp"] // (7 * 86400)) * (7 * 86400))
    horizons = {}
    for name, df in (("exact", clicks), ("weekly", weekly)):
        lines: list[str] = []
        sets = [f"name={name}", "model.name=comirec_sa", "data.source=<dataframe>"]
        result = train(_cfg(tmp_path, *sets), clicks=df, log=lines.append)
        horizons[name] = Run.load(result.run_dir).config.train.predict_next
        clicks_said = "its next 5 clicks" if horizons[name] == 5 else "its next click"
        assert any(line.startswith("model: ") and f"the last position predicts {clicks_said}" in line for line in lines)
    assert horizons == {"exact": 1, "weekly": 5}


@pytest.mark.parametrize("updates", ["sparse", "sharded"])
def test_a_row_sparse_run_keeps_the_item_table_s_average_as_its_best_weights(tmp_path, updates):
    """train.item_updates = "sparse" (or "sharded", in one process the same): the item rows and
    their average live in the checkpoint's item_rows; best.pt holds that average, brought up to the
    validated step, and a lost best.pt is restored from it."""
    steps = ["train.max_steps=20", "train.eval_every=20", "train.ema_decay=0.9", f"train.item_updates={updates}"]
    result = train(_cfg(tmp_path, "name=rows", *steps), log=lambda s: None)
    run = RunDir(result.run_dir)
    ck, best = run.load_checkpoint(), run.load_best()
    table = "embedding.table.weight"
    assert table not in ck["average"]["weights"] and ck["item_rows"]["steps"] == 20
    assert torch.equal(best[table], ck["item_rows"]["weights"][table])
    assert not torch.equal(best[table], ck["model"][table])
    assert (ck["item_rows"]["current"] == 20).all()  # every row caught up before it was saved
    run.file("best.pt").unlink()
    with pytest.warns(UserWarning, match="restored from"):
        run.require_checkpoint()
    assert torch.equal(run.load_best()[table], best[table])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["synthetic.num_items=300"], "dense"),  # a small catalogue: the whole-table update is cheap
        (["train.full_softmax=true"], "dense"),  # the exact softmax reads every row
    ],
)
def test_automatic_item_updates_follow_the_catalogue_and_the_softmax(tmp_path, overrides, expected):
    from recsys.run import build_experiment

    exp = build_experiment(_cfg(tmp_path, *overrides))
    assert exp.cfg.train.item_updates == expected


def test_automatic_item_updates_are_sparse_from_the_measured_catalogue_size(tmp_path):
    from recsys.models.spec import SPARSE_ITEMS
    from tests.conftest import resolved

    cfg = _cfg(tmp_path)
    assert resolved(cfg, SPARSE_ITEMS + 1).train.item_updates == "sparse"
    assert resolved(cfg, SPARSE_ITEMS).train.item_updates == "dense"


@pytest.mark.parametrize("updates", ["sparse", "sharded"])
def test_sparse_item_updates_refuse_a_loss_that_reads_every_row(tmp_path, updates):
    for override, why in [("train.full_softmax=true", "full_softmax"), ("train.hard_negatives=0.5", "hard_negatives")]:
        with pytest.raises(ConfigError, match=f'train.item_updates="{updates}": train.{why}'):
            train(_cfg(tmp_path, f"train.item_updates={updates}", override), log=lambda s: None)


def test_validation_scores_a_fixed_sample_of_the_validation_users_and_the_test_all(tmp_path):
    lines: list[str] = []
    result = train(_cfg(tmp_path, "name=sample", "eval.valid_users=25"), log=lines.append)
    said = next(line for line in lines if line.startswith("validation: "))
    assert said.startswith("validation: 25 of the ") and "the test scores all" in said
    valid = [r for r in RunDir(result.run_dir).read_metrics() if r.get("split") == "valid"]
    assert valid and all(r["users"] == 25 for r in valid)
    assert result.test_metrics["users"] > 25


def test_validation_waits_while_it_would_pass_its_share_of_the_time():
    from recsys.train.meter import RunMeter
    from recsys.train.plan import TrainPlan

    clock = [100.0]
    plan = TrainPlan(max_steps=1000, first=10, growth=0.1, epoch_steps=100, weight_decay=0.0, targets=0, world_size=1)

    def meter(eval_every: int) -> RunMeter:
        train = load_config(None, [f"train.eval_every={eval_every}"]).train
        return RunMeter(plan, train, start_step=0, samples_per_step=1, clock=lambda: clock[0])

    share = meter(0)
    assert share.may_validate()  # nothing measured yet
    with share.paused():
        clock[0] += 2.0  # a validation of 2 s
    clock[0] += 17.0
    assert not share.may_validate()  # 17 s of training: the validation would be over 10% of the time
    clock[0] += 1.0
    assert share.may_validate()
    fixed = meter(10)
    with fixed.paused():
        clock[0] += 2.0
    assert fixed.may_validate()  # a fixed cadence never waits
