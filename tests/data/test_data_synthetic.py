"""The synthetic generator: shape, determinism, and that the planted structure is visible."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from recsys.config import SyntheticConfig
from recsys.data.synthetic import generate


def codes(df: pd.DataFrame, col: str) -> np.ndarray:
    return df[col].astype(int).to_numpy()


def test_100k_users_are_generated():
    df = generate(SyntheticConfig(num_users=100_000))
    lengths = np.bincount(codes(df, "user"))
    assert len(lengths) == 100_000 and lengths.min() >= 5
    assert lengths.mean() == pytest.approx(40, rel=0.03)
    assert list(df.columns) == ["user", "item", "time", "category"]


def test_seeded():
    cfg = SyntheticConfig(num_users=300, num_items=200, num_categories=10)
    a, b = generate(cfg), generate(cfg)
    pd.testing.assert_frame_equal(a, b)
    c = generate(SyntheticConfig(num_users=300, num_items=200, num_categories=10, seed=8))
    assert not a["item"].equals(c["item"])


def test_clicks_concentrate_in_planted_categories():
    cfg = SyntheticConfig(num_users=3000, num_items=2000, num_categories=40, interests_per_user=4, noise=0.05)
    df, truth = generate(cfg, return_truth=True)
    users, category = codes(df, "user"), codes(df, "category")
    np.testing.assert_array_equal(category, truth.item_category[codes(df, "item")])
    in_planted = (truth.user_interests[users] == category[:, None]).any(axis=1).mean()
    # a random click would land in a planted category 4 / 40 of the time
    assert in_planted > 0.93
    assert np.all(np.sort(truth.user_interests, axis=1)[:, 1:] != np.sort(truth.user_interests, axis=1)[:, :-1])
    np.testing.assert_allclose(truth.user_weights.sum(axis=1), 1.0)
    # heavier interests get more clicks: per user, the planted category with the largest
    # weight is the most clicked one about twice as often as chance (1 / 4)
    top = truth.user_interests[np.arange(3000), truth.user_weights.argmax(axis=1)]
    per_user = pd.crosstab(users, category).to_numpy()
    assert np.mean(per_user.argmax(axis=1) == top) > 0.4


def test_no_switching_means_one_category_per_user():
    cfg = SyntheticConfig(num_users=500, num_items=400, num_categories=20, switch_prob=0.0, noise=0.0)
    df = generate(cfg)
    per_user = df.groupby(codes(df, "user"))["category"].nunique()
    assert (per_user == 1).all()


def test_switching_always_changes_the_interest():
    cfg = SyntheticConfig(
        num_users=500, num_items=400, num_categories=20, interests_per_user=3, switch_prob=1.0, noise=0.0
    )
    df = generate(cfg)
    users, category = codes(df, "user"), codes(df, "category")
    same_user = users[1:] == users[:-1]
    assert np.all(category[1:][same_user] != category[:-1][same_user])


def test_popularity_is_skewed_inside_categories():
    cfg = SyntheticConfig(num_users=2000, num_items=1000, num_categories=10, noise=0.0)
    df, truth = generate(cfg, return_truth=True)
    clicks = np.bincount(codes(df, "item"), minlength=1000)
    for c in range(3):
        in_cat = np.sort(clicks[truth.item_category == c])[::-1]
        assert in_cat[0] > 20 * max(1, in_cat[-1])  # Zipf(1) over 100 items: ~100x


def test_times_increase_within_users():
    df = generate(SyntheticConfig(num_users=200, num_items=100, num_categories=5))
    users, time = codes(df, "user"), df["time"].to_numpy()
    assert np.all(np.diff(users) >= 0)
    same = users[1:] == users[:-1]
    assert np.all(np.diff(time)[same] >= 0)
    assert df.attrs["time_is_position"] is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"interests_per_user": 11}, "interests_per_user"),
        ({"num_items": 5}, "num_items"),
        ({"switch_prob": 1.5}, "switch_prob"),
    ],
)
def test_invalid_settings(change, message):
    with pytest.raises(ValueError, match=message):
        generate(SyntheticConfig(**{"num_users": 10, "num_items": 100, "num_categories": 10, **change}))
