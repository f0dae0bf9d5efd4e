"""Top-N candidates from a trained run: model + index + dataset in memory, shared by
``recsys recommend`` (batch) and ``recsys serve`` (HTTP).

Inputs are click sequences of internal item ids; a known user's sequence is their last
``max_len`` clicks in the run's dataset (every click, including those the evaluation held
out). :meth:`Recommender.recommend` takes a whole batch of sequences at once, each row with
its own ``n`` and diversity ``λ``, and gives every row exactly the answer it would get alone:
each interest contributes its top ``n + E`` hits (``E`` = that row's excluded items), as
:meth:`Retriever.search` does for one user, whatever else is in the batch. (For exact
indexes this holds up to float ties; for HNSW it holds while ``ef_search >= n + E``, since
FAISS widens the beam to ``k`` otherwise.) A row holds ``n`` items whenever the catalogue has
that many it may return: rows an approximate index leaves short are searched exactly
(:meth:`Retriever.candidates`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

import numpy as np
import torch

from recsys.config import RetrievalConfig
from recsys.data.batches import gather_rows, pad_sequences
from recsys.data.prepare import Dataset
from recsys.device import model_device, to_device
from recsys.models.base import InterestModel
from recsys.retrieval.aggregate import check_lambda, diverse_merge, max_merge
from recsys.retrieval.index import Retriever

if TYPE_CHECKING:
    from recsys.run import LoadedRun

__all__ = ["Recommendations", "Recommender", "unique_csr"]

CSR = tuple[np.ndarray, np.ndarray]  # (indptr [B + 1] int64, items [nnz] int64)
Array = TypeVar("Array", np.ndarray, torch.Tensor)


@dataclass
class Recommendations(Generic[Array]):
    """Top-N per row: ``ids [B, n_max]`` int64 internal item ids, ``scores [B, n_max]``
    float32, ``interest_of [B, n_max]`` int64 (the interest that found the item; ``-1`` for
    popularity fallbacks); row ``b`` holds ``n[b]`` items at most, the rest is ``-1 / -inf / -1``.
    numpy arrays, or device tensors from :meth:`Recommender.recommend` with ``on_device=True``."""

    ids: Array
    scores: Array
    interest_of: Array

    @staticmethod
    def concat(parts: list[Recommendations[Any]]) -> Recommendations[np.ndarray]:
        """The rows of ``parts`` in order, as numpy arrays: device tensors are joined on the
        device and copied to the host once."""
        fields = []
        for name in ("ids", "scores", "interest_of"):
            values = [getattr(p, name) for p in parts]
            if all(isinstance(v, torch.Tensor) for v in values):
                fields.append(torch.cat(values).cpu().numpy())
            else:
                fields.append(np.concatenate([v.cpu().numpy() if isinstance(v, torch.Tensor) else v for v in values]))
        return Recommendations(*fields)


def _dense(csr: CSR) -> np.ndarray:
    """CSR rows -> ``[B, longest row]`` int64, right-padded with 0."""
    indptr, items = csr
    counts = np.diff(indptr)
    rows = np.repeat(np.arange(len(counts)), counts)
    dense = np.zeros((len(counts), int(counts.max(initial=0))), dtype=np.int64)
    dense[rows, np.arange(len(items)) - indptr[rows]] = items
    return dense


def unique_csr(indptr: np.ndarray, items: np.ndarray, num_items: int) -> CSR:
    """The CSR rows with ids ``<= 0`` dropped and each row's ids made unique (sorted)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    rows = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    keep = items > 0
    keys = np.unique(rows[keep] * num_items + items[keep])
    out_indptr = np.zeros(len(indptr), dtype=np.int64)
    np.cumsum(np.bincount(keys // num_items, minlength=len(indptr) - 1), out=out_indptr[1:])
    return out_indptr, keys % num_items


def _per_row(value: Any, bsz: int, dtype: type, name: str) -> np.ndarray:
    out: np.ndarray = np.broadcast_to(np.asarray(value, dtype=dtype), (bsz,))
    if out.ndim != 1:
        raise ValueError(f"{name}: expected a scalar or [B={bsz}] values")
    return out


class Recommender:
    """A run's model, index and dataset, answering top-N requests in batches.

    Args:
        model: the trained :class:`InterestModel` (put in eval mode here).
        dataset: the run's :class:`Dataset` (raw ids, histories, categories, popularity).
        retriever: a :class:`Retriever` over ``model.item_embeddings()`` with the dataset's
            ``item_category`` (see :func:`recsys.run.open_run_index`).
        max_len: sequence width fed to the model (the run's ``data.max_len``).
        name, index_name: shown by :meth:`info`.
        search: which search answers (exact, or the index with its measured recall), as
            :func:`recsys.run.open_run_index` says it; shown by :meth:`info`.
    """

    def __init__(
        self,
        model: InterestModel,
        dataset: Dataset,
        retriever: Retriever,
        *,
        max_len: int,
        name: str = "",
        index_name: str = "",
        search: str = "",
    ) -> None:
        if retriever.num_items != dataset.catalogue_size:
            raise ValueError(
                f"retriever: indexes {retriever.num_items} ids but the dataset's catalogue has {dataset.catalogue_size}"
            )
        self.model = model.eval()
        self.dataset = dataset
        self.retriever = retriever
        self.max_len = int(max_len)
        self.name = name
        self.index_name = index_name
        self.search = search
        self.device = model_device(model)
        counts = np.asarray(dataset.item_counts, dtype=np.int64)
        self._popular = (np.argsort(-counts[1:], kind="stable") + 1).astype(np.int64)  # [N - 1]
        self._counts = counts.astype(np.float32)
        for id_map in (dataset.item_map, dataset.user_map):  # build the raw-id lookups now, not on a request
            id_map.lookup([])

    @classmethod
    def from_run(
        cls,
        path: str | Path,
        *,
        factory: str | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        device: str | torch.device = "cpu",
        log: Callable[[str], None] = print,
        item_features: str | Path | None = None,
        new_item_share: float | None = None,
    ) -> Recommender:
        """Load run directory ``path`` and its index (``factory`` default: the run's
        ``retrieval.factory``; a saved ``recsys index`` file is reused when it matches; the
        options as :func:`recsys.run.retrieval_settings` takes them; an index built in memory has
        its search chosen for its recall unless ``nprobe`` or ``ef_search`` is given).
        ``item_features``: first add that file's new items to the run (:func:`recsys.run.add_items`);
        ``new_item_share``: the share of each list kept for items without clicks (default the run's
        ``retrieval.new_item_share``)."""
        from recsys.run import add_items, load_run, retrieval_settings

        run = load_run(path, device=device)
        if item_features is not None:
            add_items(run, item_features, log=log)
        settings = retrieval_settings(run, factory, nprobe=nprobe, ef_search=ef_search, new_item_share=new_item_share)
        return cls.of_run(run, settings, log=log, widen=nprobe is None and ef_search is None)

    @classmethod
    def of_run(
        cls,
        run: LoadedRun,
        settings: RetrievalConfig | None = None,
        *,
        log: Callable[[str], None] = print,
        progress: bool = False,
        widen: bool = True,
    ) -> Recommender:
        """The recommender of a loaded run, with its saved index for ``settings.factory`` when
        that matches the weights, else one built in memory (see :func:`recsys.run.open_run_index`,
        which ``widen`` is passed to); ``log`` gets one line saying which search answers."""
        from recsys.run import open_run_index

        retriever, where = open_run_index(run, settings, log=log, progress=progress, widen=widen)
        log(f"index: {where}")
        return cls(
            run.model,
            run.dataset,
            retriever,
            max_len=run.cfg.data.max_len,
            name=run.cfg.model.name,
            index_name=retriever.factory,
            search=where,
        )

    # -- inputs (raw ids become internal ids through ``dataset.item_map`` / ``user_map``) ------
    def user_inputs(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``users [B]`` indices -> their last ``max_len`` clicks ``[B, max_len]`` (right-padded)
        and lengths ``[B]``."""
        return pad_sequences(self.dataset.indptr, self.dataset.items, np.asarray(users, np.int64), self.max_len)

    def user_histories(self, users: np.ndarray) -> CSR:
        """``users [B]`` indices -> every click of each user as CSR ``(indptr [B + 1], items)``."""
        users = np.asarray(users, dtype=np.int64)
        return gather_rows(self.dataset.items, self.dataset.indptr[users], self.dataset.indptr[users + 1])

    def sequence_inputs(self, sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Internal id sequences (oldest first) -> the last ``max_len`` of each, ``[B, max_len]``
        right-padded, and lengths ``[B]``."""
        indptr, items = self.sequences_csr(sequences)
        return pad_sequences(indptr, items, np.arange(len(sequences)), self.max_len)

    @staticmethod
    def sequences_csr(sequences: list[np.ndarray]) -> CSR:
        """A list of id arrays as CSR ``(indptr [B + 1], items)``."""
        indptr = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in sequences], out=indptr[1:])
        items = np.concatenate(sequences).astype(np.int64) if len(sequences) else np.empty(0, np.int64)
        return indptr, items

    # -- answers --------------------------------------------------------------------------
    @overload
    def recommend(
        self,
        inputs: np.ndarray,
        lengths: np.ndarray,
        n: int | np.ndarray,
        *,
        exclude: CSR | None = None,
        diversity_lambda: float | np.ndarray = 0.0,
        on_device: Literal[False] = False,
    ) -> Recommendations[np.ndarray]: ...

    @overload
    def recommend(
        self,
        inputs: np.ndarray,
        lengths: np.ndarray,
        n: int | np.ndarray,
        *,
        exclude: CSR | None = None,
        diversity_lambda: float | np.ndarray = 0.0,
        on_device: bool,
    ) -> Recommendations[Any]: ...

    def recommend(
        self,
        inputs: np.ndarray,
        lengths: np.ndarray,
        n: int | np.ndarray,
        *,
        exclude: CSR | None = None,
        diversity_lambda: float | np.ndarray = 0.0,
        on_device: bool = False,
    ) -> Recommendations[Any]:
        """Top ``n`` items for each of ``B`` sequences.

        Args:
            inputs: ``[B, L]`` int64 internal ids, right-padded with 0; lengths ``[B]`` >= 1.
            n: items per row, a scalar or ``[B]``; capped at the catalogue size.
            exclude: items never to return, CSR ``(indptr [B + 1], items)`` (e.g. history).
            diversity_lambda: ComiRec's diversity λ, a scalar or ``[B]`` (0 = max-score merge).
            on_device: with exact search where the embeddings live (the torch backend) and
                λ = 0, return device tensors without waiting for the GPU (join batches with
                :meth:`Recommendations.concat`); otherwise numpy arrays either way.

        Returns :class:`Recommendations` of width ``max(n)``.
        """
        inputs, lengths, n, lam, exclude = self._request(inputs, lengths, n, diversity_lambda, exclude)
        bsz, n_max = len(lengths), int(n.max())
        device_search = self.retriever.on_device and not lam.any()
        dense = _dense(exclude) if device_search and exclude is not None else np.zeros((bsz, 0), dtype=np.int64)
        with torch.inference_mode():
            seq, lens, dense_t, n_t = to_device((inputs, lengths, dense, n), self.device)
            interests = self.model.interests(seq, lens).float()
            if device_search:
                top = self.retriever.top_items(interests, n_max, dense_t if exclude is not None else None, n_t)
                past = torch.arange(n_max, device=top[0].device)[None, :] >= n_t.to(top[0].device)[:, None]
                recs = Recommendations(
                    top[0].masked_fill(past, -1), top[1].masked_fill(past, -torch.inf), top[2].masked_fill(past, -1)
                )
                return recs if on_device else Recommendations.concat([recs])
        candidates = self.retriever.candidates(interests, n, exclude)  # each row to its own depth
        m = self._merged(candidates, lam, n_max)
        merged = self.retriever.keep_new_items(interests, (m.ids, m.scores, m.interest_of), n, exclude)
        return self._cut(Recommendations(*merged), n)

    def _request(
        self, inputs: np.ndarray, lengths: np.ndarray, n: int | np.ndarray, lam: float | np.ndarray, exclude: CSR | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, CSR | None]:
        """:meth:`recommend`'s arguments checked and in their working form: ``inputs [B, L]`` and
        ``lengths [B]`` int64, ``n [B]`` capped at the catalogue, ``λ [B]`` float64 and ``exclude``
        deduplicated, each wrong shape or value a ``ValueError`` naming the argument."""
        inputs = np.asarray(inputs, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        bsz = len(lengths)
        if inputs.ndim != 2 or len(inputs) != bsz:
            raise ValueError(f"inputs: expected [B={bsz}, L], got {inputs.shape}")
        if bsz == 0:
            raise ValueError("inputs: no sequences")
        if lengths.min() < 1:
            raise ValueError("lengths: every sequence needs at least one known item")
        n_rows = self._capped(_per_row(n, bsz, np.int64, "n"))
        lam_rows = _per_row(lam, bsz, np.float64, "diversity_lambda")
        for value in np.unique(lam_rows):
            check_lambda(float(value))
        if exclude is not None:
            exclude = unique_csr(*exclude, self.dataset.catalogue_size)
            if len(exclude[0]) != bsz + 1:
                raise ValueError(f"exclude: CSR indptr must have {bsz + 1} entries, got {len(exclude[0])}")
        return inputs, lengths, n_rows, lam_rows, exclude

    def _merged(
        self, candidates: tuple[np.ndarray, np.ndarray, np.ndarray], lam: np.ndarray, n_max: int
    ) -> Recommendations[np.ndarray]:
        """The interests' candidate lists ``(ids, scores, interest) [B, K·n]`` merged into ``n_max``
        a row: by best score where ``λ [B]`` is 0, by ComiRec's diversity pick elsewhere."""
        ids, scores, interest_of = candidates
        bsz = len(lam)
        out_ids = np.full((bsz, n_max), -1, dtype=np.int64)
        out_scores = np.full((bsz, n_max), -np.inf, dtype=np.float32)
        out_int = np.full((bsz, n_max), -1, dtype=np.int64)
        for value in np.unique(lam):
            rows = np.flatnonzero(lam == value)
            args = (ids[rows], scores[rows], interest_of[rows])
            if value == 0:
                merged = max_merge(*args, n_max)
            else:
                merged = diverse_merge(*args, self.dataset.catalogue_category, n_max, float(value))
            out_ids[rows], out_scores[rows], out_int[rows] = merged
        return Recommendations(out_ids, out_scores, out_int)

    def popular(self, n: int | np.ndarray, *, exclude: CSR | None = None, rows: int = 1) -> Recommendations[np.ndarray]:
        """The most clicked items, for ``rows`` requests (``n`` scalar or ``[rows]``), minus
        ``exclude``; scores are click counts, interests ``-1``."""
        n = self._capped(_per_row(n, rows, np.int64, "n"))
        num_items = self.dataset.catalogue_size
        extra = 0
        if exclude is not None:
            exclude = unique_csr(*exclude, num_items)
            extra = int(np.diff(exclude[0]).max(initial=0))
        n_max = int(n.max())
        ids = np.broadcast_to(self._popular[: n_max + extra], (rows, min(n_max + extra, num_items - 1))).copy()
        if exclude is not None:
            keys = np.repeat(np.arange(rows, dtype=np.int64), np.diff(exclude[0])) * num_items + exclude[1]
            row_keys = np.arange(rows, dtype=np.int64)[:, None] * num_items + ids
            ids[np.isin(row_keys, keys)] = -1
            ids = np.take_along_axis(ids, np.argsort(ids <= 0, axis=1, kind="stable"), axis=1)
        out_ids = np.full((rows, n_max), -1, dtype=np.int64)
        width = min(n_max, ids.shape[1])
        out_ids[:, :width] = ids[:, :width]
        scores = np.where(out_ids > 0, self._counts[np.maximum(out_ids, 0)], np.float32(-np.inf))
        return self._cut(Recommendations(out_ids, scores.astype(np.float32), np.full_like(out_ids, -1)), n)

    def _capped(self, n: np.ndarray) -> np.ndarray:
        """``n [B]`` checked ``>= 1`` and capped at the catalogue size (no row can hold more)."""
        if n.min() < 1:
            raise ValueError(f"n: must be >= 1, got {int(n.min())}")
        return np.minimum(n, self.dataset.catalogue_size - 1)

    @staticmethod
    def _cut(recs: Recommendations[np.ndarray], n: np.ndarray) -> Recommendations[np.ndarray]:
        """Blank the columns past each row's own ``n``."""
        past = np.arange(recs.ids.shape[1])[None, :] >= n[:, None]
        recs.ids[past], recs.scores[past], recs.interest_of[past] = -1, -np.inf, -1
        return recs

    def info(self) -> dict[str, Any]:
        """What is being served: model, dataset, catalogue size, index (and which search, with its
        measured recall), K, d, max_len."""
        emb_dim = self.retriever.dim
        return {
            "model": self.name,
            "dataset": self.dataset.source,
            "items": self.dataset.catalogue_size - 1,
            "users": self.dataset.num_users,
            "categories": self.dataset.num_categories - 1,
            "index": self.index_name,
            "search": self.search,
            "num_interests": int(getattr(self.model, "num_interests", 1)),
            "dim": emb_dim,
            "max_len": self.max_len,
        }
