"""train.cuda_graph: "auto" captures the step where it can and says why not where it cannot;
true that cannot capture is an error naming the key; one and two GPUs (gpu marker)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from recsys.cli import main
from recsys.config import load_config
from recsys.run import RunDir
from recsys.train import distributed
from recsys.train.graphs import graph_blocker, launch_line, plan_graph
from recsys.train.step import TrainStep
from recsys.train.trainer import train
from tests.conftest import resolved

TINY = [
    "synthetic.num_users=600",
    "synthetic.num_items=300",
    "synthetic.num_categories=10",
    "synthetic.mean_length=20",
    "model.dim=16",
    "train.batch_size=32",
    "train.log_every=10",
    "train.eval_every=20",
    "train.max_steps=40",
    "data.max_len=10",
]
CUDA = torch.device("cuda")  # a device object needs no GPU; plan_graph only reads its type


def _launch_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("training step:")]


def test_auto_plans_a_graph_on_cuda_and_says_why_not_elsewhere():
    cfg = load_config(None, [])
    assert plan_graph(cfg, CUDA) == (True, None)
    capture, why = plan_graph(cfg, torch.device("cpu"))
    assert not capture and "cpu" in why
    compiled = load_config(None, ["train.compile=true"])
    capture, why = plan_graph(compiled, CUDA)
    assert not capture and "train.compile" in why
    assert plan_graph(load_config(None, ["train.cuda_graph=false"]), CUDA) == (False, None)
    assert graph_blocker(cfg, CUDA) is None
    sharded = load_config(None, ["train.item_updates=sharded"])
    assert graph_blocker(sharded, CUDA) is None  # one process: it is the row-sparse step, captured
    capture, why = plan_graph(sharded, CUDA, world_size=2)
    assert not capture and 'train.item_updates = "sharded" under torchrun' in why


@pytest.mark.parametrize(
    "overrides, device, reason",
    [
        (["train.cuda_graph=true"], torch.device("cpu"), "CUDA device"),
        (["train.cuda_graph=true", "train.compile=true"], CUDA, "train.compile"),
    ],
)
def test_true_that_cannot_capture_is_an_error_naming_the_key(overrides, device, reason):
    with pytest.raises(ValueError, match=f"train.cuda_graph = true: .*{reason}"):
        plan_graph(load_config(None, overrides), device)


def test_launch_line_names_the_setting_and_the_reason():
    auto, off = load_config(None, []), load_config(None, ["train.cuda_graph=false"])
    assert launch_line(auto, True) == "training step: one CUDA graph per step (train.cuda_graph = auto)"
    assert (
        launch_line(auto, False, "training runs on cpu")
        == "training step: eager launches (train.cuda_graph = auto: training runs on cpu)"
    )
    assert launch_line(off, False) == "training step: eager launches (train.cuda_graph = false)"


def test_auto_on_cpu_trains_eagerly_after_one_line(tmp_path):
    lines: list[str] = []
    result = train(
        load_config(None, TINY + ["model.backend=torch", "train.device=cpu", f"output_dir={tmp_path}", "name=auto"]),
        log=lines.append,
    )
    assert _launch_lines(lines) == [
        "training step: eager launches (train.cuda_graph = auto: training runs on cpu; CUDA graphs need a CUDA device)"
    ]
    assert not result.cuda_graph and result.steps == 40 and 0 <= result.test_metrics["recall@50"] <= 1
    assert RunDir(result.run_dir).read_config().train.cuda_graph == "auto"


def test_cli_refuses_true_on_cpu_before_any_work(tmp_path, capsys):
    args = ["train", "--set", f"output_dir={tmp_path}", "--set", "train.device=cpu", "--set", "train.cuda_graph=true"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "train.cuda_graph = true" in err and "CUDA device" in err
    assert not any(tmp_path.iterdir())  # nothing was written


def test_all_true_alone_is_the_flag():
    assert distributed.all_true(True, torch.device("cpu")) is True
    assert distributed.all_true(False, torch.device("cpu")) is False


def test_a_run_saved_with_graphs_off_resumes_with_auto(tmp_path):
    """Runs trained when train.cuda_graph was a bool defaulting to false may resume with "auto"."""
    first = train(
        load_config(
            None, TINY + ["model.backend=torch", "train.cuda_graph=false", f"output_dir={tmp_path}", "name=old"]
        ),
        log=lambda line: None,
    )
    assert (
        main(["train", "--resume", first.run_dir, "--set", "train.cuda_graph=auto", "--set", "train.max_steps=50"]) == 0
    )
    cfg = RunDir(first.run_dir).read_config()
    assert (cfg.train.cuda_graph, cfg.train.max_steps) == ("auto", 50)


def _torchrun(tmp_path, name: str, *overrides: str) -> subprocess.CompletedProcess:
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "recsys",
        "train",
        "--quiet",
    ]
    for override in [
        *TINY,
        "train.max_steps=60",
        "train.eval_every=30",
        "train.soft_readout_steps=20",
        f"output_dir={tmp_path}",
        f"name={name}",
        *overrides,
    ]:
        args += ["--set", override]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


def test_torchrun_on_two_cpu_processes_writes_one_run(tmp_path):
    """DDP with gloo: rank 0 makes the named run directory and the other rank opens it (each rank
    used to create it, a race that failed with "exists" when one was later); the launch line is
    printed once, by rank 0."""
    done = _torchrun(
        tmp_path,
        "ddp",
        "train.device=cpu",
        "model.backend=torch",
        "train.cpu_threads=1",
        "train.max_steps=20",
        "train.eval_every=20",
        "train.soft_readout_steps=0",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["ddp"]
    assert _launch_lines(done.stdout.splitlines()) == [
        "training step: eager launches (train.cuda_graph = auto: training runs on cpu; CUDA graphs need a CUDA device)"
    ]
    valid = [r for r in RunDir(tmp_path / "ddp").read_metrics() if r.get("split") == "valid"]
    assert [r["step"] for r in valid] == [20] and 0 <= valid[0]["recall@50"] <= 1


# ------------------------------------------------------------------------------------ GPU
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _batches(n: int = 8):
    g = torch.Generator(device=CUDA)
    g.manual_seed(3)
    return [
        (
            torch.randint(1, 500, (256, 50), device=CUDA, generator=g),
            torch.randint(1, 51, (256,), device=CUDA, generator=g),
            torch.randint(1, 500, (256,), device=CUDA, generator=g),
        )
        for _ in range(n)
    ]


def _steps(overrides, batches, patch=None):
    """Losses of ``batches`` through a fresh seeded model and TrainStep, the step, its log lines."""
    from recsys.models import build_model

    cfg = load_config(
        None, ["model.dim=64", "train.batch_size=256", "data.max_len=50", "train.predict_next=1", *overrides]
    )
    cfg = resolved(cfg, 500, device=CUDA.type)
    torch.manual_seed(0)
    gen = torch.Generator(device=CUDA)
    gen.manual_seed(0)
    counts = torch.arange(500, 0, -1)
    counts[0] = 0
    model = build_model(cfg.model, 500, 50, item_counts=counts).to(CUDA)
    if patch is not None:
        patch(model)
    lines: list[str] = []
    step = TrainStep(model, cfg, CUDA, counts.to(CUDA), gen, log=lines.append)
    losses = [step(*b, step=i)[0].loss.item() for i, b in enumerate(batches)]
    return losses, step, lines


def _syncing(model):
    """Make the model read a number back to the host every call: fine eagerly, illegal in a capture."""
    forward = model.forward

    def syncing_forward(seq, lengths, **kwargs):
        int(lengths.max())
        return forward(seq, lengths, **kwargs)

    model.forward = syncing_forward


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["auto", "true"])
@pytest.mark.parametrize(
    "switches",
    [
        [],
        [
            "train.soft_readout_steps=4",
            "train.hard_negatives=0.5",
            "train.attention_reg=1",
            "train.negative_readout=max",
        ],
        ["train.item_updates=sparse", "train.negative_readout=max"],
    ],
    ids=["plain", "soft-then-argmax", "row-sparse"],
)
def test_the_captured_step_follows_the_eager_step(mode, switches):
    batches = _batches()
    eager, eager_step, eager_lines = _steps(switches + ["train.cuda_graph=false"], batches)
    graphed, step, lines = _steps(switches + [f"train.cuda_graph={mode}"], batches)
    assert eager_step.graph is None and step.graph is not None and step.use_graph
    # one line, also when the soft readout's end re-captures the step
    assert _launch_lines(lines) == [f"training step: one CUDA graph per step (train.cuda_graph = {mode})"]
    assert _launch_lines(eager_lines) == ["training step: eager launches (train.cuda_graph = false)"]
    assert graphed == pytest.approx(eager, rel=1e-2)  # bf16 autocast
    for a, b in zip(eager_step.model.parameters(), step.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)
    # the weight average is updated inside the graph, and the warm-up's updates were undone
    assert step.average is not None and eager_step.average is not None
    for a, b in zip(eager_step.average.weights, step.average.weights):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)
    if step.rows is not None and eager_step.rows is not None:  # the item rows' state, stepped in the graph
        assert int(step.rows.steps) == int(eager_step.rows.steps) == len(batches)
        for a, b in [(eager_step.rows.exp_avg_sq, step.rows.exp_avg_sq), (eager_step.rows.average, step.rows.average)]:
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)


@pytest.mark.gpu
@needs_gpu
def test_a_step_that_fails_to_capture_falls_back_to_eager_with_one_line():
    batches = _batches(4)
    eager, _, _ = _steps(["train.cuda_graph=false"], batches, patch=_syncing)
    losses, step, lines = _steps([], batches, patch=_syncing)
    assert not step.use_graph and step.graph is None
    assert torch.cuda.current_stream() == torch.cuda.default_stream()  # the failed capture's stream was left
    (line,) = _launch_lines(lines)
    assert line.startswith("training step: eager launches (train.cuda_graph = auto: capturing the step failed: ")
    assert losses == pytest.approx(eager, rel=1e-3)  # the warm-up before the capture was undone
    # the device's random generator left capture mode: the eager steps' dropout (and any random op) works
    assert 0 < torch.nn.functional.dropout(torch.ones(1000, device=CUDA), 0.5).count_nonzero().item() < 1000
    with pytest.raises(ValueError, match="train.cuda_graph = true: capturing the step failed"):
        _steps(["train.cuda_graph=true"], batches, patch=_syncing)
    torch.randn(4, device=CUDA)


@pytest.mark.gpu
@needs_gpu
def test_train_with_no_flags_captures_on_cuda(tmp_path):
    lines: list[str] = []
    result = train(load_config(None, TINY + [f"output_dir={tmp_path}", "name=gpu"]), log=lines.append)
    assert result.cuda_graph
    assert _launch_lines(lines) == ["training step: one CUDA graph per step (train.cuda_graph = auto)"]
    assert 0 < result.test_metrics["recall@50"] <= 1


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("objective", [(), ("train.predict_at=all", "train.predict_next=2")], ids=["last", "masked"])
def test_two_gpus_capture_per_rank_and_follow_the_eager_run(tmp_path, objective):
    """torchrun with 2 GPUs: every rank captures its step (re-captured when the soft readout ends),
    with the masked objectives' all-reduce of the valid positions too; the losses follow the same
    two-GPU run with eager launches, and validation gives a recall."""
    runs, launch = {}, {}
    for name, mode in (("graph", "auto"), ("eager", "false")):
        done = _torchrun(tmp_path, name, f"train.cuda_graph={mode}", *objective)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[name] = RunDir(tmp_path / name).read_metrics()
        launch[name] = _launch_lines(done.stdout.splitlines())
        assert "Recall@50" in done.stdout
    assert launch == {
        "graph": ["training step: one CUDA graph per step (train.cuda_graph = auto)"],
        "eager": ["training step: eager launches (train.cuda_graph = false)"],
    }  # rank 0 only
    losses = {name: [r["loss"] for r in rows if "loss" in r] for name, rows in runs.items()}
    assert len(losses["graph"]) == len(losses["eager"]) == 6
    assert losses["graph"] == pytest.approx(losses["eager"], rel=2e-2)
    valid = [r for r in runs["graph"] if r.get("split") == "valid"]
    assert [r["step"] for r in valid] == [30, 60] and all(0 < r["recall@50"] <= 1 for r in valid)
    test = json.loads((tmp_path / "graph" / "test_metrics.json").read_text())
    assert 0 < test["recall@50"] <= 1
