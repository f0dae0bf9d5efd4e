"""Multi-interest health metrics on a model whose attention, interests and items are set by hand."""

import math

import numpy as np
import pytest
import torch

from recsys.data.split import EvalSet
from recsys.evaluate.diagnostics import interest_health, majority_categories
from recsys.models.base import InterestModel


class _Fixed(InterestModel):
    """Interests and attention logits fixed per user (row ``b`` of the batch = user ``b``)."""

    def __init__(self, interests: torch.Tensor, scores: torch.Tensor, items: torch.Tensor):
        super().__init__()
        self.num_interests = interests.shape[1]
        self.register_buffer("fixed_interests", interests)
        self.register_buffer("fixed_scores", scores)
        self.register_buffer("items", items)

    def interests(self, seq, lengths):
        return self.fixed_interests[: len(seq)]

    def interests_with_attention(self, seq, lengths):
        return self.fixed_interests[: len(seq)], self.fixed_scores[: len(seq)]

    def item_embeddings(self):
        return self.items


def _eval_set(inputs, lengths, truth):
    indptr = np.concatenate([[0], np.cumsum([len(t) for t in truth])])
    return EvalSet(
        users=np.arange(len(inputs)),
        inputs=np.array(inputs),
        lengths=np.array(lengths),
        truth_indptr=indptr,
        truth_items=np.concatenate(truth).astype(np.int64),
    )


def test_health_metrics_match_hand_computation():
    # items 1..4 on the axes of R^2 (two categories: 1, 2 -> cat 1; 3, 4 -> cat 2)
    items = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    interests = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0]],  # user 0: one interest per category
            [[1.0, 0.0], [1.0, 0.0]],
        ]
    )  # user 1: both the same
    scores = torch.zeros(2, 3, 2)
    scores[0, :, 0] = torch.tensor([0.0, 0.0, 50.0])  # interest 0 of user 0: one click (padding ignored)
    scores[1, :, 1] = torch.tensor([0.0, math.log(3.0), 0.0])
    model = _Fixed(interests, scores, items)
    ev = _eval_set([[1, 3, 0], [2, 4, 1]], [2, 3], [[1, 3, 4], [2]])
    cats = np.array([0, 1, 1, 2, 2])
    health = interest_health(model, ev, item_category=cats, planted=[{1, 2}, {1, 2}], top_m=2)

    # effective clicks: user 0 -> interest 0 uniform over its 2 valid clicks (score 50 is padding), interest 1
    # uniform over 2; user 1 -> interest 0 uniform over 3, interest 1 weights (1, 3, 1)/5
    p = np.array([0.2, 0.6, 0.2])
    eff1 = math.exp(-(p * np.log(p)).sum())
    assert health["mi_eff_clicks_k0"] == pytest.approx((2 + 3) / 2)
    assert health["mi_eff_clicks_k1"] == pytest.approx((2 + eff1) / 2)
    assert health["mi_eff_clicks_min"] == pytest.approx(min(2.5, (2 + eff1) / 2))
    # readout: user 0's truth 1 -> k0, 3 -> k1, 4 -> k1; user 1's truth 2 -> tie -> k0
    assert health["mi_readout_share_k0"] == pytest.approx(2 / 4)
    assert health["mi_readout_share_min"] == pytest.approx(2 / 4)
    assert health["mi_cosine"] == pytest.approx((0.0 + 1.0) / 2)
    # user 0 recovers both categories, user 1 only category 1
    assert health["mi_planted_recovery"] == pytest.approx((1.0 + 0.5) / 2)
    assert health["mi_planted_in_input"] == pytest.approx(1.0)
    assert health["mi_planted_recovery_of_present"] == pytest.approx((1.0 + 0.5) / 2)


def test_planted_recovery_of_present_counts_only_categories_in_the_input():
    items = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # item 1: cat 1, item 2: cat 2
    model = _Fixed(torch.tensor([[[1.0, 0.0], [1.0, 0.0]]]), torch.zeros(1, 2, 2), items)
    ev = _eval_set([[1, 1]], [2], [[2]])  # only category 1 in the input; planted {1, 2}
    health = interest_health(model, ev, item_category=np.array([0, 1, 2]), planted=[{1, 2}], top_m=1)
    assert health["mi_planted_recovery"] == pytest.approx(0.5)
    assert health["mi_planted_in_input"] == pytest.approx(0.5)
    assert health["mi_planted_recovery_of_present"] == pytest.approx(1.0)


