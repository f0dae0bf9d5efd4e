"""Position embeddings, masks and the last-click gather."""

from __future__ import annotations

import pytest
import torch

from recsys.nn.masking import check_batch, gather_last, length_mask, recency_index
from recsys.nn.positions import PositionEmbedding


def test_length_mask_and_gather_last():
    lengths = torch.tensor([0, 1, 3])
    assert length_mask(lengths, 3).tolist() == [[False] * 3, [True, False, False], [True] * 3]
    x = torch.arange(18.0).view(3, 3, 2).requires_grad_()
    last = gather_last(x, lengths)
    assert last.tolist() == [[0.0, 0.0], [6.0, 7.0], [16.0, 17.0]]
    last.sum().backward()
    assert x.grad[0].abs().max() == 0 and x.grad[2, 2].tolist() == [1.0, 1.0]


def test_check_batch_names_the_argument():
    with pytest.raises(ValueError, match="seq"):
        check_batch(torch.zeros(2, 3), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="lengths"):
        check_batch(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1]))
    with pytest.raises(ValueError, match="lengths"):
        check_batch(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1.0, 2.0]))


def test_recency_index_counts_back_from_the_latest_click():
    idx = recency_index(torch.tensor([3, 0, 5]), 5)
    # padding rows: their place in the left-padded window (3 clicks: rows [pad, pad, c0, c1, c2] count back 4..0)
    assert idx.tolist() == [[2, 1, 0, 4, 3], [4, 3, 2, 1, 0], [4, 3, 2, 1, 0]]
    assert (idx.sort(dim=1).values == torch.arange(5)).all()  # each row a permutation


def test_position_embedding_modes():
    lengths = torch.tensor([3, 1])
    recent = PositionEmbedding(6, 4, "recent")
    out = recent(lengths, 4)  # [B, L, d]
    assert out.shape == (2, 4, 4)
    torch.testing.assert_close(out[0, :3], recent.weight[[2, 1, 0]])  # the latest click gets P[0]
    torch.testing.assert_close(out[1, 0], recent.weight[0])
    absolute = PositionEmbedding(6, 4, "absolute")
    torch.testing.assert_close(absolute(lengths, 4), absolute.weight[None, :4])
    with pytest.raises(ValueError, match="exceeds max_len"):
        recent(lengths, 7)
    with pytest.raises(ValueError, match="model.positions"):
        PositionEmbedding(6, 4, "relative")
