"""The row-sparse item table against torch's dense AdamW and the dense weight average."""

import pytest
import torch

from recsys.items import ItemTable, RowSparseTable, RowUpdates
from recsys.items.row_sparse import average_catch_up, unique_slots
from recsys.train.averaging import WeightAverage

LR, DECAY, EMA = 0.05, 0.3, 0.9


@pytest.mark.parametrize("size", [1, 7, 50, 129])
def test_unique_slots_numbers_each_distinct_id_once(size):
    g = torch.Generator().manual_seed(size)
    ids = torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(0, 20, (size,), generator=g)])
    distinct, slot = unique_slots(ids)
    expected = torch.unique(ids)
    assert distinct.shape == ids.shape and slot.shape == ids.shape
    assert torch.equal(distinct[: len(expected)], expected)  # ascending, id 0 in slot 0
    assert (distinct[len(expected) :] == 0).all()
    assert torch.equal(distinct[slot], ids)


def test_average_catch_up_equals_folding_the_moving_row_in_one_update_at_a_time():
    beta, shrink, ratio, offset = 0.9, 0.97, 0.85, 0.4
    for done, k in [(0, 1), (0, 5), (3, 0), (3, 7), (40, 2)]:
        w0, avg = 2.0, torch.tensor(-1.0, dtype=torch.float64)
        looped = avg.clone()
        for j in range(done + 1, done + k + 1):
            i = j - done
            w = shrink**i * (w0 - offset) + ratio**i * offset  # an untouched row's i-th step
            looped = looped + (w - looped) * (1 - beta) / (1 - beta**j)
        a, b, c = average_catch_up(torch.tensor([done]), torch.tensor([k]), beta, shrink, ratio)
        torch.testing.assert_close(a * avg + b * w0 + c * offset, looped[None], rtol=1e-12, atol=1e-12)


def _tables(num_items: int = 9, dim: int = 4, ema: float = EMA, betas: tuple[float, float] = (0.9, 0.999)):
    torch.manual_seed(0)
    dense = ItemTable(num_items, dim)
    sparse = ItemTable(num_items, dim)
    sparse.load_state_dict(dense.state_dict())
    optimizer = torch.optim.AdamW(dense.parameters(), lr=LR, weight_decay=DECAY, betas=betas)
    average = WeightAverage(dense, ema) if ema else None
    rows = RowSparseTable(sparse, RowUpdates(lr=LR, weight_decay=DECAY, ema_decay=ema, betas=betas), "table.weight")
    return dense, optimizer, average, sparse, rows


def _loss(table: torch.Tensor, ids: torch.Tensor, step: int) -> torch.Tensor:
    """A loss whose gradient differs per occurrence (ids repeat); padding (id 0) is masked, as
    the models mask it."""
    scale = torch.arange(1, ids.numel() + 1, dtype=table.dtype)[:, None] / (step + 1) * (ids > 0)[:, None]
    return ((table[ids] - 0.3) * scale).square().sum()


def _linear_loss(table: torch.Tensor, ids: torch.Tensor, step: int) -> torch.Tensor:
    """A loss whose gradient does not depend on the weights, so that float rounding is not fed
    back and amplified over hundreds of steps (Adam's normalised steps near a minimum are)."""
    phase = torch.arange(ids.numel() * table.shape[1], dtype=table.dtype).view(ids.numel(), -1)
    return (table[ids] * torch.cos(0.7 * step + phase) * (ids > 0)[:, None]).sum()


def _dense_step(dense, optimizer, average, ids, step, loss=_loss):
    average is not None and average.prepare(step)
    optimizer.zero_grad()
    loss(dense.weight, ids, step).backward()
    optimizer.step()
    average is not None and average.update()


def _sparse_step(rows, ids, step, loss=_loss):
    with rows.step_rows(ids) as (local,):
        loss(rows.weight, local, step).backward()
    rows.collect()
    rows.update()


def test_rows_touched_every_step_and_rows_never_touched_follow_dense_adamw_and_the_average():
    """Rows 1-4 get a gradient every step; rows 5-8 never do, so dense AdamW only decays them
    (their moments stay 0) and folds them into the average: the lazy catch-up is exact there."""
    dense, optimizer, average, sparse, rows = _tables()
    ids = torch.tensor([3, 1, 4, 1, 2, 0, 3])  # repeats, and the padding id
    for step in range(12):
        _dense_step(dense, optimizer, average, ids, step)
        _sparse_step(rows, ids, step)
    rows.sync()
    torch.testing.assert_close(sparse.weight, dense.weight, rtol=1e-5, atol=1e-6)
    assert average is not None and rows.average is not None
    torch.testing.assert_close(rows.average, average.weights[0], rtol=1e-5, atol=1e-6)
    assert (sparse.weight[0] == 0).all() and (rows.average[0] == 0).all()  # padding never moves


