"""The progress line's throughput and time left (recsys.train.meter), on a fake clock."""

import math

from recsys.config import TrainConfig
from recsys.train.meter import Rates, RunMeter
from recsys.train.plan import TrainPlan


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _meter(
    clock: Clock, *, max_steps=87_810, first=100, growth=0.0, patience=5, max_minutes=0.0, epoch_steps=50
) -> RunMeter:
    plan = TrainPlan(
        max_steps=max_steps,
        first=first,
        growth=growth,
        epoch_steps=epoch_steps,
        weight_decay=0.0,
        targets=0,
        world_size=1,
    )
    deadline = clock() + 60 * max_minutes if max_minutes else math.inf
    return RunMeter(
        plan, TrainConfig(patience=patience), start_step=0, samples_per_step=128, clock=clock, deadline=deadline
    )


def test_time_left_counts_the_plateau_stop_not_the_step_cap():
    """Was: "at most 87,810s left" at step 100 of a run the plateau stop ended after 12 minutes."""
    clock = Clock()
    meter = _meter(clock)
    clock.now += 1.0  # 100 steps a second
    assert meter.time_left(100, last_eval=0, bad_evals=0, validated=False) == ""  # no best yet: nothing to say
    # validated at step 100 (the best so far): the plateau stop is 5 validations later, at step 600
    assert meter.plateau_stop(100, 0) == 600
    assert meter.time_left(100, last_eval=100, bad_evals=0, validated=True) == "~5s left without a new best"
    assert meter.time_left(100, last_eval=100, bad_evals=3, validated=True) == "~2s left without a new best"
    drop = meter.time_left(100, last_eval=100, bad_evals=3, validated=True, drops_left=1)
    assert drop == "~2s to a plateau without a new best (then a lower rate)"  # train.lr_drops: no stop there


def test_plateau_stop_waits_for_one_epoch():
    """Five validations without improvement end a run only once it has passed over its data once."""
    meter = _meter(Clock(), epoch_steps=878)
    assert meter.plateau_stop(100, 0) == 900  # not 600: the first validation after the epoch
    assert meter.plateau_stop(1_000, 0) == 1_500  # past the epoch, five validations as before
    assert meter.plateau_stop(800, 5) == 900


def test_plateau_stop_follows_a_growing_cadence_and_the_step_cap():
    meter = _meter(Clock(), max_steps=5_000, first=250, growth=0.1)
    assert meter.plateau_stop(4_000, 0) == 5_000  # validations at 4,400 and 4,840, then the cap
    meter = _meter(Clock(), max_steps=100_000, first=250, growth=0.1)
    assert meter.plateau_stop(10_000, 0) == 10_000 + 1_000 + 1_100 + 1_210 + 1_331 + 1_464


def test_time_left_without_plateau_stop_and_with_a_time_budget():
    clock = Clock()
    meter = _meter(clock, patience=0, max_steps=2_000)
    clock.now += 10.0  # 1,000 steps in 10 s
    assert meter.time_left(1_000, 0, 0, validated=False) == "~10s left"
    clock = Clock()
    meter = _meter(clock, max_minutes=1.0)  # a 60 s budget
    clock.now += 15.0  # 1,500 steps in 15 s
    assert meter.time_left(1_500, 0, 0, validated=False) == "at most 45s left (train.max_minutes)"
    # a plateau stop sooner than the budget (5 validations, 100 steps apart) is the estimate
    assert meter.time_left(1_500, 1_500, 0, validated=True) == "~5s left without a new best"


def test_throughput_leaves_out_validations_and_the_summary_is_the_runs():
    """Was: the summary's samples/s was the last log window's."""
    clock = Clock()
    meter = _meter(clock)
    clock.now += 1.0
    assert meter.log(100) == Rates(12_800.0, 12_800.0)  # 100 steps of 128 in 1 s
    clock.now += 2.0
    with meter.paused():  # a validation of 3 s inside the next window
        clock.now += 3.0
    window = meter.log(100, targets=100 * 128 * 9)  # dense: 9 targets a sample
    assert window == Rates(6_400.0, 57_600.0)
    assert meter.average() == Rates(25_600 / 3, (12_800 + 115_200) / 3)
    assert window.describe() == "6,400 samples/s, 57,600 targets/s"
    assert Rates(12_800.0, 12_800.0).describe() == "12,800 samples/s"
