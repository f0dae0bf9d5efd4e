"""Metrics: hand-computed cases, sklearn's ndcg_score, and a per-user Python reference."""

import math

import numpy as np
import pytest
from sklearn.metrics import ndcg_score

from recsys.evaluate.metrics import (
    category_diversity,
    compute_metrics,
    coverage,
    hit_rate,
    ndcg,
    rank_hits,
    recall,
)

# user 0: truth [7, 4, 7] (7 clicked twice), recommended [3, 1, 7, 2]
# user 1: truth [10], recommended [5, 6, 8, 9]: no hit
TOPN = np.array([[3, 1, 7, 2], [5, 6, 8, 9]])
INDPTR = np.array([0, 3, 4])
ITEMS = np.array([7, 4, 7, 10])


def test_recall_and_hitrate_hand_case():
    hits = rank_hits(TOPN, INDPTR, ITEMS)
    # ComiRec loops over the truth list: both clicks on 7 count, over 3 clicks.
    np.testing.assert_allclose(recall(hits, 4), [2 / 3, 0.0])
    np.testing.assert_allclose(hit_rate(hits, 4), [1.0, 0.0])
    np.testing.assert_allclose(recall(hits, 2), [0.0, 0.0])  # 7 is at rank 2 (0-based)
    np.testing.assert_allclose(recall(hits, 3), [2 / 3, 0.0])


def test_standard_ndcg_hand_case():
    hits = rank_hits(TOPN, INDPTR, ITEMS)
    # One relevant item (7) at rank 2; 2 distinct truth items -> IDCG = 1 + 1/log2(3).
    expected = (1 / math.log2(4)) / (1 + 1 / math.log2(3))
    np.testing.assert_allclose(ndcg(hits, 4), [expected, 0.0])
    np.testing.assert_allclose(ndcg(hits, 2), [0.0, 0.0])


def test_comirec_ndcg_hand_case():
    hits = rank_hits(TOPN, INDPTR, ITEMS)
    # Hits at truth positions 0 and 2: DCG = 1/log2(2) + 1/log2(4); IDCG over 2 hits.
    expected = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    np.testing.assert_allclose(ndcg(hits, 4, comirec=True), [expected, 0.0])
    # A single hit at the first truth position scores 1.0 whatever the truth size.
    one = rank_hits(np.array([[9, 8]]), np.array([0, 4]), np.array([9, 1, 2, 3]))
    np.testing.assert_allclose(ndcg(one, 2, comirec=True), [1.0])
    assert ndcg(one, 2)[0] == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_repeated_and_empty_recommendation_slots():
    # A repeated id counts once (first rank); -1 slots are empty.
    hits = rank_hits(np.array([[-1, 4, 4, 6]]), np.array([0, 2]), np.array([4, 6]))
    assert hits.truth_rank.tolist() == [1, 3]
    expected = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    np.testing.assert_allclose(ndcg(hits, 4), [expected])
    np.testing.assert_allclose(recall(hits, 4), [1.0])


def test_ndcg_matches_sklearn_on_dense_cases():
    rng = np.random.default_rng(0)
    num_users, num_items = 30, 25
    y_score = rng.random((num_users, num_items))
    y_true = (rng.random((num_users, num_items)) < 0.2).astype(float)
    y_true[np.arange(num_users), rng.integers(0, num_items, num_users)] = 1.0  # >= 1 relevant
    ids = np.argsort(-y_score, axis=1) + 1  # column j is item j + 1
    truth = [rng.permutation(np.flatnonzero(row) + 1) for row in y_true]
    indptr = np.concatenate([[0], np.cumsum([len(t) for t in truth])])
    hits = rank_hits(ids, indptr, np.concatenate(truth))
    for n in (1, 5, 10, 25):
        np.testing.assert_allclose(ndcg(hits, n).mean(), ndcg_score(y_true, y_score, k=n), rtol=1e-12)


def test_diversity_and_coverage_hand_cases():
    cats = np.array([0, 1, 1, 2, 3, 3])  # item id -> category
    topn = np.array([[1, 2, 3, 4], [4, 5, -1, -1], [5, -1, -1, -1]])
    div = category_diversity(topn, cats)
    # Row 0: 6 pairs, one (1, 2) in the same category. Row 1: 1 pair, same category.
    np.testing.assert_allclose(div[:2], [5 / 6, 0.0])
    assert np.isnan(div[2])  # fewer than two items
    assert coverage(topn, num_items=6) == pytest.approx(5 / 5)
    assert coverage(np.array([[1, 2], [2, 3]]), num_items=11) == pytest.approx(3 / 10)


