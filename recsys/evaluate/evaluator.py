"""Evaluation over an :class:`~recsys.data.split.EvalSet` (any protocol: ComiRec's user or time
split, or leave-one-out, :mod:`recsys.data.split`), batched end to end.

For each batch of evaluation users: the model turns their input clicks into ``K`` interests,
one index search returns every interest's hits, they are merged to the top ``max(topn)``
items per user (max score, or ComiRec's greedy diversity pick with ``diversity_lambda > 0``),
and the metrics of :mod:`recsys.evaluate.metrics` are taken at each cutoff, over all users at
once. The index is built once, from ``model.item_embeddings()``. With exact search on the GPU
(the torch backend: ``Flat`` over CUDA embeddings) every batch stays on the device and nothing
waits for the GPU until the recommended ids are read back, once. Smaller cutoffs use the prefix of the
``max(topn)`` list (both merges are prefix-consistent; the diversity pick draws its
candidates from each interest's top ``max(topn)``, as ComiRec does with ``topN = 50``).

Every item is ranked (full ranking, no sampled candidates) and no ``[users, items]`` score matrix
is ever held: the search takes one batch of users at a time, and the torch search splits a batch
further into blocks of bounded size (:meth:`~recsys.retrieval.index.Retriever.top_items`).
``exclude_history`` removes each user's whole input (every click before the truth,
:meth:`EvalSet.history <recsys.data.split.EvalSet.history>`) from the candidates.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from recsys.config import Config, RetrievalConfig, require_resolved
from recsys.data.batches import pad_sequences
from recsys.device import model_device, to_device
from recsys.evaluate.metrics import compute_metrics
from recsys.items import new_items
from recsys.progress import progress_bar
from recsys.retrieval.index import Retriever

if TYPE_CHECKING:
    from recsys.data.split import EvalSet
    from recsys.models.base import InterestModel

__all__ = ["TABLE_METRICS", "evaluate", "evaluate_with_config", "format_table"]

TABLE_METRICS = ("recall", "ndcg", "hitrate", "mrr")  # format_table's columns per cutoff
_TABLE_NAMES = {
    "recall": "Recall",
    "ndcg": "NDCG",
    "hitrate": "HitRate",
    "mrr": "MRR",
    "diversity": "Diversity",
    "coverage": "Coverage",
}


def evaluate(
    model: InterestModel,
    eval_set: EvalSet,
    *,
    topn: Sequence[int] = (20, 50),
    retrieval: RetrievalConfig | None = None,
    backend: str | None = None,
    exclude_history: bool = False,
    comirec_ndcg: bool = False,
    item_category: np.ndarray | None = None,
    diversity_lambda: float = 0.0,
    batch_size: int = 2048,
    progress: bool = False,
    across_ranks: bool = False,
) -> dict[str, float]:
    """Recall / NDCG / HitRate / MRR (and diversity, coverage) at each ``n`` in ``topn``.

    Args:
        model: an :class:`InterestModel`; put in eval mode for the call (its mode is restored).
        eval_set: input sequences ``inputs [U, L]`` / ``lengths [U]`` and truth CSR.
        topn: cutoffs; the search retrieves ``max(topn)`` items per user.
        retrieval: the item index to search: factory, backend, ``nprobe``, ``ef_search``,
            ``ef_construction`` (a run config's ``retrieval`` section; see :class:`Retriever`);
            default ``RetrievalConfig()``, exact search.
        backend: ``"auto" | "faiss" | "torch"``, overriding ``retrieval.backend`` (e.g.
            ``"torch"``: exact search where the model lives).
        exclude_history: drop each user's input clicks (all of them, not only the last
            ``max_len``) from the recommendations (ComiRec does not; leave-one-out does).
        comirec_ndcg: ComiRec's NDCG variant (see :mod:`recsys.evaluate.metrics`).
        item_category: ``[num_items]`` categories: enables ``diversity@n`` (unless every
            item is 0 = unknown) and the diversity-controlled pick.
        diversity_lambda: ``> 0`` uses ComiRec's greedy aggregation with this λ.
        batch_size: users per model call and search (on the model's device).
        progress: a bar over the users (on a terminal).
        across_ranks: every rank of the process group calls this with the same model and users
            (data-parallel training): each searches a contiguous share of the users, the top
            lists are gathered in user order, and every rank returns the metrics one process
            computes from them. No process group: one process scores every user.

    Returns:
        ``{"recall@20": ..., "ndcg@20": ..., "hitrate@20": ..., "mrr@20": ..., "diversity@20": ...,
        "coverage@20": ..., ..., "users": U}`` as floats, each averaged over the ``U`` users.
    """
    topn = tuple(int(n) for n in topn)
    _check_arguments(eval_set, topn, batch_size, diversity_lambda, item_category)
    search = _Search(max(topn), batch_size, exclude_history, diversity_lambda)
    with eval_mode(model), torch.no_grad():
        emb, fresh = model.item_embeddings(), new_items(model)
        retriever = Retriever(emb, _index_settings(retrieval, backend), item_category=item_category, new_items=fresh)
        ids = _top_lists(model, retriever, eval_set, search, progress=progress, across_ranks=across_ranks)
    return compute_metrics(
        _gathered(ids) if across_ranks else ids,
        eval_set.truth_indptr,
        eval_set.truth_items,
        topn=topn,
        comirec_ndcg=comirec_ndcg,
        item_category=item_category,
        num_items=retriever.num_items,
    )


def _check_arguments(
    eval_set: EvalSet, topn: tuple[int, ...], batch_size: int, diversity_lambda: float, item_category: np.ndarray | None
) -> None:
    """Raise ``ValueError`` naming the setting (or the ``eval_set`` arrays) :func:`evaluate` cannot
    work with, before the model or the index costs anything."""
    if not topn or min(topn) <= 0:
        raise ValueError(f"eval.topn: need positive cutoffs, got {topn}")
    if batch_size <= 0:
        raise ValueError(f"eval.batch_size: must be > 0, got {batch_size}")
    if diversity_lambda < 0:
        raise ValueError(f"eval.diversity_lambda: must be >= 0, got {diversity_lambda}")
    if diversity_lambda > 0 and item_category is None:
        raise ValueError("eval.diversity_lambda > 0 needs item categories (item_category)")
    num_users = len(eval_set.lengths)
    if num_users == 0:
        raise ValueError("eval_set: has no users")
    if len(eval_set.inputs) != num_users or len(eval_set.truth_indptr) != num_users + 1:
        raise ValueError(
            f"eval_set: inputs has {len(eval_set.inputs)} rows and truth_indptr {len(eval_set.truth_indptr)} "
            f"entries for {num_users} users (expected {num_users} and {num_users + 1})"
        )


def _index_settings(retrieval: RetrievalConfig | None, backend: str | None) -> RetrievalConfig:
    """The settings of the item index: ``retrieval`` (default: exact search, ``RetrievalConfig()``)
    with ``backend`` in place of its own where one is given."""
    settings = retrieval if retrieval is not None else RetrievalConfig()
    return settings if backend is None else dataclasses.replace(settings, backend=backend)


@dataclasses.dataclass(frozen=True)
class _Search:
    """How :func:`evaluate` searches each batch of users: the ``n`` best ids per user,
    ``batch_size`` users per model call and search, with or without each user's input clicks
    (``exclude_history``), merged by max score or by the diversity pick (``diversity_lambda > 0``)."""

    n: int
    batch_size: int
    exclude_history: bool
    diversity_lambda: float


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode (no dropout) for the block, and back in the mode it had after it, also
    when the block raises: an evaluation in the middle of training leaves the model training."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _top_lists(
    model: InterestModel,
    retriever: Retriever,
    eval_set: EvalSet,
    search: _Search,
    *,
    progress: bool,
    across_ranks: bool,
) -> np.ndarray:
    """``[U_r, n]`` recommended ids of this rank's share of the users (every user without
    ``across_ranks`` or a process group): searched on the device where the index can search there
    and no diversity pick is asked for (:func:`_top_on_device`), else on the host (:func:`_top_on_host`)."""
    users = _share(len(eval_set.lengths)) if across_ranks else range(len(eval_set.lengths))
    mine = eval_set.rows(np.arange(users.start, users.stop))
    device = model_device(model)
    with progress_bar(len(users), "evaluate", enabled=progress, unit="users") as bar:  # closed on errors too
        if not users:
            return np.zeros((0, search.n), dtype=np.int64)
        if retriever.on_device and search.diversity_lambda == 0:
            return _top_on_device(model, retriever, mine, search, device, bar)
        return _top_on_host(model, retriever, mine, search, device, bar)


def _share(num_users: int) -> range:
    """This rank's contiguous share of ``num_users`` users (all of them without a process group)."""
    if not dist.is_initialized():
        return range(num_users)
    bounds = np.linspace(0, num_users, dist.get_world_size() + 1).astype(np.int64)
    rank = dist.get_rank()
    return range(int(bounds[rank]), int(bounds[rank + 1]))