def test_majority_category_breaks_ties_towards_the_smallest_id():
    items = torch.tensor([[0.0], [3.0], [2.0], [1.0]])
    found = majority_categories(torch.tensor([[[1.0]]]), items, torch.tensor([0, 5, 2, 2]), top_m=2)
    assert found.tolist() == [[2]]  # top-2 items 1 (cat 5) and 2 (cat 2): a tie, so 2
    found = majority_categories(torch.tensor([[[1.0]]]), items, torch.tensor([0, 5, 2, 2]), top_m=3)
    assert found.tolist() == [[2]]


def test_models_without_attention_report_only_what_applies():
    items = torch.eye(3)
    model = _Fixed(torch.ones(1, 1, 3), torch.zeros(1, 2, 1), items)
    model.interests_with_attention = lambda seq, lengths: (model.fixed_interests, None)
    health = interest_health(model, _eval_set([[1, 2]], [2], [[1]]))
    assert health == {}  # K = 1: no share, no cosine; no attention: no effective clicks


def test_majority_categories_in_chunks_equal_one_pass(monkeypatch):
    import recsys.evaluate.diagnostics as diagnostics

    g = torch.Generator().manual_seed(0)
    interests, items = torch.randn(5, 3, 4, generator=g), torch.randn(50, 4, generator=g)
    cats = torch.randint(1, 6, (50,), generator=g)
    whole = majority_categories(interests, items, cats, top_m=7)
    monkeypatch.setattr(diagnostics, "_SCORE_BUDGET", 100)  # two queries per chunk
    assert torch.equal(majority_categories(interests, items, cats, top_m=7), whole)


def test_empty_eval_set_gives_no_metrics_and_bad_sizes_are_named():
    items = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    model = _Fixed(torch.eye(2)[None], torch.zeros(1, 2, 2), items)
    empty = EvalSet(
        users=np.zeros(0, dtype=np.int64),
        inputs=np.zeros((0, 2), dtype=np.int64),
        lengths=np.zeros(0, dtype=np.int64),
        truth_indptr=np.zeros(1, dtype=np.int64),
        truth_items=np.zeros(0, dtype=np.int64),
    )
    assert interest_health(model, empty) == {}
    ev = _eval_set([[1, 2]], [2], [[1]])
    with pytest.raises(ValueError, match="max_users, batch_size and served_n must be > 0, got 0, 512, 50"):
        interest_health(model, ev, max_users=0)


def _served_by_loop(interests, items, inputs, lengths, n, exclude_history):
    """Each interest's share of the served top ``n``, one user and one item at a time."""
    counts = np.zeros(interests.shape[1])
    for b in range(len(interests)):
        seen = set(inputs[b][: lengths[b]]) if exclude_history else set()
        scored = []
        for item in range(1, len(items)):
            if item not in seen:
                per_interest = [float(interests[b, k] @ items[item]) for k in range(interests.shape[1])]
                scored.append((max(per_interest), int(np.argmax(per_interest))))
        for _, k in sorted(scored, key=lambda x: -x[0])[:n]:
            counts[k] += 1
    return counts / counts.sum()


@pytest.mark.parametrize("exclude_history", [False, True])
def test_served_share_matches_a_loop(exclude_history):
    g = torch.Generator().manual_seed(3)
    users, k, num_items, d, n = 9, 3, 40, 5, 7
    items = torch.randn(num_items, d, generator=g)
    interests = torch.randn(users, k, d, generator=g)
    interests[:, 2] *= 0.5  # a weaker interest: a smaller share, so the shares differ
    inputs = torch.randint(1, num_items, (users, 6), generator=g).numpy()
    lengths = np.array([6, 1, 3, 6, 2, 5, 4, 6, 1])
    model = _Fixed(interests, torch.zeros(users, 6, k), items)
    ev = _eval_set(inputs.tolist(), lengths.tolist(), [[1]] * users)
    health = interest_health(model, ev, served_n=n, exclude_history=exclude_history)
    expected = _served_by_loop(interests.numpy(), items.numpy(), inputs, lengths, n, exclude_history)
    got = np.array([health[f"mi_served_share_k{i}"] for i in range(k)])
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert health["mi_served_share_min"] == pytest.approx(expected.min())
    assert 0 < expected.min() < 0.25  # the weaker interest serves less than a third