def _python_reference(topn, truth_lists, n, cats):
    """ComiRec's evaluate_full loop per user, with sets (standard NDCG by rank and MRR added)."""
    rec, nd_std, nd_comi, hr, div, rr = [], [], [], [], [], []
    for row, truth in zip(topn, truth_lists):
        ranked, slots = [], []  # distinct valid items, and the slot (rank) of each
        for r, i in enumerate(row[:n]):
            if i > 0 and i not in ranked:
                ranked.append(i)
                slots.append(r)
        rec_set = set(ranked)
        count, dcg = 0, 0.0
        for no, iid in enumerate(truth):
            if iid in rec_set:
                count += 1
                dcg += 1 / math.log2(no + 2)
        idcg = sum(1 / math.log2(no + 2) for no in range(count))
        rec.append(count / len(truth))
        hr.append(float(count > 0))
        nd_comi.append(dcg / idcg if count else 0.0)
        truth_set = set(truth)
        std = sum(1 / math.log2(r + 2) for r, i in zip(slots, ranked) if i in truth_set)
        nd_std.append(std / sum(1 / math.log2(r + 2) for r in range(min(len(truth_set), n))))
        rr.append(next((1 / (r + 1) for r, i in zip(slots, ranked) if i in truth_set), 0.0))
        m = len(ranked)
        if m >= 2:
            diff = sum(cats[ranked[a]] != cats[ranked[b]] for a in range(m) for b in range(a + 1, m))
            div.append(diff / (m * (m - 1) / 2))
    return np.mean(rec), np.mean(nd_std), np.mean(nd_comi), np.mean(hr), np.mean(div), np.mean(rr)


def test_compute_metrics_equals_python_loop_on_random_data():
    rng = np.random.default_rng(1)
    num_users, num_items, n_max = 200, 60, 12
    topn = np.stack([rng.choice(np.arange(1, num_items), n_max, replace=False) for _ in range(num_users)])
    topn[rng.random(topn.shape) < 0.05] = -1
    truth_lists = [rng.integers(1, num_items, size=rng.integers(1, 15)) for _ in range(num_users)]
    indptr = np.concatenate([[0], np.cumsum([len(t) for t in truth_lists])])
    items = np.concatenate(truth_lists)
    cats = rng.integers(0, 5, size=num_items)
    for comirec in (False, True):
        got = compute_metrics(
            topn, indptr, items, topn=(5, 12), comirec_ndcg=comirec, item_category=cats, num_items=num_items
        )
        assert got["users"] == num_users
        for n in (5, 12):
            rec, nd_std, nd_comi, hr, div, rr = _python_reference(topn, truth_lists, n, cats)
            assert got[f"recall@{n}"] == pytest.approx(rec)
            assert got[f"ndcg@{n}"] == pytest.approx(nd_comi if comirec else nd_std)
            assert got[f"hitrate@{n}"] == pytest.approx(hr)
            assert got[f"mrr@{n}"] == pytest.approx(rr)
            assert got[f"diversity@{n}"] == pytest.approx(div)
            top = topn[:, :n]
            assert got[f"coverage@{n}"] == pytest.approx(len(set(top[top > 0].tolist())) / (num_items - 1))
    unlabelled = compute_metrics(topn, indptr, items, topn=(5,), item_category=np.zeros(num_items, dtype=np.int64))
    assert "diversity@5" not in unlabelled  # no item has a category: nothing to measure


def test_one_target_metrics_equal_a_loop_over_random_scores():
    """Leave-one-out: one truth click per user ranked among the whole catalogue by random scores
    (the evaluator's top-N by score, already-clicked items removed): HR@K = Recall@K, NDCG@K =
    1 / log2(rank + 2), MRR@K = 1 / (rank + 1), 0 outside the top K."""
    rng = np.random.default_rng(7)
    num_users, num_items, n_max = 300, 80, 50
    scores = rng.standard_normal((num_users, num_items))
    scores[:, 0] = -np.inf  # padding
    seen = [rng.choice(np.arange(1, num_items), rng.integers(0, 10), replace=False) for _ in range(num_users)]
    target = np.array([rng.choice(np.setdiff1d(np.arange(1, num_items), s)) for s in seen])
    for u, s in enumerate(seen):
        scores[u, s] = -np.inf
    topn = np.argsort(-scores, axis=1, kind="stable")[:, :n_max]
    got = compute_metrics(topn, np.arange(num_users + 1), target, topn=(10, 20, 50))
    for k in (10, 20, 50):
        hr, nd, rr = [], [], []
        for u in range(num_users):  # the target's rank: items scored above it (ties: smaller id first)
            better = sum(
                scores[u, i] > scores[u, target[u]] or (scores[u, i] == scores[u, target[u]] and i < target[u])
                for i in range(num_items)
            )
            hr.append(float(better < k))
            nd.append(1 / math.log2(better + 2) if better < k else 0.0)
            rr.append(1 / (better + 1) if better < k else 0.0)
        assert got[f"hitrate@{k}"] == pytest.approx(np.mean(hr)) == pytest.approx(got[f"recall@{k}"])
        assert got[f"ndcg@{k}"] == pytest.approx(np.mean(nd))
        assert got[f"mrr@{k}"] == pytest.approx(np.mean(rr))
    assert 0 < got["hitrate@10"] < got["hitrate@50"] < 1  # neither trivially all-hit nor all-miss


def test_bad_truth_is_reported():
    with pytest.raises(ValueError, match="truth_indptr: user 1 has no truth items"):
        rank_hits(TOPN, np.array([0, 3, 3]), ITEMS[:3])
    with pytest.raises(ValueError, match="truth_indptr"):
        rank_hits(TOPN, np.array([0, 3]), ITEMS)
    with pytest.raises(ValueError, match="n: must be in 1..4"):
        recall(rank_hits(TOPN, INDPTR, ITEMS), 5)
