"""experiments/new_items.py's pieces on hand-made data: the attribute-popularity baseline's orders,
its tie-break, and the truth restricted to held-out items."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from recsys.data import EvalSet

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
# items 1..6 over the attributes a, b, c, d (columns 0..3); row 0 is padding
ATTRIBUTES = {1: "a", 2: "ab", 3: "b", 4: "c", 5: "ac", 6: "d"}
POPULARITY = np.array([0, 10, 0, 5, 50, 1, 100])


@pytest.fixture
def new_items(monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # as when the script runs
    import new_items

    return new_items


def attributes() -> sp.csr_matrix:
    dense = np.zeros((7, 4))
    for item, letters in ATTRIBUTES.items():
        dense[item, ["abcd".index(x) for x in letters]] = 1
    return sp.csr_matrix(dense)


def history(*rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([[0], np.cumsum([len(r) for r in rows])]), np.array([i for r in rows for i in r])


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("shared", [2, 1, 3, 5, 6, 4]),  # 2 shares a and b; 1 (a), 3 (b), 5 (a) one each, by popularity
        ("any", [1, 3, 5, 2, 6, 4]),  # the items sharing an attribute by popularity, then the others
        ("weighted", [2, 1, 5, 3, 6, 4]),  # a is on two input clicks, b on one: 2 = 3, 1 = 5 = 2, 3 = 1
    ],
)
def test_the_baselines_orders(new_items, key, expected):
    top = new_items.attribute_popularity(attributes(), history([1, 1, 3]), POPULARITY, key, 6)
    assert top.tolist() == [expected]


def test_weighted_counts_the_input_clicks_carrying_an_attribute(new_items):
    top = new_items.attribute_popularity(attributes(), history([3, 3, 1]), POPULARITY, "weighted", 3)
    assert top.tolist() == [[2, 3, 1]]  # b on two clicks: 2 (a + b = 3), 3 (2), then 1 (1, more popular than 5)


def test_the_input_is_left_out_when_asked_and_users_rank_apart(new_items):
    top = new_items.attribute_popularity(
        attributes(), history([1, 1, 3], [6]), POPULARITY, "shared", 4, exclude_history=True
    )
    # user 2 shares d with 6 alone, its own click, left out: the rest by popularity
    assert top.tolist() == [[2, 5, 6, 4], [4, 1, 3, 5]]


def test_candidates_are_the_only_items_ranked(new_items):
    candidates = np.array([3, 4, 6])
    top = new_items.attribute_popularity(attributes(), history([1]), POPULARITY, "shared", 3, candidates=candidates)
    assert top.tolist() == [[6, 4, 3]]  # none shares a with the input: by popularity


def test_ties_are_broken_at_random_not_by_id(new_items):
    popularity = np.zeros(7)  # every item ties but on attributes
    firsts = {
        int(new_items.attribute_popularity(attributes(), history([4]), popularity, "shared", 1, seed=s)[0, 0])
        for s in range(20)
    }
    assert firsts == {4, 5}  # the two items sharing c, each first under some seed


def test_held_truth_keeps_the_held_out_targets_and_their_users(new_items):
    truth = [[1, 2], [3], [2, 4, 2]]
    ev = EvalSet(
        users=np.array([10, 11, 12]),
        inputs=np.array([[5, 0], [6, 0], [7, 8]]),
        lengths=np.array([1, 1, 2]),
        truth_indptr=np.array([0, 2, 3, 6]),
        truth_items=np.array([i for t in truth for i in t]),
    )
    sub = new_items.held_truth(ev, np.array([2, 9]))
    assert sub.users.tolist() == [10, 12] and sub.inputs.tolist() == [[5, 0], [7, 8]]
    assert sub.truth_indptr.tolist() == [0, 1, 3] and sub.truth_items.tolist() == [2, 2, 2]
