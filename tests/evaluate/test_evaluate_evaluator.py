"""The evaluator end to end on tiny models, and the MostPopular baseline."""

import numpy as np
import pytest
import torch

from recsys.config import ModelConfig, load_config
from recsys.data.split import EvalSet
from recsys.evaluate import (
    compute_metrics,
    evaluate,
    evaluate_with_config,
    format_table,
)
from recsys.models import build_model
from recsys.models.base import InterestModel
from recsys.retrieval import Retriever
from recsys.run.settings import resolve_model
from tests.conftest import resolved


class LastFirstModel(InterestModel):
    """K = 2 fixed interests: the embeddings of the last and of the first input click."""

    num_interests = 2

    def __init__(self, emb: np.ndarray) -> None:
        super().__init__()
        self.emb = torch.nn.Parameter(torch.from_numpy(emb))

    def interests(self, seq, lengths):
        last = seq.gather(1, (lengths - 1)[:, None])[:, 0]
        return torch.stack([self.emb[last], self.emb[seq[:, 0]]], dim=1)  # [B, 2, d]

    def item_embeddings(self):
        return self.emb


def _eval_set(rng, num_users=90, num_items=120, max_len=6):
    lengths = rng.integers(1, max_len + 1, size=num_users)
    inputs = np.zeros((num_users, max_len), dtype=np.int64)
    for u, length in enumerate(lengths):
        inputs[u, :length] = rng.integers(1, num_items, size=length)
    truth = [rng.integers(1, num_items, size=rng.integers(1, 8)) for _ in range(num_users)]
    indptr = np.concatenate([[0], np.cumsum([len(t) for t in truth])]).astype(np.int64)
    return EvalSet(np.arange(num_users), inputs, lengths.astype(np.int64), indptr, np.concatenate(truth))


def _brute_topn(emb, es, n, exclude=False):
    last = es.inputs[np.arange(len(es.lengths)), es.lengths - 1]
    scores = np.maximum(emb[last] @ emb.T, emb[es.inputs[:, 0]] @ emb.T).astype(np.float64)
    scores[:, 0] = -np.inf
    if exclude:
        for u, row in enumerate(es.inputs):
            scores[u, row[row > 0]] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :n]


@pytest.mark.parametrize("backend", ["faiss", "torch"])  # torch: the batches stay on the device
@pytest.mark.parametrize("exclude", [False, True])
def test_evaluate_equals_brute_force_metrics(exclude, backend):
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((120, 8)).astype(np.float32)
    es = _eval_set(rng)
    cats = rng.integers(1, 6, size=120)
    model = LastFirstModel(emb).train()
    got = evaluate(model, es, topn=(5, 20), exclude_history=exclude, item_category=cats, batch_size=32, backend=backend)
    ref = compute_metrics(
        _brute_topn(emb, es, 20, exclude),
        es.truth_indptr,
        es.truth_items,
        topn=(5, 20),
        item_category=cats,
        num_items=120,
    )
    assert set(got) == set(ref)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value), key
    assert got["hitrate@20"] > 0  # the case is not trivially all-miss
    assert model.training  # mode restored


def test_evaluate_is_batch_size_and_backend_independent():
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((120, 8)).astype(np.float32)
    es = _eval_set(rng)
    model = LastFirstModel(emb)
    a = evaluate(model, es, topn=(10,), batch_size=7, backend="torch", comirec_ndcg=True)
    b = evaluate(model, es, topn=(10,), batch_size=1000, backend="faiss", comirec_ndcg=True)
    assert a == pytest.approx(b)
    assert "diversity@10" not in a and a["coverage@10"] > 0


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_non_finite_interests_are_an_error(backend):
    rng = np.random.default_rng(4)
    emb = rng.standard_normal((120, 8)).astype(np.float32)
    es = _eval_set(rng)

    class NaNModel(LastFirstModel):
        def interests(self, seq, lengths):
            out = super().interests(seq, lengths).clone()
            out[-1, 0, 0] = float("nan")  # the last user of every batch
            return out

    model = NaNModel(emb)
    with pytest.raises(ValueError, match="interests: contains NaN or infinite"):
        evaluate(model, es, topn=(10,), batch_size=32, backend=backend)


