"""max_merge / diverse_merge against plain-Python references."""

import numpy as np
import pytest

from recsys.retrieval.aggregate import diverse_merge, max_merge


def _random_candidates(rng, bsz=40, k=4, per=12, pool=30):
    """Heavy overlap across interests: ids from a small pool, some invalid slots."""
    ids = rng.integers(0, pool, size=(bsz, k * per))
    ids[rng.random(ids.shape) < 0.05] = -1
    scores = rng.standard_normal(ids.shape).astype(np.float32)
    interest_of = np.broadcast_to(np.repeat(np.arange(k), per), ids.shape).copy()
    return ids, scores, interest_of


def _max_merge_ref(ids, scores, interest_of, n):
    out_ids, out_scores, out_int = [], [], []
    for row_ids, row_scores, row_int in zip(ids, scores, interest_of):
        best = {}
        for i, s, k in zip(row_ids, row_scores, row_int):
            if i > 0 and (i not in best or s > best[i][0]):
                best[i] = (s, k)
        top = sorted(best.items(), key=lambda kv: -kv[1][0])[:n]
        top += [(-1, (-np.inf, -1))] * (n - len(top))
        out_ids.append([i for i, _ in top])
        out_scores.append([s for _, (s, _) in top])
        out_int.append([k for _, (_, k) in top])
    return np.array(out_ids), np.array(out_scores, dtype=np.float32), np.array(out_int)


def _diverse_ref(ids, scores, interest_of, cats, n, lam):
    """ComiRec's per-user greedy loop (evaluate_full with coef), written plainly."""
    ref_ids, _, _ = _max_merge_ref(ids, scores, interest_of, ids.shape[1])
    out = []
    for row_ids, row in zip(ref_ids, _max_merge_ref(ids, scores, interest_of, ids.shape[1])[1]):
        cand = [(i, s) for i, s in zip(row_ids, row) if i > 0]
        picked, count = [], {}
        for _ in range(min(n, len(cand))):
            gains = [s - lam * count.get(cats[i], 0) for i, s in cand]
            j = int(np.argmax(gains))
            picked.append(cand[j][0])
            count[cats[cand[j][0]]] = count.get(cats[cand[j][0]], 0) + 1
            cand.pop(j)
        out.append(picked + [-1] * (n - len(picked)))
    return np.array(out)


@pytest.mark.parametrize("n", [1, 10, 25])
def test_max_merge_matches_reference(n):
    rng = np.random.default_rng(n)
    ids, scores, interest_of = _random_candidates(rng)
    got = max_merge(ids, scores, interest_of, n)
    ref = _max_merge_ref(ids, scores, interest_of, n)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[2], ref[2])


def test_max_merge_dedups_and_pads():
    ids = np.array([[5, 3, 5, 0, -1, 3]])
    scores = np.array([[0.1, 0.9, 0.7, 5.0, 4.0, 0.2]], dtype=np.float32)
    interest_of = np.array([[0, 0, 1, 1, 2, 2]])
    got_ids, got_scores, got_int = max_merge(ids, scores, interest_of, 4)
    np.testing.assert_array_equal(got_ids, [[3, 5, -1, -1]])
    np.testing.assert_array_equal(got_scores, np.array([[0.9, 0.7, -np.inf, -np.inf]], dtype=np.float32))
    np.testing.assert_array_equal(got_int, [[0, 1, -1, -1]])


def test_max_merge_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="interest_of"):
        max_merge(np.zeros((2, 3), dtype=np.int64), np.zeros((2, 3)), np.zeros((2, 4)), 2)


def test_diverse_merge_lambda_zero_is_max_merge():
    rng = np.random.default_rng(1)
    ids, scores, interest_of = _random_candidates(rng)
    cats = rng.integers(0, 4, size=30)
    diverse = diverse_merge(ids, scores, interest_of, cats, 15, 0.0)
    for got, ref in zip(diverse, max_merge(ids, scores, interest_of, 15)):
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("lam", [0.3, 1.0])
def test_diverse_merge_matches_greedy_reference(lam):
    rng = np.random.default_rng(2)
    ids, scores, interest_of = _random_candidates(rng)
    cats = rng.integers(0, 4, size=30)
    got_ids, got_scores, _ = diverse_merge(ids, scores, interest_of, cats, 12, lam)
    np.testing.assert_array_equal(got_ids, _diverse_ref(ids, scores, interest_of, cats, 12, lam))
    assert (got_scores[got_ids > 0] > -np.inf).all()


def test_diverse_merge_large_lambda_raises_diversity():
    from recsys.evaluate.metrics import category_diversity

    rng = np.random.default_rng(3)
    ids, scores, interest_of = _random_candidates(rng, pool=200, per=20)
    cats = rng.integers(0, 5, size=200)
    cats[:100] = 0  # half the catalogue in one category
    base = max_merge(ids, scores, interest_of, 10)[0]
    diverse = diverse_merge(ids, scores, interest_of, cats, 10, 10.0)[0]
    assert np.nanmean(category_diversity(diverse, cats)) > np.nanmean(category_diversity(base, cats)) + 0.05
    # Same candidate set, so every picked item is still a valid, distinct candidate.
    for row, cand in zip(diverse, ids):
        valid = row[row > 0]
        assert len(set(valid)) == len(valid) and set(valid) <= set(cand[cand > 0])


def test_diverse_merge_runs_out_of_candidates():
    ids = np.array([[4, 4, 7]])
    scores = np.array([[1.0, 0.5, 0.2]], dtype=np.float32)
    got_ids, got_scores, got_int = diverse_merge(ids, scores, np.zeros_like(ids), np.arange(8), 4, 2.0)
    np.testing.assert_array_equal(got_ids, [[4, 7, -1, -1]])
    assert np.isneginf(got_scores[0, 2:]).all() and (got_int[0, 2:] == -1).all()


@pytest.mark.parametrize("lam", [1e6, 1e3, 1.0])
def test_diverse_merge_never_returns_fewer_than_n_when_n_exist(lam):
    """Was: λ = 1e308 overflowed the greedy's penalties to inf and gave 2 items for n = 10
    (1e306, n = 1000: 180 items)."""
    rng = np.random.default_rng(3)
    ids, scores, interest_of = _random_candidates(rng, bsz=20, k=4, per=60, pool=10_000)
    scores *= 3e38  # float32 extremes, as a degenerate model may produce
    n = 100
    out_ids, _, _ = diverse_merge(ids, scores, interest_of, rng.integers(0, 3, 10_000), n, lam)
    distinct = [len(set(row[row > 0])) for row in ids]
    for row, have in zip(out_ids, distinct):
        assert (row > 0).sum() == min(n, have) and len(set(row[row > 0])) == (row > 0).sum()


@pytest.mark.parametrize("lam", [1e308, float("inf"), float("nan"), -1.0, 1e6 * 1.5])
def test_diverse_merge_refuses_lambda_outside_the_finite_range(lam):
    ids, scores, interest_of = _random_candidates(np.random.default_rng(0))
    with pytest.raises(ValueError, match="diversity lambda"):
        diverse_merge(ids, scores, interest_of, np.zeros(40, dtype=np.int64), 5, lam)


def test_check_lambda_takes_numpy_scalars_and_refuses_bools():
    from recsys.retrieval.aggregate import check_lambda

    assert check_lambda(np.float32(0.5)) == 0.5 and check_lambda(np.int64(2)) == 2.0
    for bad in (True, float("nan"), -1.0, 2e6, "0.1"):
        with pytest.raises(ValueError, match="diversity_lambda: must be a number"):
            check_lambda(bad)
