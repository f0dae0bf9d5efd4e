"""Pictures of runs (matplotlib, the ``plot`` extra).

:func:`draw_interests` writes one row per user: a heat map of each interest's attention over the
user's input clicks (models whose interests are attention-weighted sums of the clicks), and
each interest's top items with their categories where the data has them.
:func:`draw_curves` draws the training loss and validation curves of one or several runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recsys.device import model_device
from recsys.evaluate.diagnostics import attention_weights, effective_clicks
from recsys.extras import install_hint
from recsys.io import atomic_save

if TYPE_CHECKING:
    from recsys.data.prepare import Dataset
    from recsys.data.split import EvalSet
    from recsys.models.base import InterestModel


def require_matplotlib() -> None:
    """Raise the ``ImportError`` naming the ``plot`` extra when matplotlib is missing (call it
    before any work whose point is a picture)."""
    _pyplot()


def _pyplot() -> ModuleType:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"drawing needs matplotlib: {install_hint('plot')}") from None
    return plt


def _label(ds: Dataset, item: int, width: int = 12) -> str:
    """``item`` (internal id) as its raw id, with its category where the data has categories."""
    name = str(ds.item_raw[item])[:width]
    cat = int(ds.item_category[item])
    return f"{name} ({str(ds.category_raw[cat])[:width]})" if cat else name


def draw_interests(
    model: InterestModel,
    ds: Dataset,
    eval_set: EvalSet,
    path: str | Path,
    *,
    users: int = 4,
    top: int = 5,
    min_clicks: int = 4,
    title: str = "",
) -> Path:
    """Draw ``users`` evaluation users (the first with at least ``min_clicks`` input clicks) into PNG ``path``.

    Left: the attention ``[K, n]`` of each interest over the user's ``n`` input clicks (labelled
    by category, or raw id without categories; oldest left), with each interest's effective
    number of clicks. Right: each interest's ``top`` items by inner product, with categories.
    """
    if users <= 0:
        raise ValueError(f"users: must be > 0, got {users}")
    plt = _pyplot()
    rows = np.flatnonzero(np.asarray(eval_set.lengths) >= min_clicks)[:users]
    if len(rows) == 0:
        raise ValueError(f"no evaluation user has {min_clicks} or more input clicks to draw")
    best, attention = _interest_view(model, eval_set, rows, top)
    k = best.shape[1]
    fig, axes = plt.subplots(
        len(rows),
        2,
        figsize=(15, 1.2 + 0.45 * k * len(rows) + 0.8 * len(rows)),
        gridspec_kw={"width_ratios": [1.3, 1]},
        squeeze=False,
    )
    try:
        has_categories = bool(np.any(np.asarray(ds.item_category) != 0))
        for r, row in enumerate(rows):
            heat, text = axes[r]
            _draw_attention(heat, ds, eval_set, row, attention[r], has_categories)
            _draw_top_items(text, ds, best[r], top)
        if title:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        path = _save(fig, path)
    finally:
        plt.close(fig)  # also when drawing or saving fails (pyplot keeps every open figure)
    return path


def _interest_view(
    model: InterestModel, eval_set: EvalSet, rows: np.ndarray, top: int
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray] | None]]:
    """What :func:`draw_interests` shows of the evaluation users ``rows [U]``: each interest's ``top``
    items by inner product, ``[U, K, top]`` item ids, and per user, for a model whose interests
    attend over the clicks, the attention ``[L, K]`` with each interest's effective clicks ``[K]``
    (else None). Leaves the model in eval mode."""
    device = model_device(model)
    model.eval()
    with torch.no_grad():
        seq = torch.as_tensor(eval_set.inputs[rows], device=device)
        lengths = torch.as_tensor(eval_set.lengths[rows], device=device)
        interests, scores = model.interests_with_attention(seq, lengths)  # [U, K, d], [U, L, K]
        item_emb = model.item_embeddings().float()
        best = (interests.float() @ item_emb[1:].T).topk(top, dim=2).indices.cpu().numpy() + 1  # [U, K, top]
        if scores is None:
            return best, [None] * len(rows)
        weights = attention_weights(scores, lengths)  # [U, L, K]
        return best, list(zip(weights.cpu().numpy(), effective_clicks(weights).cpu().numpy()))  # eff: [U, K]


def _draw_attention(
    heat: Any,
    ds: Dataset,
    eval_set: EvalSet,
    row: int,
    attention: tuple[np.ndarray, np.ndarray] | None,
    has_categories: bool,
) -> None:
    """Draw into axes ``heat`` the attention ``[K, n]`` of evaluation user ``row``'s interests over its
    ``n`` input clicks (oldest left), from its ``attention``: weights ``[L, K]`` and effective clicks
    ``[K]``, or None for a model without attention over clicks (a note instead). The clicks are
    labelled by category, or by raw id where the data has no categories."""
    n = int(eval_set.lengths[row])
    clicks = np.asarray(eval_set.inputs[row][:n])
    user = ds.user_raw[eval_set.users[row]]
    if attention is not None:
        weights, eff = attention
        heat.imshow(weights[:n, :].T, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        heat.set_yticks(range(len(eff)), [f"{i} ({e:.1f})" for i, e in enumerate(eff)], fontsize=7)
        heat.set_ylabel("interest (eff. clicks)", fontsize=7)
    else:
        heat.text(0.5, 0.5, "no attention over clicks in this model", ha="center", va="center")
        heat.set_yticks([])
    labels = [str(ds.category_raw[ds.item_category[i]]) if has_categories else str(ds.item_raw[i]) for i in clicks]
    heat.set_xticks(range(n), [lbl[:10] for lbl in labels], rotation=90, fontsize=6)
    heat.set_title(f"user {user}: {n} input clicks (oldest left)", fontsize=8, loc="left")


def _draw_top_items(text: Any, ds: Dataset, best: np.ndarray, top: int) -> None:
    """Write into axes ``text`` each interest's top items ``best [K, top]`` (raw ids, with categories)."""
    text.axis("off")
    lines = [f"{i}: " + ", ".join(_label(ds, int(item)) for item in best[i]) for i in range(len(best))]
    text.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", fontsize=6.5, family="monospace", wrap=True)
    text.set_title(f"top {top} items per interest", fontsize=8, loc="left")


