"""Places kept for new items (``retrieval.new_item_share``): every path of the Retriever against a
brute-force list built from the whole score matrix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.config import RetrievalConfig
from recsys.retrieval.index import Retriever
from recsys.retrieval.new_items import reserved_places

NUM_ITEMS, DIM, K = 60, 8, 3


def _setup(seed: int, new_share: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(NUM_ITEMS, DIM, generator=gen)
    is_new = torch.rand(NUM_ITEMS, generator=gen) < new_share
    is_new[0] = False
    emb[is_new] *= 0.3  # new items score low: few earn a place by score
    interests = torch.randn(5, K, DIM, generator=gen)
    return emb, is_new, interests


def _expected(emb, is_new, interests, n: int, share: float, exclude: list[list[int]]) -> list[list[int]]:
    """Each row's list by brute force: its best new items (at least ⌊share·n⌋, or all that earned a
    place), then its best other items, all in score order."""
    best = (interests @ emb.T).max(dim=1).values  # [B, N]
    out = []
    for b in range(len(best)):
        order = [int(i) for i in torch.argsort(best[b], descending=True) if i > 0 and int(i) not in exclude[b]]
        plain = order[:n]
        new = [i for i in order if is_new[i]]
        taken = max(sum(bool(is_new[i]) for i in plain), min(int(share * n), len(new)))
        others = [i for i in order if not is_new[i]][: n - taken]
        out.append(sorted(new[:taken] + others, key=lambda i: -float(best[b, i])))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("share", [0.1, 0.25, 0.5])
@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_search_keeps_the_share_for_the_best_new_items(seed, share, backend):
    emb, is_new, interests = _setup(seed)
    exclude = [[1, 2, 3], [], [int(torch.nonzero(is_new)[0])], [5], []]  # one row excludes a new item
    dense = np.zeros((5, 3), dtype=np.int64)
    for b, row in enumerate(exclude):
        dense[b, : len(row)] = row
    retriever = Retriever(emb, RetrievalConfig(backend=backend, new_item_share=share), new_items=is_new)
    ids, scores, _ = retriever.search(interests, 20, dense)
    assert [list(r) for r in ids] == _expected(emb, is_new, interests, 20, share, exclude)
    assert (np.diff(scores, axis=1) <= 0).all()  # still in score order
    if backend == "torch":  # the device path gives the same lists
        on_device = retriever.top_items(interests, 20, torch.from_numpy(dense))
        assert on_device[0].tolist() == ids.tolist()


def test_rows_of_their_own_length_keep_their_own_share():
    emb, is_new, interests = _setup(3)
    retriever = Retriever(emb, RetrievalConfig(backend="torch", new_item_share=0.25), new_items=is_new)
    rows_n = torch.tensor([4, 8, 12, 20, 1])
    ids = retriever.top_items(interests, 20, None, rows_n)[0]
    for b, n in enumerate(rows_n.tolist()):
        expected = _expected(emb, is_new, interests[b : b + 1], n, 0.25, [[]])[0]
        assert ids[b, :n].tolist() == expected  # the first n places are that row's whole list
    assert reserved_places(0.25, rows_n).tolist() == [1, 2, 3, 5, 0]


def test_no_share_or_no_new_item_leaves_the_lists_alone():
    emb, is_new, interests = _setup(4)
    plain = Retriever(emb, RetrievalConfig(backend="torch")).search(interests, 10)[0]
    for settings, mask in [(0.0, is_new), (0.3, torch.zeros(NUM_ITEMS, dtype=torch.bool)), (-1.0, is_new)]:
        retriever = Retriever(emb, RetrievalConfig(backend="torch", new_item_share=settings), new_items=mask)
        assert (retriever.search(interests, 10)[0] == plain).all()


def test_a_saved_index_without_the_embeddings_cannot_keep_places():
    emb, is_new, _ = _setup(5)
    index = Retriever(emb, RetrievalConfig(backend="faiss")).index
    with pytest.raises(ValueError, match="item embeddings"):
        Retriever.from_index(index, RetrievalConfig(new_item_share=0.1), new_items=is_new)
    with pytest.raises(ValueError, match=r"new_items: expected \[60\]"):
        Retriever(emb, RetrievalConfig(new_item_share=0.1), new_items=is_new[:10])


def test_a_diversity_pick_keeps_its_order_and_the_new_items_follow_it():
    emb, is_new, interests = _setup(6)
    category = np.arange(NUM_ITEMS) % 4
    settings = RetrievalConfig(backend="torch", new_item_share=0.25)
    plain = Retriever(emb, RetrievalConfig(backend="torch"), item_category=category)
    picked = plain.search(interests, 20, diversity_lambda=0.5)[0]
    kept = Retriever(emb, settings, item_category=category, new_items=is_new).search(
        interests, 20, diversity_lambda=0.5
    )[0]
    for before, after in zip(picked, kept):
        listed = [i for i in after if i in set(before)]
        assert listed == [i for i in before if i in set(after)]  # the pick's order, what stays of it
        added = [i for i in after if i not in set(before)]
        assert all(is_new[i] for i in added) and list(after[len(after) - len(added) :]) == added  # after it
        assert sum(bool(is_new[i]) for i in after) >= 5
