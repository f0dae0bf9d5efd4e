"""pad_sequences / gather_rows against plain loops; TrainSampler's samples against the data."""

from __future__ import annotations

import numpy as np
import pytest

from recsys.data.batches import TrainSampler, WindowSampler, following_clicks, gather_rows, pad_sequences


def random_csr(num_rows: int, max_len: int, seed: int = 0, unique: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 0..max_len clicks; with ``unique`` every click is a different item."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len + 1, size=num_rows)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = np.arange(1, indptr[-1] + 1) if unique else rng.integers(1, 50, size=indptr[-1])
    return indptr, items


@pytest.mark.parametrize("max_len", [1, 4, 30])
def test_pad_sequences_matches_a_loop(max_len):
    indptr, items = random_csr(60, 12)
    rng = np.random.default_rng(1)
    users = rng.integers(0, 60, size=40)
    ends = indptr[users] + rng.integers(0, 1000, size=40) % (np.diff(indptr)[users] + 1)
    for use_ends in (False, True):
        got, lengths = pad_sequences(indptr, items, users, max_len, ends=ends if use_ends else None)
        assert got.shape == (40, max_len) and got.dtype == np.int64
        for b, u in enumerate(users):
            stop = ends[b] if use_ends else indptr[u + 1]
            window = items[indptr[u] : stop][-max_len:]
            assert lengths[b] == len(window)
            assert got[b].tolist() == window.tolist() + [0] * (max_len - len(window))


def test_pad_sequences_rejects_ends_outside_the_row():
    indptr, items = np.array([0, 2, 5]), np.arange(1, 6)
    with pytest.raises(ValueError, match="ends must lie within"):
        pad_sequences(indptr, items, np.array([0]), 3, ends=np.array([3]))


def test_gather_rows_matches_a_loop():
    indptr, items = random_csr(30, 10)
    starts = indptr[:-1] + np.diff(indptr) // 3
    ends = indptr[1:] - np.diff(indptr) // 4
    out_indptr, out_items = gather_rows(items, starts, ends)
    for r in range(30):
        assert out_items[out_indptr[r] : out_indptr[r + 1]].tolist() == items[starts[r] : ends[r]].tolist()


def test_targets_follow_their_history_in_the_real_sequence():
    # every click is a distinct item, so a target pins down its user and position
    indptr, items = random_csr(200, 40, unique=True)
    owner = np.repeat(np.arange(200), np.diff(indptr))
    sampler = TrainSampler(indptr, items, max_len=8, seed=0)
    seq, lengths, targets = sampler.sample(5000)
    assert seq.shape == (5000, 8) and lengths.shape == targets.shape == (5000,)
    pos = targets - 1  # position of the target in `items`
    u = owner[pos]
    t = pos - indptr[u]
    assert np.all(t >= 1)
    assert np.all(lengths == np.minimum(t, 8))
    for b in range(0, 5000, 7):
        history = items[indptr[u[b]] : pos[b]][-8:]
        assert seq[b, : lengths[b]].tolist() == history.tolist()
        assert not seq[b, lengths[b] :].any()


def test_sampler_covers_users_and_positions_uniformly():
    indptr = np.array([0, 1, 3, 7])  # user 0 has 1 click: never drawn
    items = np.arange(1, 8)
    sampler = TrainSampler(indptr, items, max_len=5, seed=4)
    assert sampler.num_users == 2
    _, _, targets = sampler.sample(20000)
    counts = np.bincount(targets, minlength=8)
    assert counts[1] == 0 and counts[2] == 0 and counts[4] == 0  # no first clicks, no user 0
    assert counts[3] == pytest.approx(10000, rel=0.05)  # user 1: one possible target
    assert counts[5:8] == pytest.approx([3333] * 3, rel=0.08)  # user 2: three


@pytest.mark.parametrize("min_target", [1, 2])
def test_drawing_by_targets_makes_every_target_equally_likely(min_target):
    indptr = np.array([0, 1, 3, 7])  # user 0: 1 click, never drawn; user 1: 2 clicks; user 2: 4 clicks
    items = np.arange(1, 8)
    sampler = TrainSampler(indptr, items, max_len=5, seed=4, min_target=min_target, by_targets=True)
    seq, lengths, targets = sampler.sample(30000)
    possible = [3, 5, 6, 7] if min_target == 1 else [6, 7]  # each user's clicks at positions >= min_target
    counts = np.bincount(targets, minlength=8)
    assert counts[possible] == pytest.approx([30000 / len(possible)] * len(possible), rel=0.06)
    assert counts.sum() == counts[possible].sum()
    np.testing.assert_array_equal(seq[np.arange(len(seq)), lengths - 1], targets - 1)  # the click before it


def test_sampler_is_deterministic_and_respects_the_user_subset():
    indptr, items = random_csr(50, 10, unique=True)
    a = TrainSampler(indptr, items, 6, seed=11).sample(64)
    b = TrainSampler(indptr, items, 6, seed=11).sample(64)
    c = TrainSampler(indptr, items, 6, seed=12).sample(64)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[2], c[2])
    resumed = TrainSampler(indptr, items, 6, seed=0)
    resumed.set_state(TrainSampler(indptr, items, 6, seed=11).get_state())
    np.testing.assert_array_equal(resumed.sample(64)[2], a[2])
    subset = np.flatnonzero(np.diff(indptr) >= 2)[:3]
    _, _, targets = TrainSampler(indptr, items, 6, seed=0, users=subset).sample(500)
    owner = np.repeat(np.arange(50), np.diff(indptr))
    assert set(owner[targets - 1]) == set(subset)


