"""Training throughput of ComiRec-SA: recsys's path against a faithful eager PyTorch port.

Two parts, one run:

1. ``grid``: samples/s of recsys's training step (``recsys.train.step.TrainStep``: vectorised
   batches, device-side negatives, fused kernels on CUDA, bf16 autocast, fused Adam, no host
   sync) for comirec_sa at batch 128/1024 x L 20/50, d = 64, K = 4.
2. ``compare``: on one dataset (default taobao), batch 1024, L = 50, d = 64, K = 4, shared
   negatives 10 x batch, the same number of steps for
   (a) recsys's path and
   (b) an eager ComiRec-SA training step in the style of the public PyTorch ports: a Python
       per-sample batch builder (ComiRec's DataIterator), einsum extraction, argmax readout,
       log-uniform negatives drawn with numpy and copied per step, sampled softmax in fp32,
       ``torch.optim.Adam`` and ``loss.item()`` every step.
   Both report samples/s end to end and the step alone (batches built beforehand), and the
   validation Recall@50 after the same number of steps (same evaluator, exact search).

Usage::

    python benchmarks/train.py [--data ../shared/data/taobao/sequences.txt] [--steps 300]
"""

from __future__ import annotations

import argparse
import copy
import math
import platform
import time

import numpy as np
import torch
from torch import Tensor, nn

from recsys.config import Config, load_config, with_values
from recsys.data.batches import TrainSampler
from recsys.device import to_device
from recsys.evaluate.evaluator import evaluate
from recsys.models import InterestModel
from recsys.run import Experiment, build_experiment
from recsys.train.step import TrainStep


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- baseline (b)
class EagerComiRecSA(InterestModel):
    """ComiRec-SA as the public PyTorch ports write it (einsum, explicit masks, fp32)."""

    def __init__(self, num_items: int, dim: int, num_interests: int, max_len: int):
        super().__init__()
        self.num_interests = num_interests
        self.embeddings = nn.Embedding(num_items, dim, padding_idx=0)
        self.position = nn.Parameter(torch.randn(1, max_len, dim) / math.sqrt(dim))
        self.w1 = nn.Linear(dim, 4 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, num_interests, bias=False)
        nn.init.normal_(self.embeddings.weight, std=1.0 / math.sqrt(dim))

    def interests(self, seq: Tensor, lengths: Tensor) -> Tensor:
        h = self.embeddings(seq)  # [B, L, d]
        mask = (torch.arange(seq.shape[1], device=seq.device)[None] < lengths[:, None]).float()  # [B, L]
        a = self.w2(torch.tanh(self.w1(h + self.position[:, : seq.shape[1]])))  # [B, L, K]
        a = torch.einsum("blk->bkl", a)
        a = a.masked_fill(mask[:, None, :] == 0, -1e9)
        a = torch.softmax(a, dim=-1)  # [B, K, L]
        return torch.einsum("bkl,bld->bkd", a, h)  # [B, K, d]

    def item_embeddings(self) -> Tensor:
        return self.embeddings.weight


