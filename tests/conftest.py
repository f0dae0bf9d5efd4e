"""Test-wide setup: run the Triton kernels in the interpreter when there is no GPU.

``TRITON_INTERPRET`` must be set before ``triton.jit`` decorates the kernels, i.e. before any
``recsys.kernels`` Triton module is imported; conftest is imported first.
"""

import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest

TINY_RUN_OVERRIDES = [
    "synthetic.num_users=400",
    "synthetic.num_items=200",
    "synthetic.num_categories=8",
    "synthetic.interests_per_user=2",
    "synthetic.mean_length=12",
    "data.max_len=10",
    "model.dim=16",
    "model.num_interests=4",
    "model.backend=torch",
    "train.max_steps=20",
    "train.eval_every=20",
    "train.batch_size=32",
    "train.num_negatives=64",
    "name=tiny",
]


# a few-second training run on small synthetic data, for the trainer's own tests
def tiny_clicks_overrides(clicks: Path, runs: Path, steps: int) -> dict[str, str | int]:
    """The overrides of a tiny CPU run on a ``user,item`` click file without times: every item kept,
    8 wide, the kernels' torch twins (they run interpreted under the tests), ``steps`` steps and one
    validation at the end, runs written under ``runs``."""
    return {
        "data.source": str(clicks),
        "data.time_col": "",
        "data.min_item_count": 1,
        "model.dim": 8,
        "model.backend": "torch",
        "train.max_steps": steps,
        "train.eval_every": steps,
        "train.device": "cpu",
        "output_dir": str(runs),
    }


TINY_TRAIN_OVERRIDES = [
    "synthetic.num_users=600",
    "synthetic.num_items=300",
    "synthetic.num_categories=10",
    "synthetic.mean_length=20",
    "model.dim=16",
    "model.backend=torch",
    "train.batch_size=32",
    "train.log_every=10",
    "train.eval_every=20",
    "train.max_steps=40",
    "data.max_len=10",
]


def resolved(cfg, num_items: int = 1_000, *, tied_share: float = 0.0, device: str = "cpu", lengths=(20,) * 100):
    """``cfg`` resolved as an experiment on ``num_items`` ids (with padding) would resolve it, with
    training sequences of ``lengths`` clicks and ``tied_share`` of consecutive clicks tied, trained
    on a ``device`` type (recsys.run.settings.resolve)."""
    from recsys.run.settings import Facts, resolve

    return resolve(cfg, Facts.of_lengths(list(lengths), num_items, tied_share, device))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A trained run directory (ComiRec-SA, K=4, d=16, ~200 synthetic items, 20 steps; ~3 s),
    shared by the index / recommend / serve tests, which must not modify its weights."""
    from recsys.config import load_config
    from recsys.train.trainer import train

    cfg = load_config(None, TINY_RUN_OVERRIDES + [f"output_dir={tmp_path_factory.mktemp('runs')}"])
    return train(cfg, log=lambda line: None).run_dir


@pytest.fixture(autouse=True, scope="session")
def steady_machine():
    """The machine as the automatic ``train.cpu_threads`` reads it (recsys.run.settings.machine_cores),
    read once for the session: what other work keeps busy changes from one moment to the next, and
    two runs a test compares (a run and its resume, a dry run and the run) must decide alike. Yields
    the measurement itself, for the tests of it."""
    from recsys.run import settings

    measure = settings.machine_cores
    with pytest.MonkeyPatch.context() as patch:
        machine = measure()
        patch.setattr(settings, "machine_cores", lambda: machine)
        yield measure


class SimulatedClock:
    """The trainer's clock on simulated seconds: reading the data takes ``data_s``, a training step
    ``step_s`` and evaluating ``user_s`` a user (``evaluated``: the users of each evaluation, the
    validations' and the test's, in order); nothing else takes any time."""

    def __init__(self, data_s: float = 5.0, step_s: float = 1.0, user_s: float = 0.1) -> None:
        self.now, self.data_s, self.step_s, self.user_s = 1000.0, data_s, step_s, user_s
        self.evaluated: list[int] = []

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def simulated_clock(monkeypatch):
    """A :class:`SimulatedClock` that ``recsys.train.trainer`` and its loop read as ``time.perf_counter``."""
    from types import SimpleNamespace

    from recsys.train import loop, step, trainer

    clock = SimulatedClock()

    def slowed(fn, seconds):
        def call(*args, **kwargs):
            clock.now += seconds(*args)
            return fn(*args, **kwargs)

        return call

    def evaluation(model, users, *args):
        clock.evaluated.append(len(users))
        return clock.user_s * len(users)

    for module in (trainer, loop):
        monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(trainer, "build_experiment", slowed(trainer.build_experiment, lambda *a: clock.data_s))
    monkeypatch.setattr(step.TrainStep, "__call__", slowed(step.TrainStep.__call__, lambda *a: clock.step_s))
    monkeypatch.setattr(trainer, "evaluate_with_config", slowed(trainer.evaluate_with_config, evaluation))
    return clock


@pytest.fixture
def count_syncs():
    """``count(fn)``: how many synchronizing CUDA calls ``fn()`` makes, from torch's sync debug
    mode's warnings. Only the per-call warning counts: the first switch to the mode in a process
    also warns, once, that the mode "does not yet detect all synchronizing operations"."""
    import warnings

    def count(fn) -> int:
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)

    return count


@pytest.fixture
def random_batches():
    """``batches(num_items, max_len)``: right-padded random click batches ``(seq [B, L] int64,
    lengths [B] int64)`` at batch sizes 1..33 and lengths 1..max_len (for export checks)."""
    import numpy as np

    def batches(num_items: int, max_len: int):
        gen = np.random.default_rng(1)
        for batch, length in [(1, 1), (3, 4), (17, max_len), (33, max(1, max_len // 2))]:
            seq = gen.integers(1, num_items, (batch, length), dtype=np.int64)
            lengths = gen.integers(1, length + 1, batch, dtype=np.int64)
            seq[np.arange(length)[None, :] >= lengths[:, None]] = 0
            yield seq, lengths

    return batches


@pytest.fixture(scope="session")
def service_app(tiny_run):
    """The FastAPI app serving the tiny run (Flat index, serve.n = 10, serve.max_n = 100)."""
    pytest.importorskip(
        "fastapi", reason="the service needs the serve extra: pip install 'multi-interest-recsys[serve]'"
    )
    from recsys.config import ServeConfig
    from recsys.serve.app import create_app
    from recsys.serve.recommender import Recommender

    rec = Recommender.from_run(tiny_run, factory="Flat", log=lambda line: None)
    return create_app(rec, ServeConfig(n=10, max_n=100), run=tiny_run)


@pytest.fixture(scope="session")
def client(service_app):
    """A starlette TestClient on :func:`service_app` (requests run through the real ASGI stack)."""
    from fastapi.testclient import TestClient

    with TestClient(service_app, raise_server_exceptions=False) as test_client:
        yield test_client


def pytest_addoption(parser):
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the soak tests (10 minutes of mixed traffic against `recsys serve`)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: 10 minutes of traffic; run with `python -m pytest --soak -m soak`")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
