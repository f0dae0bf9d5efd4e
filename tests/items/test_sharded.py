"""The sharded item table: in one process the row-sparse form bit for bit; on two gloo processes,
each with half the global batch, what one row-sparse process computes."""

import pytest
import torch

from recsys.items import ItemTable, RowSparseTable, RowUpdates, ShardedTable
from recsys.train.distributed import cleanup, setup_distributed
from tests.two_processes import rank_environment, run_two

NUM_ITEMS, DIM, LR, DECAY, EMA = 31, 4, 0.05, 0.1, 0.9
TOUCHED = 24  # batches draw ids 1..23: rows 24..30 are never touched, the others by one rank or both


def _table(form: str, world_size: int = 1, weights: dict | None = None, ema: float = EMA):
    torch.manual_seed(0)
    table = ItemTable(NUM_ITEMS, DIM)
    if weights is not None:
        table.load_state_dict(weights)
    updates = RowUpdates(lr=LR, weight_decay=DECAY, ema_decay=ema, world_size=world_size)
    return table, table.trained_as(form, updates, "table.weight")


def _batches(count: int = 6, seed: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, TOUCHED, (12,), generator=g) for _ in range(count)]


def _step(rows, ids: torch.Tensor) -> None:
    """The mean over this process's ids of a per-occurrence loss (the ranks' averaged gradients
    are then the global batch's mean's)."""
    with rows.step_rows(ids) as (local,):
        weight = (1 + ids / NUM_ITEMS)[:, None]
        ((rows.weight[local] - 0.2) * weight).square().sum(dim=1).mean().backward()
    rows.collect()
    rows.update()


def _train(rows, batches: list[torch.Tensor], world_size: int = 1, rank: int = 0, drop_at: int = -1) -> None:
    for step, ids in enumerate(batches):
        if step == drop_at:  # a plateau's drop: a lower rate, the average afresh
            rows.scale_lr(0.5)
            rows.reset_average()
        _step(rows, ids.view(world_size, -1)[rank])