def python_batch(
    indptr: np.ndarray, items: np.ndarray, users: np.ndarray, batch: int, max_len: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ComiRec's DataIterator: one Python iteration per sample."""
    seqs, lens, targets = [], [], []
    for _ in range(batch):
        u = users[rng.integers(len(users))]
        clicks = items[indptr[u] : indptr[u + 1]].tolist()
        k = int(rng.integers(4, len(clicks)))
        hist = clicks[max(0, k - max_len) : k]
        targets.append(clicks[k])
        lens.append(len(hist))
        seqs.append(hist + [0] * (max_len - len(hist)))
    return np.array(seqs, dtype=np.int64), np.array(lens, dtype=np.int64), np.array(targets, dtype=np.int64)


class EagerStep:
    """(b): the port's training step (fp32, numpy negatives, Adam, ``loss.item()`` per step)."""

    def __init__(self, model: EagerComiRecSA, num_items: int, num_negatives: int, lr: float, device: torch.device):
        self.model, self.num_items, self.s, self.device = model, num_items, num_negatives, device
        self.opt = torch.optim.Adam(model.parameters(), lr=lr)
        self.rng = np.random.default_rng(0)
        self.log_range = math.log(num_items)  # ids 1..num_items-1, log-uniform as TensorFlow's sampler

    def _log_q(self, ids: Tensor) -> Tensor:
        ids = ids.double()
        p = (torch.log(ids + 1) - torch.log(ids)) / self.log_range
        return torch.log(p * self.s).float()

    def __call__(self, seq: Tensor, lengths: Tensor, targets: Tensor) -> float:
        neg = np.floor(np.exp(self.rng.random(self.s) * self.log_range)).astype(np.int64).clip(1, self.num_items - 1)
        neg = torch.from_numpy(neg).to(self.device)
        interests = self.model.interests(seq, lengths)
        emb = self.model.item_embeddings()
        tgt = emb[targets]
        best = torch.argmax(torch.einsum("bkd,bd->bk", interests, tgt), dim=1)
        user = interests[torch.arange(len(targets), device=self.device), best]
        pos_logit = (user * tgt).sum(-1, keepdim=True) - self._log_q(targets)[:, None]
        neg_logit = user @ emb[neg].t() - self._log_q(neg)[None]
        neg_logit = neg_logit.masked_fill(neg[None] == targets[:, None], -1e9)
        logits = torch.cat([pos_logit, neg_logit], dim=1)
        loss = nn.functional.cross_entropy(logits, torch.zeros(len(targets), dtype=torch.long, device=self.device))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


# ----------------------------------------------------------------------------- timing
def _samples_per_s(step, batch, steps: int, batch_size: int, device: torch.device) -> float:
    """Run 5 warm-up steps (compilation, autotuning, graph capture), then time ``steps``."""
    for i in range(5):
        step(*batch(i))
    _sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        step(*batch(i))
    _sync(device)
    return steps * batch_size / (time.perf_counter() - t0)


def _experiment(cfg: Config) -> Experiment:
    """Data, split, counts and the model, initialised under seed 0 (each path trains a copy)."""
    torch.manual_seed(0)
    return build_experiment(cfg)


def _time_ours(
    exp: Experiment, steps: int, device: torch.device, prebuilt: list | None, cuda_graph: bool = False
) -> tuple[float, InterestModel]:
    cfg, split = with_values(exp.cfg, {"train.cuda_graph": cuda_graph}), exp.split
    model = copy.deepcopy(exp.model).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(1)
    step = TrainStep(model, cfg, device, exp.item_counts.to(device), gen)
    sampler = TrainSampler(*split.train_csr(), cfg.data.max_len, seed=0, min_target=4)

    def batch(i: int):
        return prebuilt[i % len(prebuilt)] if prebuilt else to_device(sampler.sample(cfg.train.batch_size), device)

    return _samples_per_s(step, batch, steps, cfg.train.batch_size, device), model


def _time_eager(
    cfg: Config, split, num_items: int, steps: int, device: torch.device, prebuilt: list | None
) -> tuple[float, InterestModel]:
    torch.manual_seed(0)
    model = EagerComiRecSA(num_items, cfg.model.dim, cfg.model.num_interests, cfg.data.max_len).to(device)
    step = EagerStep(model, num_items, 10 * cfg.train.batch_size, cfg.train.lr, device)
    rng = np.random.default_rng(0)
    train_indptr, train_items = split.train_csr()
    users = np.flatnonzero(np.diff(train_indptr) > 4)

    def batch(i: int):
        if prebuilt:
            return prebuilt[i % len(prebuilt)]
        arrays = python_batch(train_indptr, train_items, users, cfg.train.batch_size, cfg.data.max_len, rng)
        return tuple(torch.from_numpy(a).to(device) for a in arrays)

    return _samples_per_s(step, batch, steps, cfg.train.batch_size, device), model


def grid(device: torch.device, steps: int, data: str | None) -> list[tuple]:
    rows = []
    for batch in (128, 1024):
        for max_len in (20, 50):
            exp = _experiment(_config(data, batch, max_len))
            sps, _ = _time_ours(exp, steps, device, None)
            line = f"grid  batch {batch:5d}  L {max_len:3d}  {sps:12,.0f} samples/s"
            if device.type == "cuda":
                graphed, _ = _time_ours(exp, steps, device, None, cuda_graph=True)
                line += f"   with train.cuda_graph {graphed:12,.0f} samples/s"
            rows.append((batch, max_len, sps))
            print(line, flush=True)
    return rows


def _config(data: str | None, batch: int, max_len: int) -> Config:
    overrides = [
        f"train.batch_size={batch}",
        f"data.max_len={max_len}",
        "model.dim=64",
        "model.num_interests=4",
        "train.lr=0.001",
    ]
    if data:
        overrides += [f"data.source={data}", "data.format=auto"]
    return load_config(None, overrides)


def compare(device: torch.device, steps: int, data: str | None) -> None:
    exp = _experiment(_config(data, 1024, 50))
    cfg, split, num_items = exp.cfg, exp.split, exp.dataset.num_items
    sampler = TrainSampler(*split.train_csr(), 50, seed=5, min_target=4)
    prebuilt = [to_device(sampler.sample(1024), device) for _ in range(20)]
    results = {}
    paths = [("ours", lambda pb: _time_ours(exp, steps, device, pb))]
    if device.type == "cuda":
        paths.insert(0, ("ours+graph", lambda pb: _time_ours(exp, steps, device, pb, True)))
    paths.append(("eager port", lambda pb: _time_eager(cfg, split, num_items, steps, device, pb)))
    for name, fn in paths:
        step_only, _ = fn(prebuilt)
        end_to_end, model = fn(None)
        model.eval()
        metrics = evaluate(model, split.valid, topn=(50,), backend="torch" if device.type == "cuda" else "auto")
        results[name] = (end_to_end, step_only, metrics["recall@50"])
        print(
            f"compare {name:10s} end-to-end {end_to_end:12,.0f} samples/s  step only {step_only:12,.0f}  "
            f"valid recall@50 after {steps + 5} steps {metrics['recall@50']:.4f}",
            flush=True,
        )
    base = results["eager port"]
    print("\n| path | samples/s end to end | samples/s step only | valid Recall@50 | ratio to port (e2e / step) |")
    print("|---|---:|---:|---:|---:|")
    for name, (e2e, so, rec) in results.items():
        print(f"| {name} | {e2e:,.0f} | {so:,.0f} | {rec:.4f} | {e2e / base[0]:.2f}x / {so / base[1]:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data",
        default="../shared/data/taobao/sequences.txt",
        help="dataset for both parts ('synthetic' for the built-in data)",
    )
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--part", choices=("grid", "compare", "both"), default="both")
    args = ap.parse_args()
    data = None if args.data == "synthetic" else args.data
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu"
    print(f"# benchmarks/train.py on {device} ({name}), torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    if args.part in ("grid", "both"):
        grid(device, args.steps, data)
    if args.part in ("compare", "both"):
        compare(device, args.steps, data)


if __name__ == "__main__":
    main()
