"""Validation's fixed sample of the validation users (eval.valid_users)."""

import numpy as np

from recsys.data.batches import gather_rows
from recsys.data.split import EvalSet


def _eval_set(num_users: int = 40) -> EvalSet:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 5, num_users)
    indptr = np.concatenate([[0], np.cumsum(sizes)])
    items = rng.integers(1, 100, indptr[-1])
    inputs = rng.integers(0, 100, (num_users, 6))
    truth_indptr, truth_items = gather_rows(items, indptr[:-1], indptr[1:])
    return EvalSet(np.arange(num_users) * 3, inputs, rng.integers(1, 7, num_users), truth_indptr, truth_items)


def test_a_sample_keeps_each_chosen_user_s_input_and_truth_together():
    full = _eval_set()
    part = full.sample(10, seed=5)
    assert len(part) == 10 and np.all(np.diff(part.users) > 0)  # in their order
    rows = part.users // 3
    np.testing.assert_array_equal(part.inputs, full.inputs[rows])
    np.testing.assert_array_equal(part.lengths, full.lengths[rows])
    for i, row in enumerate(rows):
        mine = part.truth_items[part.truth_indptr[i] : part.truth_indptr[i + 1]]
        np.testing.assert_array_equal(mine, full.truth_items[full.truth_indptr[row] : full.truth_indptr[row + 1]])
    np.testing.assert_array_equal(
        part.history(0, 10)[1], full.history(0, 40)[1][np.isin(np.repeat(np.arange(40), full.lengths), rows)]
    )
    np.testing.assert_array_equal(full.sample(10, seed=5).users, part.users)  # fixed by the seed
    assert not np.array_equal(full.sample(10, seed=6).users, part.users)


def test_zero_or_more_than_there_are_keeps_every_user():
    full = _eval_set()
    assert full.sample(0, seed=1) is full and full.sample(40, seed=1) is full and full.sample(99, seed=1) is full
