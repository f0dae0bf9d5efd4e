"""DDP setup: single-process no-op, and two gloo processes on the CPU."""

import os

import numpy as np
import pytest
import torch
from torch import nn

from recsys.train import distributed
from recsys.train.distributed import broadcast_flag, setup_distributed, unwrap_model
from tests.two_processes import run_two as _run_two

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def test_single_process_is_a_no_op(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    info = setup_distributed("cpu")
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (0, 1, 0, True)
    assert info.device == torch.device("cpu")
    assert distributed.is_main()
    assert broadcast_flag(True, info.device) is True


def test_partial_environment_is_an_error(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(RuntimeError, match="WORLD_SIZE, LOCAL_RANK not set"):
        setup_distributed("cpu")


def test_bad_device_preference(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="train.device"):
        setup_distributed("tpu")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def _global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)


def _worker(rank: int, world_size: int, port: int, expected_grads: list[torch.Tensor]) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    info = setup_distributed("cpu")
    try:
        assert (info.rank, info.world_size, info.is_main) == (rank, world_size, rank == 0)
        assert distributed.is_main() == (rank == 0)
        assert torch.distributed.get_backend() == "gloo"
        assert broadcast_flag(rank == 0, info.device) is True  # rank 0's value everywhere
        mine = _model()
        with torch.no_grad():
            for p in mine.parameters():
                p.fill_(rank + 1.0)
        distributed.broadcast_weights(mine)  # an lr drop's best weights, loaded on rank 0 only
        assert all((p == 1.0).all() for p in mine.parameters())

        _check_ddp_gradients(rank, expected_grads)
    finally:
        distributed.cleanup()


def _check_ddp_gradients(rank: int, expected_grads: list[torch.Tensor]) -> None:
    """Half the global batch per rank through DDP gives the single-process gradients.

    A function of its own so the DDP wrapper is freed before the process group is destroyed:
    a gloo reducer outliving its group can hang the worker at exit.
    """
    ddp = nn.parallel.DistributedDataParallel(_model())
    assert isinstance(unwrap_model(ddp), nn.Sequential)
    x, y = _global_batch()
    shard = slice(rank * 4, rank * 4 + 4)
    nn.functional.mse_loss(ddp(x[shard]), y[shard]).backward()
    for p, expected in zip(ddp.parameters(), expected_grads):
        torch.testing.assert_close(p.grad, expected)


def _sparse_rows_worker(rank: int, world_size: int, port: int, batches: list[torch.Tensor], expected) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    setup_distributed("cpu")
    try:
        table, rows = _sparse_table(world_size)
        for ids in batches:  # each rank its half of the global batch
            _sparse_rows_step(rows, ids.view(world_size, -1)[rank])
        rows.sync()
        torch.testing.assert_close(table.weight, expected[0])
        assert rows.average is not None
        torch.testing.assert_close(rows.average, expected[1])
    finally:
        distributed.cleanup()


def _sparse_table(world_size: int):
    from recsys.items import ItemTable, RowUpdates

    torch.manual_seed(0)
    table = ItemTable(30, 4)
    updates = RowUpdates(lr=0.05, weight_decay=0.1, ema_decay=0.9, world_size=world_size)
    return table, table.trained_as("sparse", updates, "table.weight")


def _sparse_rows_step(rows, ids: torch.Tensor) -> None:
    """The mean over this process's ids of a per-occurrence loss (DDP's average of the ranks'
    means is then the global batch's mean)."""
    with rows.step_rows(ids) as (local,):
        weight = (1 + ids / 30)[:, None]
        ((rows.weight[local] - 0.2) * weight).square().sum(dim=1).mean().backward()
    rows.collect()
    rows.update()


def test_two_gloo_processes_update_the_rows_either_touched_as_one_process_does():
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(1, 30, (12,), generator=g) for _ in range(4)]  # rows touched by one rank or both
    table, rows = _sparse_table(1)
    for ids in batches:
        _sparse_rows_step(rows, ids)
    rows.sync()
    assert rows.average is not None
    expected = (table.weight.detach().clone(), rows.average.clone())
    _run_two(_sparse_rows_worker, (batches, expected), ["torch", "torch.distributed"])


def test_two_gloo_processes_match_single_process_gradients():
    model = _model()
    x, y = _global_batch()
    nn.functional.mse_loss(model(x), y).backward()  # the global batch in one process
    expected = [p.grad.clone() for p in model.parameters()]
    # DDP's constructor imports torch._dynamo lazily (seconds): once, in the fork server
    _run_two(_worker, (expected,), ["torch", "torch._dynamo", "torch.distributed"])


def test_the_collective_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.collective_timeout().total_seconds() == distributed.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "2.5")
    assert distributed.collective_timeout().total_seconds() == 2.5
    for bad in ("0", "soon"):
        monkeypatch.setenv(distributed.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"RECSYS_DIST_TIMEOUT: must be a number of seconds > 0, got '{bad}'"):
            distributed.collective_timeout()


def test_an_error_outside_a_process_group_is_no_rank_failure():
    assert distributed.rank_failure(RuntimeError("[gloo/pair.cc:1] Connection closed by peer")) is None


def _eval_case(num_users: int):
    """A seeded comirec_sa over 40 items and ``num_users`` evaluation users (random clicks)."""
    from recsys.config import load_config
    from recsys.data.split import make_eval_set
    from recsys.models import build_model
    from tests.conftest import resolved

    cfg = resolved(load_config(None, ["model.dim=8", "data.max_len=6"]), 40)
    torch.manual_seed(0)
    model = build_model(cfg.model, 40, 6)
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 12, size=num_users)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    items = rng.integers(1, 40, size=indptr[-1])
    eval_set = make_eval_set(indptr, items, np.arange(num_users), indptr[:-1] + lengths // 2, 6)
    category = np.arange(40) % 5
    return model, eval_set, {"topn": (5, 10), "exclude_history": True, "item_category": category, "batch_size": 4}


def _evaluate_worker(rank: int, world_size: int, port: int, cases: list[tuple[int, dict]]) -> None:
    from recsys.evaluate import evaluate

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    setup_distributed("cpu")
    try:
        for num_users, expected in cases:
            model, eval_set, settings = _eval_case(num_users)
            assert evaluate(model, eval_set, across_ranks=True, **settings) == expected, (rank, num_users)
    finally:
        distributed.cleanup()


def test_two_gloo_processes_share_the_users_and_return_the_metrics_one_process_does():
    """Each rank scores half the users (an odd number; a single user leaves rank 1 none) and both
    return exactly the single process's metrics, coverage (a union over users) included."""
    from recsys.evaluate import evaluate

    cases = []
    for num_users in (37, 1):
        model, eval_set, settings = _eval_case(num_users)
        expected = evaluate(model, eval_set, **settings)
        assert expected["users"] == num_users and "coverage@10" in expected and "diversity@10" in expected
        cases.append((num_users, expected))
    _run_two(_evaluate_worker, (cases,), ["torch", "torch.distributed", "recsys.evaluate"])
