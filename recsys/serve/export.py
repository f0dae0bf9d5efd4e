"""Export a trained run for serving stacks (ONNX Runtime, Triton Inference Server, LibTorch).

An export folder holds everything a server needs besides recsys::

    interests.onnx | interests.pt   the network: seq [B, L] int64 (internal ids, right-padded
                                    with 0, oldest first), lengths [B] int64 -> interests
                                    [B, K, d] float32; B and L are dynamic (1 <= L <= max_len)
    item_embeddings.npy             [num_items, d] float32: row i = internal item id i (row 0 =
                                    padding, never to be retrieved)
    items.csv                       the id map: columns id (internal, 1..num_items-1), item (raw id),
                                    new (true: an item without training clicks, scored by its features)
    export.json                     what it is: format, model, K, d, max_len, num_items, inputs,
                                    outputs, how interests are scored against items, and the
                                    share of each list the run keeps for new items (new_item_share)

The folder is published whole (:func:`recsys.io.files.atomic_folder`: written beside it, then
renamed into place), so an interrupted export or a full disk leaves the earlier export, or
nothing; it replaces an earlier export in the same folder, and refuses a folder holding anything
else. The network is traced through the PyTorch twins (``model.backend = "torch"``), so it needs
neither Triton nor a GPU. ONNX uses opset 17 and needs ``pip install 'multi-interest-recsys[export]'``;
TorchScript (``torch.jit.load``) needs only torch.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from recsys.extras import install_hint
from recsys.io.files import atomic_folder, save_npy
from recsys.items import new_items
from recsys.models import InterestModel
from recsys.run import LoadedRun, build_experiment

__all__ = ["FORMATS", "export_run"]

FORMATS = ("onnx", "torchscript")
NETWORK_FILE = {"onnx": "interests.onnx", "torchscript": "interests.pt"}
OPSET = 17


class _InterestNet(nn.Module):
    """``(seq [B, L], lengths [B]) -> interests [B, K, d]`` float32: the exported graph."""

    def __init__(self, model: InterestModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, seq: Tensor, lengths: Tensor) -> Tensor:
        return self.model.interests(seq, lengths).float()


def _torch_twin(run: LoadedRun) -> _InterestNet:
    """The run's model rebuilt with ``backend = "torch"`` and its weights, in eval mode on the CPU."""
    cfg = copy.deepcopy(run.cfg)
    cfg.model.backend = "torch"
    model = build_experiment(cfg, dataset=run.dataset).model
    model.load_state_dict(run.model.state_dict())
    return _InterestNet(model.cpu().eval())


def _example(max_len: int) -> tuple[Tensor, Tensor]:
    """A traced example: batch 2, full length (the graph keeps both dimensions dynamic)."""
    seq = torch.ones(2, max_len, dtype=torch.long)
    return seq, torch.tensor([max_len, 1], dtype=torch.long)


def _write_network(net: _InterestNet, path: Path, fmt: str, max_len: int) -> None:
    example = _example(max_len)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and exporter deprecation notes, not problems
        if fmt == "onnx":
            torch.onnx.export(
                net,
                example,
                path,
                input_names=["seq", "lengths"],
                output_names=["interests"],
                dynamic_axes={"seq": {0: "batch", 1: "length"}, "lengths": {0: "batch"}, "interests": {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,
            )
        else:
            torch.jit.save(torch.jit.trace(net, example, check_trace=False), path)


def _check_replaceable(out: Path) -> None:
    """Refuse ``out`` when it holds anything but an earlier export: publishing the new one
    replaces the whole folder."""
    if not out.exists():
        return
    ours = {*NETWORK_FILE.values(), "item_embeddings.npy", "items.csv", "export.json"}
    if not out.is_dir() or any(p.name not in ours for p in out.iterdir()):
        raise FileExistsError(
            f"--out: {out} holds other files than an export; an export replaces its whole folder, so give a new "
            "folder (or an earlier export's)"
        )


def export_run(run: LoadedRun, out: str | Path, fmt: str = "onnx") -> Path:
    """Write ``run``'s network (in ``fmt``: ``onnx`` or ``torchscript``), item embedding table
    and id map to folder ``out``, published whole (a new folder, or one holding an earlier export,
    which it replaces; ``FileExistsError`` for a folder holding other files); returns ``out``."""
    if fmt not in FORMATS:
        raise ValueError(f"format: {fmt!r} is not one of {list(FORMATS)}")
    if not run.model.trainable:
        raise ValueError(f"model.name: {run.cfg.model.name!r} has no network to export (its scores are click counts)")
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401  (the exporter needs it)
        except ImportError:  # before the folder is made: a failed export leaves nothing behind
            raise ImportError(f"export --format onnx needs onnx: {install_hint('export')}") from None
    out = Path(out)
    _check_replaceable(out)
    net = _torch_twin(run)
    max_len = run.cfg.data.max_len
    table = run.item_table()  # [num_items, d]
    fresh = new_items(run.model)
    ids = pd.DataFrame({"id": np.arange(1, run.dataset.catalogue_size), "item": run.dataset.catalogue_raw[1:]})
    ids["new"] = False if fresh is None else fresh[1:].cpu().numpy()
    meta = {
        "format": fmt,
        "network": NETWORK_FILE[fmt],
        "model": run.cfg.model.name,
        "num_interests": int(getattr(run.model, "num_interests", 1)),
        "dim": int(table.shape[1]),
        "max_len": max_len,
        "num_items": int(run.dataset.catalogue_size),
        "inputs": {
            "seq": "[B, L] int64 internal item ids, oldest first, right-padded with 0, 1 <= L <= max_len",
            "lengths": "[B] int64 valid clicks per row (>= 1)",
        },
        "outputs": {"interests": "[B, K, d] float32"},
        "scoring": "score(item i) = max over the K interests of <interest, item_embeddings[i]>; skip row 0; "
        "in a top n, where fewer than floor(new_item_share * n) items of items.csv's new = true rank there, the best "
        "of them take the places of the lowest others (recsys.retrieval.new_items)",
        "new_item_share": run.cfg.retrieval.new_item_share,
        "source_run": str(run.path),
        **({"opset": OPSET} if fmt == "onnx" else {}),
    }
    with atomic_folder(out.resolve()) as tmp:  # resolved: "." has no name to publish under
        _write_network(net, tmp / NETWORK_FILE[fmt], fmt, max_len)
        save_npy(tmp / "item_embeddings.npy", table)
        ids.to_csv(tmp / "items.csv", index=False)
        (tmp / "export.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out