def _gathered(ids: np.ndarray) -> np.ndarray:
    """Every rank's ``ids [U_r, n]`` in rank order: the ``[U, n]`` top lists of all the users."""
    if not dist.is_initialized():
        return ids
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, ids)
    return np.concatenate([part for part in parts if len(part)] or [ids])


def _top_on_device(
    model: InterestModel, retriever: Retriever, eval_set: EvalSet, search: _Search, device: torch.device, bar: Any
) -> np.ndarray:
    """``[U, n]`` recommended ids, searched where the embeddings live: every batch is queued
    without waiting for the GPU (inputs through pinned memory, results kept on the device) and
    the ids come back to the host once."""
    num_users = len(eval_set.lengths)
    out, finite = [], torch.ones((), dtype=torch.bool, device=device)
    for start in range(0, num_users, search.batch_size):
        stop = min(start + search.batch_size, num_users)
        seq, lengths = to_device(
            (
                np.asarray(eval_set.inputs[start:stop], dtype=np.int64),
                np.asarray(eval_set.lengths[start:stop], dtype=np.int64),
            ),
            device,
        )
        interests = model.interests(seq, lengths).float()  # [b, K, d]
        finite &= torch.isfinite(interests).all()
        exclude = history_block(eval_set, start, stop, device) if search.exclude_history else None
        out.append(retriever.top_items(interests, search.n, exclude)[0])
        bar.update(stop - start)
    if not bool(finite):
        raise ValueError("interests: contains NaN or infinite values")
    return torch.cat(out).cpu().numpy()


