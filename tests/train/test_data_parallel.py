"""Whole training runs under torchrun with gloo on the CPU: two processes train what one process
trains at the same global batch, a checkpoint resumes on another number of processes as the
run would have gone on, two "hosts" (two torchrun agents meeting at one rendezvous) train as one
process does, and a rank that stops or dies ends the job with one line and a checkpoint to resume.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from recsys.config import load_config
from recsys.data.synthetic import generate
from recsys.run import RunDir
from recsys.run.settings import Facts, resolve
from recsys.train.trainer import _keep_global_batch, train
from tests.conftest import TINY_TRAIN_OVERRIDES, resolved

BATCH = 32  # the global batch
SMALL = [
    *TINY_TRAIN_OVERRIDES,
    "synthetic.num_users=300",
    "synthetic.num_items=200",
    "train.device=cpu",
    "train.cpu_threads=1",
    "train.cuda_graph=false",
    "model.dropout=0",  # dropout draws from each rank's own torch stream
    "train.log_every=2",
    "train.eval_every=4",
    "train.max_steps=8",
    "eval.valid_users=50",
]
TIMEOUT = 120
# `python -m recsys`, failing a rank whose DDP wrapper outlives its process group
RECSYS = ["-m", "tests.train.recsys_exit_check"]


def _overrides(tmp_path: Path, name: str, world_size: int, *extra: str) -> list[str]:
    return [*SMALL, f"train.batch_size={BATCH // world_size}", f"output_dir={tmp_path}", f"name={name}", *extra]


def _one_process(tmp_path: Path, name: str, *extra: str, max_steps: int = 8) -> Path:
    cfg = load_config(None, [*_overrides(tmp_path, name, 1, *extra), f"train.max_steps={max_steps}"])
    return Path(train(cfg, log=lambda line: None).run_dir)


def _recsys_args(tmp_path: Path, name: str, world_size: int, *extra: str) -> list[str]:
    args = [*RECSYS, "train", "--quiet"]
    for override in _overrides(tmp_path, name, world_size, *extra):
        args += ["--set", override]
    return args


def _launch(args: list[str], out: Any = subprocess.PIPE, **env: str) -> subprocess.Popen:
    """``torchrun ARGS`` with its output (both streams) to ``out`` and ``env`` added to ours."""
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )


def _finish(process: subprocess.Popen) -> str:
    try:
        out, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"torchrun did not finish within {TIMEOUT} s: {process.communicate()[0][-3000:]}")
    assert process.returncode == 0, out[-4000:]
    return out


def _torchrun(*args: str) -> str:
    return _finish(_launch(["--standalone", "--nproc-per-node=2", *args]))


def _weights(run: Path) -> dict[str, torch.Tensor]:
    """The last checkpoint's weights, and its item rows' Adam moments where the table is row-sparse."""
    ck = RunDir(run).load_checkpoint()
    rows = {f"item_rows.{k}": ck["item_rows"][k] for k in ("exp_avg", "exp_avg_sq")} if "item_rows" in ck else {}
    return {**ck["model"], **rows}


def _assert_same_training(run: Path, reference: Path, steps: int) -> None:
    assert RunDir(run).load_checkpoint()["step"] == RunDir(reference).load_checkpoint()["step"] == steps
    got, want = _weights(run), _weights(reference)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def _logged(run: Path) -> list[float]:
    """The loss and log Z of every log line of ``run``."""
    return [row[k] for row in RunDir(run).read_metrics() if "loss" in row for k in ("loss", "log_z")]


def _moved(run: Path, reference: Path) -> bool:
    want = _weights(reference)
    return any(not torch.equal(tensor, want[name]) for name, tensor in _weights(run).items())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_hosts(tmp_path: Path, name: str, *extra: str) -> None:
    """Two torchrun agents of one process each, started with the same command but their node
    rank, meeting at a c10d rendezvous: two "hosts" on this machine."""
    port = _free_port()
    hosts = [
        _launch(
            [
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={name}",
                *_recsys_args(tmp_path, name, 2, *extra),
            ]
        )
        for node in (0, 1)
    ]
    for host in hosts:
        _finish(host)


# the masked objectives: each rank's rows are valid in other numbers, and the means must be the global batch's
# (QK-norm: without it the key bias has no gradient but rounding, which Adam scales up to steps of lr)
EVERY_POSITION = (
    "model.name=sasrec",
    "model.num_layers=1",
    "model.qk_norm=rms",
    "train.predict_at=all",
    "train.z_loss=0.01",
)
HORIZON = ("train.predict_next=2", "train.z_loss=0.01")
DENSE_PARTED = ("train.predict_at=all", "train.interest_reg=0.5", "train.interest_margin=-1")  # comirec_sa, K = 4


@pytest.mark.parametrize(
    "updates, hosts, objective",
    [
        ("dense", 1, ()),
        ("sparse", 2, ()),
        ("sharded", 1, HORIZON),  # each rank its share of the rows' Adam state and average
        ("dense", 1, EVERY_POSITION),  # sasrec's exact softmax
        ("sparse", 1, HORIZON),
        ("dense", 1, DENSE_PARTED),
    ],
    ids=["dense", "sparse-two-hosts", "sharded", "sasrec-every-position", "horizon-2", "every-position-interest-reg"],
)
def test_two_processes_train_what_one_process_trains_at_the_same_global_batch(tmp_path, updates, hosts, objective):
    """Two processes of 16 samples each, on one host or on two, end 8 steps with the weights (and
    the row-sparse or sharded table's Adam moments) of one process at 32, to float rounding; also with the
    masked objectives (every position, a horizon of 2, the interest term over every prefix),
    whose means are over the global batch's valid rows, however the ranks' shares of them differ."""
    settings = (f"train.item_updates={updates}", *objective)
    one = _one_process(tmp_path, "one", *settings)
    if hosts == 1:
        _torchrun(*_recsys_args(tmp_path, "two", 2, *settings))
    else:
        _two_hosts(tmp_path, "two", *settings)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]  # one run directory for the job
    _assert_same_training(tmp_path / "two", one, steps=8)
    # the logged loss and log Z are the global batch's too (the ranks' own, averaged)
    got, want = (_logged(tmp_path / run) for run in ("two", "one"))
    assert len(want) == 8 and got == pytest.approx(want, rel=1e-4)  # 4 log lines
    # the comparison can fail: half the global batch on one process trains something else
    half = _one_process(tmp_path, "half", *settings, "train.batch_size=16")
    assert _moved(half, one)


@pytest.mark.parametrize("updates", ["sparse", "sharded"])
def test_a_run_resumes_on_another_number_of_processes_as_it_would_have_gone_on(tmp_path, updates):
    """Checkpointed at step 4 on two processes (16 samples each), resumed on one to step 8, and
    from one process (32) to two: what must hold is that after step 8 the weights and the item
    rows' Adam moments are those of the uninterrupted run at the same global batch of 32, to float
    rounding; the resumed run takes 32 / its processes samples each, and says so. The sharded
    table's checkpoint holds the whole table's state, which each rank takes its share of."""
    reference = _one_process(tmp_path, "one", f"train.item_updates={updates}")
    _torchrun(*_recsys_args(tmp_path, "two-one", 2, f"train.item_updates={updates}", "train.max_steps=4"))
    lines: list[str] = []
    cfg = RunDir(tmp_path / "two-one").read_config()
    cfg.train.max_steps = 8
    train(cfg, run_dir=tmp_path / "two-one", resume=True, log=lines.append)
    assert "resumed on 1 process (trained on 2): train.batch_size 16 -> 32 each, the same global batch of 32" in lines
    assert RunDir(tmp_path / "two-one").read_config().train.batch_size == 32
    _assert_same_training(tmp_path / "two-one", reference, steps=8)

    _one_process(tmp_path, "one-two", f"train.item_updates={updates}", max_steps=4)
    _torchrun(*RECSYS, "train", "--quiet", "--resume", str(tmp_path / "one-two"), "--set", "train.max_steps=8")
    assert RunDir(tmp_path / "one-two").read_config().train.batch_size == 16
    _assert_same_training(tmp_path / "one-two", reference, steps=8)


def test_a_resume_keeps_the_global_batch_or_says_why_it_cannot():
    cfg = resolved(load_config(None, ["train.batch_size=15"]))  # a saved config: every value explicit
    assert _keep_global_batch(cfg, None, 2, print) is cfg and _keep_global_batch(cfg, 2, 2, print) is cfg
    lines: list[str] = []
    five = _keep_global_batch(cfg, 1, 3, lines.append)
    assert (five.train.batch_size, five.train.num_negatives, cfg.train.batch_size) == (5, 150, 15)
    two = resolve(load_config(None, ["train.batch_size=16"]), Facts.of_lengths([20] * 100, 1000, world_size=2))
    one = _keep_global_batch(two, 2, 1, print)  # 10 × the global batch, as the two processes resolved it
    assert (two.train.num_negatives, one.train.batch_size, one.train.num_negatives) == (320, 32, 320)
    assert lines == [
        "resumed on 3 processes (trained on 1): train.batch_size 15 -> 5 each, the same global batch of 15"
    ]
    with pytest.raises(ValueError, match=r"^train.batch_size: the run trained on 1 process at 15 each \(a global "):
        _keep_global_batch(cfg, 1, 2, print)
    written = load_config(None, [])  # a config as written: its batch is the rule's for the processes that resolve it
    assert _keep_global_batch(written, 2, 2, print) is written
    with pytest.raises(ValueError, match=r"^train.batch_size: automatic in the config given; a run trained on 2 "):
        _keep_global_batch(written, 2, 1, print)


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the worker of rank ``rank`` among the processes whose environment holds ``marker``."""
    for entry in Path("/proc").iterdir():
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if marker.encode() in env and f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


def _wait_for(condition, what: str, seconds: float = TIMEOUT) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {seconds:g} s")
        time.sleep(0.2)


@pytest.mark.parametrize(
    "stop, says",
    [
        (
            signal.SIGSTOP,
            r"rank 1 did not answer \(stopped or hung\); a collective waited 3 s for it \(RECSYS_DIST_TIMEOUT\)",
        ),
        (
            signal.SIGKILL,
            r"(lost another rank \(.*Connection (closed|reset) by peer.*\)|stopped by SIGTERM); "
            r"torchrun names the rank that exited",
        ),
    ],
    ids=["stopped", "killed"],
)
def test_a_rank_that_stops_or_dies_ends_the_job_with_one_line_and_a_checkpoint_to_resume(tmp_path, stop, says):
    """Rank 1 is stopped (a hung process, a lost host: only the collective timeout notices) or
    killed after the first checkpoint: rank 0 stops with one line that names what happened and
    the checkpoint that resumes the run, and the run resumes from it. (Killed, rank 0 fails its
    next collective or gets torchrun's SIGTERM first, whichever comes first.)"""
    marker = f"RECSYS_TEST_JOB={tmp_path.name}"  # in the workers' environment: how the test finds rank 1
    log = tmp_path / "torchrun.log"
    args = _recsys_args(tmp_path, "k", 2, "train.max_steps=100000", "train.patience=100000")
    with log.open("w") as out:
        job = _launch(
            ["--standalone", "--nproc-per-node=2", *args], out, RECSYS_DIST_TIMEOUT="3", RECSYS_TEST_JOB=tmp_path.name
        )
    try:
        _wait_for((tmp_path / "k" / "model.pt").exists, "no checkpoint")
        victim = _rank_pid(marker, 1)
        assert victim is not None
        os.kill(victim, stop)
        _wait_for(lambda: "recsys train: error:" in log.read_text(), "rank 0 did not stop")
        if stop == signal.SIGSTOP:
            os.kill(victim, signal.SIGKILL)  # else torchrun waits 30 s for it to take its SIGTERM
        job.wait(timeout=TIMEOUT)
    finally:
        job.kill()
    assert job.returncode != 0
    errors = [line for line in log.read_text().splitlines() if line.startswith("recsys train: error:")]
    assert len(errors) == 1, errors
    found = re.fullmatch(
        rf"recsys train: error: rank 0 of 2: {says}; its checkpoint of step (\d+) resumes it: "
        rf"recsys train --resume {re.escape(str(tmp_path / 'k'))}",
        errors[0],
    )
    assert found, errors[0]
    step = int(found.group(found.lastindex))
    cfg = RunDir(tmp_path / "k").read_config()
    cfg.train.max_steps = step + 2
    assert train(cfg, run_dir=tmp_path / "k", resume=True, log=lambda line: None).steps == step + 2


def test_two_processes_resumed_on_two_train_as_the_uninterrupted_run_dropout_included(tmp_path):
    """Each rank draws its own dropout masks; the checkpoint keeps every rank's stream, so a run
    stopped at step 4 and resumed on as many processes ends bit for bit where the uninterrupted
    one does."""
    dropout = ["model.name=sasrec", "model.dropout=0.3", "model.num_layers=1"]
    _torchrun(*_recsys_args(tmp_path, "whole", 2, *dropout))
    _torchrun(*_recsys_args(tmp_path, "resumed", 2, *dropout, "train.max_steps=4"))
    _torchrun(*RECSYS, "train", "--quiet", "--resume", str(tmp_path / "resumed"), "--set", "train.max_steps=8")
    got, want = _weights(tmp_path / "resumed"), _weights(tmp_path / "whole")
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)