def _scored(table: ItemTable, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rows, the average) of the whole table, as validation and the checkpoint see them."""
    with rows.scored():
        average = table.weight.detach().clone()
    return table.weight.detach().clone(), average


def _scored_whole(table: ItemTable, rows) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """:func:`_scored` and the resume state (one process, or rank 0)."""
    return (*_scored(table, rows), rows.train_state())


def _expected(batches: list[torch.Tensor], drop_at: int = -1) -> tuple[torch.Tensor, torch.Tensor, dict]:
    table, rows = _table("sparse")
    _train(rows, batches, drop_at=drop_at)
    return _scored_whole(table, rows)


def _assert_states_close(got: dict, expected: dict) -> None:
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(
        got["weights"]["table.weight"], expected["weights"]["table.weight"], rtol=1e-5, atol=1e-6
    )
    assert torch.equal(got["current"], expected["current"])
    assert [got[k] for k in ("steps", "average_start", "lr")] == [expected[k] for k in ("steps", "average_start", "lr")]


def _assert_states_equal(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys() and got["weights"].keys() == expected["weights"].keys()
    for key, value in [*expected.items(), *expected["weights"].items()]:
        if torch.is_tensor(value):
            assert torch.equal(got.get(key, got["weights"].get(key)), value), key
        elif key != "weights":
            assert got[key] == value, key


def test_in_one_process_it_is_the_row_sparse_form_bit_for_bit():
    batches = _batches(12, seed=3)
    sparse_table, sparse = _table("sparse")
    sharded_table, sharded = _table("sharded")
    assert isinstance(sparse, RowSparseTable) and isinstance(sharded, ShardedTable)
    _train(sparse, batches, drop_at=7)
    _train(sharded, batches, drop_at=7)
    assert torch.equal(sharded_table.weight, sparse_table.weight)  # every row, caught up or not
    _assert_states_equal(sharded.train_state(), sparse.train_state())
    got, expected = _scored_whole(sharded_table, sharded), _scored_whole(sparse_table, sparse)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    _assert_states_equal(got[2], expected[2])


def test_it_takes_the_rows_over_as_the_row_sparse_form_does():
    table, rows = _table("sharded")
    assert rows.table is table.table and not table.table.weight.requires_grad
    assert sorted(rows.state_dict()) == ["table.weight"]  # the same name: saved weights load into any form
    seq, lengths = torch.tensor([[5, 2, 0], [7, 0, 0]]), torch.tensor([2, 1])
    with rows.step_rows(seq) as (local,):
        assert rows.weight is rows.gathered and local.shape == seq.shape
        torch.testing.assert_close(rows(local, lengths), table(seq, lengths))


def _two_ranks_worker(rank: int, world_size: int, port: int, batches, expected, saved: str) -> None:
    """Half the global batch each: the whole rows and average on both ranks, and rank 0's resume
    state, are the one-process row-sparse ones; the state saved for the tests below."""
    rank_environment(rank, world_size, port)
    torch.set_num_threads(1)
    setup_distributed("cpu")
    try:
        table, rows = _table("sharded", world_size)
        _train(rows, batches, world_size, rank, drop_at=3)
        weights, average = _scored(table, rows)
        torch.testing.assert_close(weights, expected[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(average, expected[1], rtol=1e-5, atol=1e-6)
        if rank == 0:
            state = rows.train_state()
            _assert_states_close(state, expected[2])
            torch.save({"weights": {"table.weight": weights}, "state": state}, saved)
    finally:
        cleanup()


def test_two_gloo_processes_update_the_rows_as_one_row_sparse_process_does(tmp_path):
    batches = _batches()
    halves = [set(torch.cat([ids.view(2, -1)[rank] for ids in batches]).tolist()) for rank in (0, 1)]
    assert halves[0] - halves[1] and halves[1] - halves[0] and halves[0] & halves[1]  # one rank's rows, both's
    expected = _expected(batches, drop_at=3)
    saved = tmp_path / "two.pt"
    run_two(_two_ranks_worker, (batches, expected, str(saved)), ["torch", "torch.distributed"])

    # the two ranks' checkpoint resumes in one process (and either form), where one process goes on
    more = _batches(4, seed=5)
    ck = torch.load(saved, weights_only=True)
    for form in ("sharded", "sparse"):
        table, rows = _table(form, weights=ck["weights"])
        rows.load_train_state(ck["state"])
        _train(rows, more)
        one_table, one = _table("sparse")
        _train(one, batches, drop_at=3)
        _scored(one_table, one)  # the checkpoint brought every row up to date (the catch-up starts afresh there)
        _train(one, more)
        got, want = _scored_whole(table, rows), _scored_whole(one_table, one)
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
        _assert_states_close(got[2], want[2])


def _resume_worker(rank: int, world_size: int, port: int, batches, one_process: dict, expected) -> None:
    """Both ranks resume from a one-process checkpoint; then two round trips of their own state
    (gathered on rank 0, read back by both) continue bit for bit."""
    rank_environment(rank, world_size, port)
    torch.set_num_threads(1)
    setup_distributed("cpu")
    try:
        table, rows = _table("sharded", world_size, weights=one_process["weights"])
        rows.load_train_state(one_process["state"])
        _train(rows, batches[:2], world_size, rank)
        weights, _ = _scored(table, rows)
        box = [rows.train_state() if rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=0)  # the checkpoint rank 0 would write
        _train(rows, batches[2:], world_size, rank)
        final = (*_scored(table, rows), rows.train_state() if rank == 0 else None)

        again_table, again = _table("sharded", world_size, weights={"table.weight": weights})
        again.load_train_state(box[0])
        _train(again, batches[2:], world_size, rank)
        resumed = (*_scored(again_table, again), again.train_state() if rank == 0 else None)
        assert torch.equal(resumed[0], final[0]) and torch.equal(resumed[1], final[1])
        if rank == 0:
            assert final[2] is not None and resumed[2] is not None
            for key, value in final[2].items():
                if torch.is_tensor(value):
                    assert torch.equal(resumed[2][key], value), key
            assert torch.equal(resumed[2]["weights"]["table.weight"], final[2]["weights"]["table.weight"])
            _assert_states_close(final[2], expected[2])
        torch.testing.assert_close(final[0], expected[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(final[1], expected[1], rtol=1e-5, atol=1e-6)
    finally:
        cleanup()


def test_a_one_process_checkpoint_resumes_on_two_processes_and_their_own_round_trips_bit_for_bit():
    first, then = _batches(3, seed=6), _batches(5, seed=7)
    table, rows = _table("sparse")
    _train(rows, first)
    weights, _, state = _scored_whole(table, rows)
    one_process = {"weights": {"table.weight": weights}, "state": state}
    _train(rows, then[:2])
    _scored(table, rows)  # where the two ranks checkpoint (the catch-up starts afresh there)
    _train(rows, then[2:])
    expected = _scored_whole(table, rows)
    run_two(_resume_worker, (then, one_process, expected), ["torch", "torch.distributed"])


def test_a_state_without_an_average_or_of_a_dense_run_is_refused():
    _, rows = _table("sharded")
    _, plain = _table("sharded", ema=0.0)
    with pytest.raises(ValueError, match="sharded item table .* without a weight average"):
        rows.load_train_state(plain.train_state())
    with pytest.raises(ValueError, match='item_updates = "dense"'):
        rows.load_train_state({})