def test_min_target_moves_the_earliest_target():
    indptr, items = np.array([0, 4, 10]), np.arange(1, 11)  # user 0: 4 clicks, user 1: 6
    sampler = TrainSampler(indptr, items, max_len=3, seed=0, min_target=4)
    assert sampler.num_users == 1
    _, lengths, targets = sampler.sample(2000)
    assert set(targets.tolist()) == {9, 10}  # positions 4 and 5 of user 1
    assert np.all(lengths == 3)


def test_sampler_needs_a_sequence_with_two_clicks():
    with pytest.raises(ValueError, match="more than 1 clicks"):
        TrainSampler(np.array([0, 1, 2]), np.array([1, 2]), max_len=4, seed=0)


def test_a_horizon_adds_the_following_clicks_to_the_same_draw():
    indptr, items = random_csr(60, 12, unique=True)
    one = TrainSampler(indptr, items, 6, seed=3).sample(400)
    seq, lengths, targets = TrainSampler(indptr, items, 6, seed=3, predict_next=4).sample(400)
    np.testing.assert_array_equal(seq, one[0])
    np.testing.assert_array_equal(lengths, one[1])
    assert targets.shape == (400, 4)
    np.testing.assert_array_equal(targets[:, 0], one[2])
    owner = np.repeat(np.arange(60), np.diff(indptr))
    for b in range(400):
        pos = one[2][b] - 1  # the first target's position in `items` (ids are position + 1)
        following = items[pos : min(pos + 4, indptr[owner[pos] + 1])]  # within its own row only
        assert targets[b].tolist() == [*following.tolist(), *[0] * (4 - len(following))]
    with pytest.raises(ValueError, match="predict_next must be >= 1"):
        TrainSampler(indptr, items, 6, seed=0, predict_next=0)


def test_following_clicks_stop_at_the_row_end():
    items = np.arange(1, 11)
    out = following_clicks(items, np.array([[0, 3], [8, 9]]), np.array([[4, 4], [10, 10]]), 3)
    assert out.tolist() == [[[1, 2, 3], [4, 0, 0]], [[9, 10, 0], [10, 0, 0]]]


@pytest.mark.parametrize("sampler", [TrainSampler, WindowSampler])
def test_the_ranks_slices_make_the_batch_one_process_draws(sampler):
    """Data parallelism: with one seed, rank r of 3 draws rows 8r..8r+7 of the global batch of 24,
    batch after batch (its stream stays in step with the one process's)."""
    indptr, items = random_csr(60, 12, unique=True)
    one = sampler(indptr, items, 5, seed=3)
    ranks = [sampler(indptr, items, 5, seed=3, rank=r, world_size=3) for r in range(3)]
    for _ in range(2):
        whole = one.sample(24)
        parts = [rank.sample(8) for rank in ranks]
        for got, want in zip(zip(*parts), whole):
            np.testing.assert_array_equal(np.concatenate(got), want)
    assert not np.array_equal(parts[0][2], parts[1][2])
    with pytest.raises(ValueError, match="rank must be in \\[0, world_size\\), got rank 2 of 2"):
        sampler(indptr, items, 5, seed=3, rank=2, world_size=2)


def _epoch_csr():
    """Three users (2, 5 and 4 clicks; the last one's training part ends a click early) with unique
    items, so a target names its row and position; 1 + 4 + 2 = 7 targets at min_target 1."""
    indptr = np.array([0, 2, 7, 11])
    ends = np.array([2, 7, 10])
    return indptr, np.arange(1, 12), ends


def test_drawing_by_epochs_gives_every_target_once_an_epoch_in_a_fresh_order():
    indptr, items, ends = _epoch_csr()
    sampler = TrainSampler(indptr, items, max_len=5, seed=3, ends=ends, epochs=True)
    drawn = np.concatenate([sampler.sample(3)[2] for _ in range(7)])  # 21 targets: three epochs of 7
    every = [2, 4, 5, 6, 7, 9, 10]  # each row's clicks after its first, inside its training part
    epochs = [sorted(drawn[i : i + 7]) for i in (0, 7, 14)]
    assert epochs == [every] * 3  # batches of 3 run across the epochs' edges
    assert len({tuple(drawn[i : i + 7]) for i in (0, 7, 14)}) > 1  # each epoch in its own order
    seq, lengths, targets = sampler.sample(7)
    np.testing.assert_array_equal(seq[np.arange(7), lengths - 1], targets - 1)  # the click before each


def test_an_epoch_order_resumes_from_its_state_and_ranks_share_it():
    indptr, items, ends = _epoch_csr()
    a = TrainSampler(indptr, items, max_len=5, seed=3, ends=ends, epochs=True)
    a.sample(5)
    state, epoch = a.get_state(), a.epoch_state()
    after = [a.sample(4)[2] for _ in range(4)]
    b = TrainSampler(indptr, items, max_len=5, seed=9, ends=ends, epochs=True)
    b.set_state(state)
    b.restore_epoch(epoch)
    assert all((x == b.sample(4)[2]).all() for x in after)
    whole = TrainSampler(indptr, items, max_len=5, seed=3, ends=ends, epochs=True).sample(6)[2]
    halves = [
        TrainSampler(indptr, items, 5, 3, ends=ends, epochs=True, rank=r, world_size=2).sample(3)[2] for r in (0, 1)
    ]
    np.testing.assert_array_equal(np.concatenate(halves), whole)