def _save(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` whole or not at all (:func:`recsys.io.atomic_save`), in the format
    its suffix names (``.png`` by default), as ``fig.savefig(path)`` would."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or None  # the temporary file's suffix names no format
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format=fmt))
    return path


def curves(objective: str = "recall@50") -> tuple[tuple[str, str, str], ...]:
    """The panels ``(title, metrics key, rows it is read from: training log rows or validation
    rows)``: the training loss, the validation metric ``objective`` (``eval.objective``, e.g.
    ``"ndcg@10"``) and the interests' effective clicks."""
    return (
        ("training loss", "loss", "train"),
        (f"valid {objective}", objective, "valid"),
        ("valid effective clicks (mean over interests)", "mi_eff_clicks", "valid"),
    )


def draw_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, objective: str = "recall@50"
) -> Path:
    """Draw each run's metrics records (``{label: records}``, as ``RunDir.read_metrics`` returns
    them) into PNG ``path``: one panel per curve of :func:`curves` that some run has, one line
    per run, against the training step. A run without any of them raises ``ValueError``."""
    panels_wanted = curves(objective)

    def points(records: Sequence[Mapping[str, Any]], key: str, split: str) -> tuple[list[int], list[float]]:
        rows = [r for r in records if r.get("split", "train") == split and key in r]
        return [int(r["step"]) for r in rows], [float(r[key]) for r in rows]

    for label, records in runs.items():
        if not any(points(records, key, split)[0] for _, key, split in panels_wanted):
            raise ValueError(f"{label}: no training loss or validation metrics to draw (has it trained a step?)")
    panels = [c for c in panels_wanted if any(points(records, c[1], c[2])[0] for records in runs.values())]
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    try:
        for ax, (title, key, split) in zip(axes[0], panels):
            for label, records in runs.items():
                steps, values = points(records, key, split)
                if steps:
                    ax.plot(steps, values, marker="o" if split == "valid" else None, markersize=3, label=label)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = _save(fig, path)
    finally:
        plt.close(fig)
    return path
