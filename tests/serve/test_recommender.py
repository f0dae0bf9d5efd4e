"""Recommender: a row's answer does not depend on its batch; fallbacks; input handling."""

import numpy as np
import pytest

from recsys.serve.recommender import Recommender, unique_csr


@pytest.fixture(scope="module")
def rec(tiny_run):
    return Recommender.from_run(tiny_run, factory="Flat", log=lambda line: None)


def test_unique_csr():
    indptr, items = unique_csr(np.array([0, 4, 4, 7]), np.array([5, 3, 5, 0, 2, 2, 9]), 10)
    np.testing.assert_array_equal(indptr, [0, 2, 2, 4])
    np.testing.assert_array_equal(items, [3, 5, 2, 9])


def test_rows_answer_as_if_alone(rec):
    """Mixed n, λ and exclusions in one batch give each row its single-row answer."""
    users = np.arange(6)
    inputs, lengths = rec.user_inputs(users)
    histories = rec.user_histories(users)
    n = np.array([5, 20, 1, 12, 20, 7])
    lam = np.array([0.0, 0.0, 0.5, 2.0, 0.05, 0.0])
    batch = rec.recommend(inputs, lengths, n, exclude=histories, diversity_lambda=lam)
    assert batch.ids.shape == (6, 20)
    for b in range(6):
        one = rec.recommend(
            inputs[b : b + 1],
            lengths[b : b + 1],
            int(n[b]),
            exclude=rec.user_histories(users[b : b + 1]),
            diversity_lambda=float(lam[b]),
        )
        np.testing.assert_array_equal(batch.ids[b, : n[b]], one.ids[0])
        np.testing.assert_allclose(batch.scores[b, : n[b]], one.scores[0], rtol=1e-5)
        np.testing.assert_array_equal(batch.interest_of[b, : n[b]], one.interest_of[0])
        assert (batch.ids[b, n[b] :] == -1).all()
        seen = rec.dataset.items[rec.dataset.indptr[b] : rec.dataset.indptr[b + 1]]
        assert not set(batch.ids[b, : n[b]]) & set(seen)
    # λ > 0 spreads the picks over more categories than the plain max-score merge.
    plain = rec.recommend(inputs, lengths, 20)
    diverse = rec.recommend(inputs, lengths, 20, diversity_lambda=5.0)
    cats = rec.dataset.item_category
    spread = lambda ids: np.mean([len(set(cats[row[row > 0]])) for row in ids])  # noqa: E731
    assert spread(diverse.ids) > spread(plain.ids)


def test_user_inputs_are_last_clicks(rec):
    ds = rec.dataset
    long_user = int(np.argmax(ds.lengths))
    inputs, lengths = rec.user_inputs(np.array([long_user]))
    clicks = ds.items[ds.indptr[long_user] : ds.indptr[long_user + 1]]
    assert lengths[0] == min(len(clicks), rec.max_len)
    np.testing.assert_array_equal(inputs[0, : lengths[0]], clicks[-lengths[0] :])
    seq_inputs, seq_lengths = rec.sequence_inputs([clicks])
    np.testing.assert_array_equal(seq_inputs, inputs)
    np.testing.assert_array_equal(seq_lengths, lengths)


def test_encode_and_popular(rec):
    raw = [rec.dataset.item_raw[3], "nope", rec.dataset.item_raw[1]]
    ids, unknown = rec.dataset.item_map.encode(raw)
    np.testing.assert_array_equal(ids, [3, 1])
    assert unknown == ["nope"]
    users, unknown = rec.dataset.user_map.encode([rec.dataset.user_raw[2], "ghost"])
    np.testing.assert_array_equal(users, [2])
    assert unknown == ["ghost"]
    top = rec.popular(5)
    counts = rec.dataset.item_counts
    assert (np.diff(counts[top.ids[0]]) <= 0).all() and counts[top.ids[0][0]] == counts[1:].max()
    np.testing.assert_array_equal(top.scores[0], counts[top.ids[0]].astype(np.float32))
    assert (top.interest_of == -1).all()
    skipped = rec.popular(5, exclude=(np.array([0, 2]), top.ids[0][:2]))
    np.testing.assert_array_equal(skipped.ids[0][:3], top.ids[0][2:])


def test_recommend_rejects_bad_input(rec):
    inputs, lengths = rec.user_inputs(np.arange(2))
    with pytest.raises(ValueError, match="at least one known item"):
        rec.recommend(inputs, np.array([3, 0]), 5)
    with pytest.raises(ValueError, match="n: must be >= 1"):
        rec.recommend(inputs, lengths, 0)
    with pytest.raises(ValueError, match="diversity_lambda"):
        rec.recommend(inputs, lengths, 5, diversity_lambda=-1.0)
    with pytest.raises(ValueError, match="inputs"):
        rec.recommend(inputs[:1], lengths, 5)
