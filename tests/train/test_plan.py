"""The plan of a run from its resolved config and the data's facts: budget, validation cadence,
and the automatic weight decay the resolver decides from the same facts (recsys.train.plan,
recsys.run.settings)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from recsys.config import ConfigError, load_config
from recsys.models import spec_for
from recsys.run.settings import Facts, resolve
from recsys.train.plan import EVAL_GROWTH, MAX_FIRST, MIN_FIRST, TrainPlan, plan_training


def _plan(lengths: list[int], *overrides: str, model: str = "comirec_sa", world_size: int = 1) -> TrainPlan:
    """The plan of ``model`` with ``overrides`` on training sequences of ``lengths`` clicks."""
    facts = Facts.of_lengths(lengths, num_items=1000, world_size=world_size)
    cfg = resolve(load_config(None, [f"model.name={model}", *overrides]), facts)
    return plan_training(cfg.train, facts)


def _train(*overrides: str, lengths: tuple[int, ...] | list[int] = (10,) * 5000, world_size: int = 1):
    """The resolved train section of ``overrides`` on training sequences of ``lengths`` clicks."""
    facts = Facts.of_lengths(lengths, num_items=1000, world_size=world_size)
    return resolve(load_config(None, ["model.name=comirec_sa", *overrides]), facts).train


def _validations(schedule, until: int) -> list[int]:
    steps, last = [], 0
    for step in range(1, until + 1):
        if schedule.validates_at(step, last):
            steps.append(step)
            last = step
    return steps


def test_targets_count_clicks_after_min_target():
    # lengths 3, 5, 10 with min_target 4: 0 + 1 + 6 targets
    assert Facts.of_lengths([3, 5, 10], num_items=10).targets(4) == 7
    assert Facts.of_lengths([3, 5, 10], num_items=10).targets(1) == 15
    assert Facts.of_lengths([3, 5, 10], num_items=10).users(4) == 2


def test_budget_is_max_epochs_passes_over_the_targets():
    lengths = [14] * 1000  # 10 targets each at min_target 4: 10,000 targets
    cfg = ("train.batch_size=100", "train.max_epochs=3")
    s = _plan(lengths, *cfg)
    assert s.epoch_steps == 100 and s.max_steps == 300
    # several processes draw batch_size each: the same data is fewer steps
    assert _plan(lengths, *cfg, world_size=2).max_steps == 150
    # an explicit max_steps wins
    assert _plan(lengths, "train.max_steps=77").max_steps == 77


def test_automatic_cadence_starts_at_one_pass_over_users_and_grows():
    users = 128 * 1000  # one pass over the users: 1,000 steps at batch 128
    s = _plan([20] * users, "train.batch_size=128")
    assert s.first == 1000 and s.growth == EVAL_GROWTH
    steps = _validations(s, 40_000)
    assert steps[:3] == [1000, 2000, 3000]
    gaps = np.diff(steps)
    assert (gaps >= 1000).all() and (np.diff(gaps) >= 0).all()  # never shorter, and growing
    late = [b - a for a, b in itertools.pairwise(steps) if a >= 20_000]
    assert all(abs(gap - EVAL_GROWTH * a) <= 1 for gap, a in zip(late, [a for a in steps if a >= 20_000]))
    # the number of validations grows like the logarithm of the run's length
    assert len(_validations(s, 400_000)) - len(steps) < 30


@pytest.mark.parametrize("users, first", [(50, MIN_FIRST), (10**7, MAX_FIRST)])
def test_automatic_first_cadence_is_clamped(users, first):
    s = _plan([6] * users, "train.batch_size=128")
    assert s.first == first


def test_fixed_eval_every_and_last_step_validate():
    s = _plan([10] * 10, "train.eval_every=30", "train.max_steps=100")
    assert s.growth == 0
    assert _validations(s, 100) == [30, 60, 90, 100]


def test_patience_covers_a_share_of_the_run():
    """With the growing cadence, `patience` validations after a best at step b end near
    b * (1 + growth) ** patience, whatever the dataset size."""
    s = _plan([20] * 128 * 300, "train.batch_size=128")
    best = 30_000
    after = [v for v in _validations(s, 200_000) if v > best][:5]
    assert 1.5 * best < after[-1] < 1.7 * best


def test_describe_names_budget_cadence_and_stop():
    t = _train()
    line = _plan([10] * 5000).describe(t)
    assert "100 epochs of" in line and "10% of the steps" in line
    assert "after 5 validations without improvement" in line and "weight decay" in line
    assert "plateau" not in line.split("early stop")[1].split(";")[0]
    drops = _train("train.lr_drops=2")
    line = _plan([10] * 5000, "train.lr_drops=2").describe(drops)
    assert "the first 2 plateau(s) going back to the best weights at lr × 0.1" in line
    assert line.endswith("validating the weights averaged over about 1,000 steps (train.ema_decay 0.999)")
    last = _train("train.ema_decay=0")
    assert _plan([10] * 5000, "train.ema_decay=0").describe(last).endswith("validating the last weights")


def test_describe_opens_with_the_batch_and_the_rate_and_says_why_the_rule_scaled_the_batch():
    small = [10] * 5000
    assert _plan(small).describe(_train()).startswith("plan: batch 128, lr 0.001; up to ")
    large = [104] * 736_158  # 73.6M targets: 575,124 steps an epoch at 128
    line = _plan(large).describe(_train(lengths=large))
    assert line.startswith(
        "plan: batch 4,096 (for 73.6M targets), lr 0.001; up to 1,797,300 steps (100 epochs of 17,973 steps);"
    )
    mine = ("train.batch_size=512", "train.lr=0.004")  # set by hand: no rule to name
    assert _plan(small, *mine).describe(_train(*mine)).startswith("plan: batch 512, lr 0.004; ")
    two = _plan(large, world_size=2).describe(_train(lengths=large, world_size=2))
    assert two.startswith("plan: batch 2 × 2,048 (for 73.6M targets), lr 0.001; ")
    with pytest.raises(ValueError, match="TrainPlan.describe: .*train.batch_size"):
        _plan(small).describe(load_config(None, []).train)


def test_automatic_weight_decay_is_a_fixed_shrinkage_per_epoch():
    """lr * weight_decay * epoch_steps is the same on a small and a 4x larger dataset, so each
    pass over the data shrinks the weights by exp(-epoch_decay) whatever its size."""
    t = ("train.batch_size=100", "train.lr=0.002")
    small = _plan([14] * 1000, *t)  # 10,000 targets: 100 steps an epoch
    large = _plan([14] * 4000, *t)
    assert small.weight_decay == pytest.approx(spec_for("comirec_sa").automatic.epoch_decay / (0.002 * 100))
    assert large.weight_decay == pytest.approx(small.weight_decay / 4)
    youtube = _plan([14] * 1000, *t, model="youtube_dnn")
    assert youtube.weight_decay == pytest.approx(0.5 / (0.002 * 100)) != small.weight_decay
    # several processes: an epoch is fewer steps, so each step decays more
    assert _plan([14] * 1000, *t, world_size=2).weight_decay == pytest.approx(2 * small.weight_decay)


def test_explicit_weight_decay_and_plain_adam():
    lengths = [14] * 1000
    assert _plan(lengths, "train.weight_decay=0.3").weight_decay == 0.3
    assert _plan(lengths, "train.weight_decay=0").weight_decay == 0.0
    assert _plan(lengths, "train.optimizer=adam").weight_decay == 0.0


@pytest.mark.parametrize(
    "setting", ["train.max_steps=-1", "train.eval_every=-5", "train.max_epochs=0", "train.weight_decay=-0.5"]
)
def test_bad_budget_values_name_the_key(setting):
    with pytest.raises(ConfigError, match=setting.split("=")[0]):
        load_config(None, [setting])


def test_a_dense_epoch_is_as_many_windows_as_targets():
    """train.predict_at = "all": the targets are all clicks with one before them, and an epoch draws a
    window per target, so the budget and the decay a step match last-position training's."""
    lengths = [11] * 100  # 1,000 dense targets (10 a user), 700 with min_target = 4
    dense = _plan(lengths, "train.predict_at=all", "train.batch_size=10")
    last = _plan(lengths, "train.predict_at=last", "train.batch_size=10")
    assert (dense.epoch_steps, last.epoch_steps) == (100, 70)
    assert dense.max_steps == 100 * 100
    assert dense.weight_decay == pytest.approx(last.weight_decay * 70 / 100)