# recsys train, counting the preparations out of core (each made long enough for the other rank to
# find the cache still empty)
COUNTING_DRIVER = """
import os, sys, time
from recsys.cli import main
from recsys.data import ondisk

prepare = ondisk.prepare_on_disk


def counted(*args, **kwargs):
    with open(sys.argv[1], "a") as f:
        f.write(os.environ["RANK"] + "\\n")
    time.sleep(1)
    return prepare(*args, **kwargs)


ondisk.prepare_on_disk = counted
sys.exit(main(sys.argv[2:]))
"""


def test_two_ranks_prepare_a_log_not_prepared_yet_once_and_both_train_on_it(tmp_path):
    """Launched on a log not prepared yet (data.prepare=disk), one rank prepares it into the cache
    while the other waits, then both open the one published folder; nothing else is left there."""
    pytest.importorskip("duckdb")
    clicks = generate(load_config(None, SMALL).synthetic).rename(columns={"time": "timestamp"})
    clicks[["user", "item", "timestamp"]].to_csv(tmp_path / "log.csv", index=False)
    (tmp_path / "driver.py").write_text(COUNTING_DRIVER)
    data = [f"data.source={tmp_path / 'log.csv'}", "data.prepare=disk", f"data.cache_dir={tmp_path / 'cache'}"]
    args = _recsys_args(tmp_path, "run", 2, *data, "train.max_steps=2", "train.eval_every=2")[2:]  # less "-m recsys"
    _torchrun(str(tmp_path / "driver.py"), str(tmp_path / "prepared"), *args)
    assert len((tmp_path / "prepared").read_text().split()) == 1  # one rank prepared
    (entry,) = (tmp_path / "cache").iterdir()  # no second copy, no lock, no temporary folder
    assert (entry / "dataset.json").is_file()
    assert RunDir(tmp_path / "run").load_checkpoint()["step"] == 2