def _top_on_host(
    model: InterestModel, retriever: Retriever, eval_set: EvalSet, search: _Search, device: torch.device, bar: Any
) -> np.ndarray:
    """``[U, n]`` recommended ids, searched and merged on the host batch by batch (FAISS, or
    the diversity-controlled pick)."""
    num_users = len(eval_set.lengths)
    out = []
    for start in range(0, num_users, search.batch_size):
        stop = min(start + search.batch_size, num_users)
        inputs = np.asarray(eval_set.inputs[start:stop], dtype=np.int64)
        seq, lengths = to_device((inputs, np.asarray(eval_set.lengths[start:stop], dtype=np.int64)), device)
        interests = model.interests(seq, lengths).float()  # [b, K, d]
        exclude = eval_set.history(start, stop) if search.exclude_history else None  # CSR: every input click
        out.append(retriever.search(interests, search.n, exclude, diversity_lambda=search.diversity_lambda)[0])
        bar.update(stop - start)
    return np.concatenate(out)


def history_block(eval_set: EvalSet, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """``[stop - start, E]`` every input click of users ``start:stop`` (all of them, not only the
    last ``max_len``), right-padded with 0 (E: the block's longest input), on ``device``: the
    ``exclude`` of :meth:`~recsys.retrieval.index.Retriever.top_items`."""
    indptr, items = eval_set.history(start, stop)
    padded, _ = pad_sequences(indptr, items, np.arange(stop - start), _widest(indptr))
    (block,) = to_device((padded,), device)
    return block


def _widest(indptr: np.ndarray) -> int:
    """The longest row of CSR ``indptr [b + 1]`` (at least 1, so a padded block has a column)."""
    return max(1, int(np.diff(indptr).max(initial=0)))


def evaluate_with_config(
    model: InterestModel,
    eval_set: EvalSet,
    cfg: Config,
    item_category: np.ndarray | None = None,
    *,
    progress: bool = False,
    across_ranks: bool = False,
) -> dict[str, float]:
    """:func:`evaluate` with ``cfg.eval`` and ``cfg.retrieval`` (``cfg`` resolved:
    :func:`recsys.run.settings.resolve` decided ``eval.exclude_history``); ``across_ranks`` as there."""
    require_resolved(cfg, "evaluate_with_config", section="eval.")
    return evaluate(
        model,
        eval_set,
        topn=tuple(cfg.eval.topn),
        retrieval=cfg.retrieval,
        exclude_history=bool(cfg.eval.exclude_history),
        comirec_ndcg=cfg.eval.comirec_ndcg,
        item_category=item_category,
        diversity_lambda=cfg.eval.diversity_lambda,
        batch_size=cfg.eval.batch_size,
        progress=progress,
        across_ranks=across_ranks,
    )


def format_table(results: dict[str, dict[str, float]], metrics: Sequence[str] = TABLE_METRICS, digits: int = 4) -> str:
    """A Markdown table: one row per run, columns ``Recall@n``, ``NDCG@n``, ``HitRate@n``, ``MRR@n`` per cutoff.

    ``results`` maps a run/model name to :func:`evaluate`'s output. The cutoffs are those
    found in the results' keys; ``metrics`` may add ``"diversity"`` / ``"coverage"``.
    Missing values print as ``-``.
    """
    if not results:
        raise ValueError("format_table: no results to show")
    suffixes = {key.split("@", 1)[1] for row in results.values() for key in row if "@" in key}
    cutoffs = sorted(int(s) for s in suffixes if s.isdigit())
    columns = [f"{m}@{n}" for n in cutoffs for m in metrics]
    header = ["model"] + [f"{_TABLE_NAMES.get(c.split('@')[0], c.split('@')[0])}@{c.split('@')[1]}" for c in columns]
    rows = [[name] + [f"{row[c]:.{digits}f}" if c in row else "-" for c in columns] for name, row in results.items()]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])