def test_the_plateau_stop_waits_for_one_epoch_and_the_minimum_samples():
    from recsys.train.plan import MIN_STOP_SAMPLES

    assert MIN_STOP_SAMPLES == 64_000 * 10
    samples = _plan([14] * 10_000, "train.batch_size=10")  # 100,000 targets: an epoch of 10,000 steps
    assert (samples.epoch_steps, samples.stop_floor) == (10_000, 64_000)
    assert not samples.plateau_reached(step=63_999, bad_evals=5, patience=5)  # a pause on the way up
    assert samples.plateau_reached(step=64_000, bad_evals=5, patience=5)
    assert not samples.plateau_reached(step=70_000, bad_evals=4, patience=5)
    assert not samples.plateau_reached(step=70_000, bad_evals=9, patience=0)  # no early stop
    assert "not before step 64,000 (640,000 samples)" in samples.describe(
        _train("train.batch_size=10", lengths=[14] * 10_000)
    )
    epoch = _plan([14] * 100_000, "train.batch_size=10")  # 1M targets: an epoch is more than the minimum
    assert epoch.stop_floor == epoch.epoch_steps == 100_000
    assert not epoch.plateau_reached(step=99_999, bad_evals=5, patience=5)  # an early noisy peak
    assert "not before step 100,000 (one epoch)" in epoch.describe(
        _train("train.batch_size=10", lengths=[14] * 100_000)
    )
    tiny = _plan([14] * 100, "train.batch_size=10")  # 1,000 targets: ten epochs are fewer samples
    assert (tiny.epoch_steps, tiny.stop_floor) == (100, 1_000)
    assert "not before step 1,000 (10 epochs)" in tiny.describe(_train("train.batch_size=10", lengths=[14] * 100))
    short = _plan([14] * 100, "train.batch_size=10", "train.max_steps=300")  # the budget ends first
    assert short.stop_floor == short.max_steps == 300
    assert short.plateau_reached(step=300, bad_evals=5, patience=5)
    assert "(the last step)" in short.describe(_train("train.batch_size=10", "train.max_steps=300", lengths=[14] * 100))


def test_the_default_negatives_are_ten_per_row_of_the_global_batch():
    """N processes of B rows share the negatives one process draws at N·B; a fixed count stays."""

    def negatives(*overrides: str, world_size: int = 1) -> int:
        facts = Facts.of_lengths([14] * 100, num_items=1000, world_size=world_size)
        return resolve(load_config(None, list(overrides)), facts).train.num_negatives

    assert negatives("train.batch_size=64") == 640
    assert negatives("train.batch_size=16", world_size=4) == 640
    assert negatives("train.batch_size=16", "train.num_negatives=100", world_size=4) == 100