def test_evaluate_with_diversity_lambda_raises_diversity():
    rng = np.random.default_rng(2)
    emb = rng.standard_normal((120, 8)).astype(np.float32)
    es = _eval_set(rng)
    cats = rng.integers(1, 4, size=120)
    model = LastFirstModel(emb)
    plain = evaluate(model, es, topn=(10,), item_category=cats)
    diverse = evaluate(model, es, topn=(10,), item_category=cats, diversity_lambda=5.0)
    assert diverse["diversity@10"] > plain["diversity@10"]
    with pytest.raises(ValueError, match="diversity_lambda"):
        evaluate(model, es, topn=(10,), diversity_lambda=1.0)


def test_evaluate_with_config_and_table():
    rng = np.random.default_rng(3)
    es = _eval_set(rng)
    model = LastFirstModel(rng.standard_normal((120, 8)).astype(np.float32))
    cfg = load_config(None, ["eval.topn=[3, 7]", "eval.comirec_ndcg=true", "retrieval.factory=HNSW16,Flat"])
    with pytest.raises(ValueError, match="evaluate_with_config: eval.objective, eval.exclude_history still automatic"):
        evaluate_with_config(model, es, cfg)
    cfg = resolved(cfg)
    got = evaluate_with_config(model, es, cfg)
    assert {"recall@3", "ndcg@7", "hitrate@7", "mrr@7", "coverage@3", "users"} <= set(got)
    table = format_table({"last-first": got, "other": {"recall@3": 0.5}})
    lines = table.splitlines()
    assert lines[0].split("|")[1:-1] == [
        " model      ",
        " Recall@3 ",
        " NDCG@3 ",
        " HitRate@3 ",
        "  MRR@3 ",
        " Recall@7 ",
        " NDCG@7 ",
        " HitRate@7 ",
        "  MRR@7 ",
    ]
    assert f"{got['recall@7']:.4f}" in lines[2] and lines[3].count(" - ") == 7


def test_popular_ranks_by_training_count():
    counts = np.array([0, 5, 50, 1, 20, 0])
    popular = resolve_model(ModelConfig(name="popular"), 6)
    model = build_model(popular, num_items=6, max_len=4, item_counts=torch.from_numpy(counts))
    assert not model.trainable and model.num_interests == 1
    seq = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]])
    interests = model.interests(seq, torch.tensor([2, 1]))
    assert interests.shape == (2, 1, 1)
    ids, _, _ = Retriever(model.item_embeddings()).search(interests, 5)
    np.testing.assert_array_equal(ids, [[2, 4, 1, 3, 5]] * 2)
    es = EvalSet(np.arange(2), seq.numpy(), np.array([2, 1]), np.array([0, 2, 3]), np.array([2, 3, 4]))
    got = evaluate(model, es, topn=(1, 2))
    assert got["recall@1"] == pytest.approx((1 / 2 + 0) / 2)
    assert got["recall@2"] == pytest.approx((1 / 2 + 1) / 2)
    with pytest.raises(ValueError, match="item_counts"):
        build_model(popular, num_items=6, max_len=4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("exclude", [False, True])
def test_evaluation_on_the_gpu_matches_and_never_syncs_per_batch(exclude, count_syncs):
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((120, 8)).astype(np.float32)
    es = _eval_set(rng)
    model = LastFirstModel(emb).cuda()
    ref = compute_metrics(
        _brute_topn(emb, es, 20, exclude), es.truth_indptr, es.truth_items, topn=(5, 20), num_items=120
    )
    got = evaluate(model, es, topn=(5, 20), exclude_history=exclude, batch_size=32)  # auto: torch on CUDA
    for key, value in ref.items():
        assert got[key] == pytest.approx(value), key
    one_batch = count_syncs(lambda: evaluate(model, es, topn=(5, 20), exclude_history=exclude, batch_size=1000))
    many = count_syncs(lambda: evaluate(model, es, topn=(5, 20), exclude_history=exclude, batch_size=7))
    assert many == one_batch > 0  # 13 batches sync the host as often as one (the ids come back once)