def test_rows_left_untouched_keep_moving_with_their_momentum_as_under_dense_adamw():
    """Rows 3-6 get gradients for 600 steps, then only rows 1-2 do: dense AdamW carries rows 3-6
    on with their momentum, and the catch-up follows (its bias corrections held at the last
    write, settled by then with beta2 = 0.99)."""
    dense, optimizer, average, sparse, rows = _tables(betas=(0.9, 0.99))
    assert average is not None and rows.average is not None
    for step in range(640):
        ids = torch.tensor([1, 2, 3, 4, 5, 6]) if step < 600 else torch.tensor([1, 2])
        _dense_step(dense, optimizer, average, ids, step, _linear_loss)
        _sparse_step(rows, ids, step, _linear_loss)
        if step in (605, 639):  # a few and many steps away
            rows.sync()
            torch.testing.assert_close(sparse.weight, dense.weight, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(rows.average, average.weights[0], rtol=1e-4, atol=1e-5)
            state = optimizer.state[dense.table.weight]
            torch.testing.assert_close(rows.exp_avg, state["exp_avg"], rtol=1e-4, atol=1e-7)
            torch.testing.assert_close(rows.exp_avg_sq, state["exp_avg_sq"], rtol=1e-4, atol=1e-9)


def test_a_row_read_after_steps_away_sees_the_decay_it_missed():
    dense, optimizer, average, _, rows = _tables()
    for step in range(5):
        _dense_step(dense, optimizer, average, torch.tensor([1, 2]), step)
        _sparse_step(rows, torch.tensor([1, 2]), step)
    with rows.step_rows(torch.tensor([6])) as (local,):  # untouched for 5 steps: read as dense holds it now
        torch.testing.assert_close(rows.weight[local], dense.weight[6:7].detach(), rtol=1e-6, atol=1e-7)


def test_the_average_swaps_in_and_out_and_a_new_rate_keeps_the_catch_up_exact():
    dense, optimizer, average, sparse, rows = _tables()
    ids = torch.tensor([1, 2, 2])
    for step in range(10):
        if step == 6:  # a plateau's drop: every row caught up at the old rate first
            rows.scale_lr(0.1)
            for group in optimizer.param_groups:
                group["lr"] *= 0.1
        _dense_step(dense, optimizer, average, ids, step)
        _sparse_step(rows, ids, step)
    rows.sync()
    own = sparse.weight.clone()
    assert average is not None
    with rows.scored():
        torch.testing.assert_close(sparse.weight, average.weights[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sparse.weight, own, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sparse.weight, dense.weight, rtol=1e-5, atol=1e-6)


def test_state_round_trip_continues_bit_for_bit():
    _, _, _, sparse, rows = _tables()
    g = torch.Generator().manual_seed(4)
    batches = [torch.randint(0, 9, (6,), generator=g) for _ in range(10)]
    for step, ids in enumerate(batches[:5]):
        _sparse_step(rows, ids, step)
    rows.sync()
    state, weights = rows.train_state(), {k: v.clone() for k, v in sparse.state_dict().items()}
    for step, ids in enumerate(batches[5:], start=5):
        _sparse_step(rows, ids, step)

    torch.manual_seed(1)  # different initial rows, all overwritten by the state
    again = ItemTable(9, 4)
    again.load_state_dict(weights)
    resumed = RowSparseTable(again, RowUpdates(lr=LR, weight_decay=DECAY, ema_decay=EMA), "table.weight")
    resumed.load_train_state(state)
    for step, ids in enumerate(batches[5:], start=5):
        _sparse_step(resumed, ids, step)
    assert torch.equal(again.weight, sparse.weight)
    assert resumed.average is not None and rows.average is not None
    assert torch.equal(resumed.average, rows.average) and torch.equal(resumed.exp_avg_sq, rows.exp_avg_sq)


def test_a_state_of_another_shape_without_an_average_or_of_a_dense_run_is_refused():
    _, _, _, _, rows = _tables()
    _, _, _, _, plain = _tables(ema=0.0)
    with pytest.raises(ValueError, match="without a weight average"):
        rows.load_train_state(plain.train_state())
    _, _, _, _, wider = _tables(dim=8)
    with pytest.raises(ValueError, match="row-sparse item table"):
        rows.load_train_state(wider.train_state())
    with pytest.raises(ValueError, match='item_updates = "dense"'):
        rows.load_train_state({})  # a dense run's checkpoint has none


def test_the_model_reads_the_gathered_rows_and_padding_stays_zero():
    emb = ItemTable(9, 4)
    seq = torch.tensor([[5, 2, 0], [7, 0, 0]])
    lengths = torch.tensor([2, 1])
    full = emb(seq, lengths)
    rows = emb.trained_as("sparse", RowUpdates(lr=LR), "table.weight")
    assert isinstance(rows, RowSparseTable) and rows.table is emb.table  # the same rows, the same name
    with rows.step_rows(seq) as (local,):
        assert rows.weight is rows.gathered and local.shape == seq.shape
        torch.testing.assert_close(rows(local, lengths), full)
    assert rows.weight is rows.table.weight and torch.equal(rows.all(), emb.all())
    assert not rows.table.weight.requires_grad  # the dense optimiser leaves the table alone
    assert sorted(rows.state_dict()) == sorted(emb.state_dict()) == ["table.weight"]


def test_the_adam_variant_adds_l2_to_touched_rows_only():
    torch.manual_seed(0)
    dense, sparse = ItemTable(9, 4), ItemTable(9, 4)
    sparse.load_state_dict(dense.state_dict())
    optimizer = torch.optim.Adam(dense.parameters(), lr=LR, weight_decay=DECAY)
    rows = RowSparseTable(sparse, RowUpdates(lr=LR, weight_decay=DECAY, decoupled=False), "table.weight")
    ids = torch.tensor([1, 2, 3])
    untouched = sparse.weight[4:].clone()
    for step in range(4):
        _dense_step(dense, optimizer, None, ids, step)
        _sparse_step(rows, ids, step)
    torch.testing.assert_close(sparse.weight[:4], dense.weight[:4], rtol=1e-5, atol=1e-6)
    rows.sync()
    assert torch.equal(sparse.weight[4:], untouched)  # coupled L2 reaches a row through its gradient only
