"""Inner-product search over item embeddings, with FAISS or plain torch.

The index holds item rows ``1..N-1`` only: row 0 (padding) is never added, and a FAISS
label ``j`` stands for item id ``j + 1``. So padding can never be returned, whatever the
index type. :func:`save_index` / :func:`load_index` keep that convention.

:class:`Retriever` answers ``search(interests [B, K, d], n)`` with one index call for all
``B·K`` interest vectors, then merges per user (max score, de-duplicated, optional history
exclusion, or ComiRec's diversity-controlled greedy pick; see :mod:`recsys.retrieval.aggregate`).
A list is full whenever the catalogue allows it: the rows an approximate index leaves short
(HNSW over inner products reaches only part of its graph) are searched again exactly over the
embeddings (:meth:`Retriever.candidates`).

Backends:

* ``faiss``: any ``index_factory`` string with the inner-product metric (``Flat``,
  ``HNSW32,Flat``, ``IVF1024,Flat``, ``IVF256,PQ16``, ...); IVF/PQ indexes are trained on
  the item embeddings; ``nprobe`` / ``ef_search`` are applied where the index has them, and
  :func:`calibrate` widens them until the index's top ``n`` holds :data:`TARGET_RECALL` of exact
  search's on given queries.
* ``torch``: exact search (factory ``Flat`` only) as a chunked ``matmul`` + ``topk`` on the
  embeddings' device (CPU or CUDA). It returns the same items as FAISS ``Flat`` (up to ties
  and float rounding of equal scores).
* ``auto``: torch for ``Flat`` over CUDA embeddings or when FAISS is not installed, else FAISS.

The settings (factory, backend, ``nprobe``, ``ef_search``, ``ef_construction``) travel as one
:class:`~recsys.config.RetrievalConfig`, the run config's ``retrieval`` section.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from recsys.config import ConfigError, RetrievalConfig
from recsys.io import atomic_save
from recsys.progress import progress_bar
from recsys.retrieval.aggregate import diverse_merge, max_merge
from recsys.retrieval.new_items import keep_new_items, reserved_places
from recsys.text import count

__all__ = [
    "TARGET_RECALL",
    "Calibration",
    "Exclude",
    "Retriever",
    "SparseRows",
    "ann_recall",
    "build_index",
    "calibrate",
    "check_factory",
    "clamp_ivf",
    "embedding_hash",
    "load_index",
    "save_index",
    "search_params",
    "search_setting",
    "set_search_params",
    "with_search",
    "write_index",
]


_Top = tuple[Any, Any, Any]  # ids, scores, interest_of [B, W]: numpy on the host path, torch on the device one


@runtime_checkable
class SparseRows(Protocol):
    """CSR rows as a scipy.sparse CSR matrix holds them: ``indptr [B+1]`` and ``indices``."""

    indptr: np.ndarray
    indices: np.ndarray


# History to exclude per user: right-padded ``[B, L]`` ids (0 = padding), or CSR as
# ``(indptr [B+1], items)`` or a scipy.sparse CSR matrix.
Exclude = np.ndarray | torch.Tensor | tuple[np.ndarray, np.ndarray] | SparseRows | None

_BACKENDS = ("auto", "faiss", "torch")
_TORCH_CHUNK_BYTES = 256 * 2**20  # bound on one [queries, N] score block of the torch backend
_ADD_CHUNK = 16384  # vectors per index.add call (the progress bar's step)
MIN_POINTS_PER_LIST = 39  # FAISS warns below this many training vectors per IVF list
# calibrate: an index's search is widened until its top n holds this share of exact search's top n (on a
# 98k-item trained table, HNSW32 at FAISS's beam held 0.75 of it, so served lists differed from evaluated ones) ...
TARGET_RECALL = 0.95
MAX_EF_SEARCH = 4096  # ... by doubling ef_search up to this (past it HNSW costs more than exact search here)


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - faiss-cpu is a core dependency
        raise ImportError(
            "FAISS is not installed: `pip install faiss-cpu`, or use retrieval.backend=torch "
            "with retrieval.factory=Flat"
        ) from err
    return faiss


def _faiss_reason(err: Exception) -> str:
    """FAISS's C++ error as its message alone, e.g. ``could not parse index string Bogus`` (without
    the function signature, source line and assertion that come before it)."""
    text = (str(err).strip() or type(err).__name__).splitlines()[0]
    text = re.sub(r"^Error in .*? at \S+:\d+: ", "", text)
    return re.sub(r"^Error: '.*' failed: ", "", text)


def _new_index(factory: str, dim: int) -> Any:
    """An empty FAISS inner-product index of ``factory`` over ``dim``-wide vectors, or a
    :class:`~recsys.config.ConfigError` naming ``retrieval.factory`` in one line."""
    faiss = _faiss()
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise ConfigError(
            f"retrieval.factory: FAISS cannot build {factory!r} over {dim}-wide embeddings: {_faiss_reason(err)}"
        ) from None


def check_factory(factory: str, dim: int) -> None:
    """Refuse, in one line naming ``retrieval.factory``, a factory string FAISS cannot build over
    ``dim``-wide embeddings (an unknown string, product quantizers that do not divide the width),
    which a run would otherwise learn at its first validation. Builds an empty index only; ``Flat``
    (which the torch backend searches without FAISS) passes as it is."""
    if factory.strip() != "Flat":
        _new_index(factory, dim)


def _as_float32_numpy(x: np.ndarray | torch.Tensor, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float32).numpy()
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: contains NaN or infinite values")
    return x


def set_search_params(index: Any, settings: RetrievalConfig) -> None:
    """Set ``settings.nprobe`` (IVF indexes) and ``settings.ef_search`` (HNSW indexes) where
    ``index`` has them."""
    faiss = _faiss()
    if settings.nprobe <= 0:
        raise ValueError(f"retrieval.nprobe: must be > 0, got {settings.nprobe}")
    if settings.ef_search <= 0:
        raise ValueError(f"retrieval.ef_search: must be > 0, got {settings.ef_search}")
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(settings.nprobe, ivf.nlist)
    inner = faiss.downcast_index(index)
    if hasattr(inner, "hnsw"):
        inner.hnsw.efSearch = settings.ef_search


def search_params(index: Any) -> str:
    """The search settings ``index`` has, as ``"nprobe=16"`` (IVF), ``"ef_search=64"`` (HNSW) or
    ``""`` (neither, e.g. ``Flat``): what a message about the index should show."""
    faiss = _faiss()
    shown = []
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        shown.append(f"nprobe={ivf.nprobe}")
    inner = faiss.downcast_index(index)
    if hasattr(inner, "hnsw"):
        shown.append(f"ef_search={inner.hnsw.efSearch}")
    return ", ".join(shown)


def build_index(item_emb: np.ndarray | torch.Tensor, settings: RetrievalConfig, *, progress: bool = False) -> Any:
    """A FAISS inner-product index over ``item_emb [N, d]`` rows ``1..N-1`` (label ``j`` = item ``j+1``).

    ``settings.factory`` is a FAISS ``index_factory`` string; indexes that need training (IVF,
    PQ) are trained on the same embeddings. ``settings.ef_construction`` is the HNSW graph's
    build beam (ignored by other indexes): wider builds slower and finds better neighbours; the
    search settings are applied as :func:`set_search_params` does. ``progress`` shows a bar
    over the vectors added (on a terminal).
    """
    faiss = _faiss()
    factory, ef_construction = settings.factory, settings.ef_construction
    emb = _as_float32_numpy(item_emb, "item_emb")
    if emb.ndim != 2 or emb.shape[0] < 2:
        raise ValueError(f"item_emb: expected [num_items >= 2, d] (row 0 = padding), got {emb.shape}")
    if ef_construction <= 0:
        raise ValueError(f"retrieval.ef_construction: must be > 0, got {ef_construction}")
    vectors = np.ascontiguousarray(emb[1:])
    index = _new_index(factory, vectors.shape[1])
    if not index.is_trained:
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None and ivf.nlist > len(vectors):
            raise ValueError(
                f"retrieval.factory: {factory!r} asks for {ivf.nlist} IVF lists but there are "
                f"only {count(len(vectors), 'item')}; use fewer lists"
            )
        try:
            index.train(vectors)
        except RuntimeError as err:
            raise ValueError(f"retrieval.factory: training {factory!r} failed: {_faiss_reason(err)}") from None
    inner = faiss.downcast_index(index)
    if hasattr(inner, "hnsw"):
        inner.hnsw.efConstruction = ef_construction
    with progress_bar(len(vectors), f"index {factory}", enabled=progress, unit="items") as bar:
        for start in range(0, len(vectors), _ADD_CHUNK):
            index.add(vectors[start : start + _ADD_CHUNK])
            bar.update(min(_ADD_CHUNK, len(vectors) - start))
    set_search_params(index, settings)
    return index


def search_setting(index: Any) -> tuple[str, int]:
    """The search setting that trades ``index``'s speed for its recall and its value now:
    ``("nprobe", n)`` (IVF lists searched), ``("ef_search", n)`` (the HNSW beam), or ``("", 0)``
    (neither: ``Flat`` is exact, ``PQ`` alone has nothing to widen)."""
    faiss = _faiss()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return "nprobe", int(ivf.nprobe)
    inner = faiss.downcast_index(index)
    return ("ef_search", int(inner.hnsw.efSearch)) if hasattr(inner, "hnsw") else ("", 0)


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` measured: the search setting ``key`` (``""``: none to widen), the
    ``value`` chosen, the ``recall`` of exact search's top ``n`` it reached over ``queries`` users,
    the ``target``, and each value ``tried`` with its recall, in order."""

    key: str
    value: int
    recall: float
    target: float
    n: int
    queries: int
    tried: tuple[tuple[int, float], ...]

    @property
    def reached(self) -> bool:
        return self.recall >= self.target

    def describe(self) -> str:
        """``"ef_search 128 -> 192: recall@50 0.944 at 128, 0.979 at 256, 0.962 at 192 of exact search
        on 2,000 test users"``; one value tried: ``"ef_search 128: recall@50 0.998 of ..."``."""
        where = f"of exact search on {self.queries:,} test users"
        if len(self.tried) == 1:
            return f"{self.key} {self.value}: " * bool(self.key) + f"recall@{self.n} {self.recall:.3f} {where}"
        steps = ", ".join(f"{recall:.3f} at {value}" for value, recall in self.tried)
        return f"{self.key} {self.tried[0][0]} -> {self.value}: recall@{self.n} {steps} {where}"


def calibrate(
    index: Any,
    interests: np.ndarray,
    exact_ids: np.ndarray,
    settings: RetrievalConfig,
    *,
    target: float = TARGET_RECALL,
    widen: bool = True,
) -> Calibration:
    """Widen the search of ``index`` until it finds what exact search finds, and leave it set so.

    ``interests [U, K, d]`` are the queries (users' interests, as served) and ``exact_ids [U, n]``
    exact search's top ``n`` for them. From ``settings``' ``nprobe`` (IVF) or ``ef_search`` (HNSW),
    the value doubles until the index's own top ``n`` (max-merged over the ``K`` interests, short
    lists left short) holds ``target`` of ``exact_ids`` on average, or until it reaches its bound:
    every IVF list, or :data:`MAX_EF_SEARCH` (at most the catalogue); then the smallest value that
    reaches it is searched for between the last two, to within an eighth. ``widen=False`` measures
    at ``settings``' value only (a value the user chose)."""
    if not 0 <= target <= 1:
        raise ValueError(f"target: a recall in [0, 1], got {target}")
    key = search_setting(index)[0]
    limit = _search_limit(index, key)
    tried: list[tuple[int, float]] = []

    def measure(value: int) -> float:
        if key:
            set_search_params(index, with_search(settings, key, value))
        ids = Retriever.from_index(index).search(interests, exact_ids.shape[1])[0]
        recall = float(np.nanmean(ann_recall(ids, exact_ids))) if len(ids) else float("nan")
        tried.append((value, recall))
        return recall

    value = getattr(settings, key) if key else 0
    recall, short = measure(value), 0  # short: the largest value tried that falls short of the target
    while widen and key and recall < target and value < limit:
        short, value = value, min(2 * value, limit)
        recall = measure(value)
    if short and recall >= target:  # the smallest value that reaches it, between short and value
        while value - short > max(1, value // 8):
            middle = (short + value) // 2
            if measure(middle) >= target:
                value = middle
            else:
                short = middle
        recall = dict(tried)[value]
        set_search_params(index, with_search(settings, key, value))  # the index left searched at it
    return Calibration(key, value, recall, target, exact_ids.shape[1], len(exact_ids), tuple(tried))


def with_search(settings: RetrievalConfig, key: str, value: int) -> RetrievalConfig:
    """``settings`` with its search setting ``key`` (``"nprobe"``, ``"ef_search"``; ``""``: none) at ``value``."""
    if key == "nprobe":
        return dataclasses.replace(settings, nprobe=value)
    if key == "ef_search":
        return dataclasses.replace(settings, ef_search=value)
    return settings


def _search_limit(index: Any, key: str) -> int:
    """The widest useful ``key`` setting of ``index``: its number of IVF lists, or the HNSW beam
    :data:`MAX_EF_SEARCH` (at most the vectors it holds); 0 without a setting."""
    if key == "nprobe":
        return int(_faiss().extract_index_ivf(index).nlist)
    if key == "ef_search":
        return max(1, min(MAX_EF_SEARCH, int(index.ntotal)))
    return 0


def clamp_ivf(factory: str, num_vectors: int) -> tuple[str, str | None]:
    """``factory`` with its ``IVF<nlist>`` lowered to what ``num_vectors`` can train (at least
    ``MIN_POINTS_PER_LIST`` per list), and a warning saying so (``None`` when nothing changed)."""
    match = re.search(r"IVF(\d+)", factory)
    if match is None:
        return factory, None
    nlist = int(match.group(1))
    allowed = max(1, num_vectors // MIN_POINTS_PER_LIST)
    if nlist <= allowed:
        return factory, None
    clamped = factory[: match.start(1)] + str(allowed) + factory[match.end(1) :]
    return clamped, (
        f"{factory!r} asks for {nlist} IVF lists but {count(num_vectors, 'item')} train at most {allowed} "
        f"(>= {MIN_POINTS_PER_LIST} per list); using {clamped!r}"
    )


def embedding_hash(item_emb: np.ndarray) -> str:
    """SHA-1 of the float32 bytes of ``item_emb [N, d]`` (ties an index to the weights it indexes)."""
    return hashlib.sha1(np.ascontiguousarray(item_emb, dtype=np.float32).tobytes()).hexdigest()


def ann_recall(ann_ids: np.ndarray, exact_ids: np.ndarray) -> np.ndarray:
    """``[U]`` share of each row's exact top-n (``exact_ids [U, n]``, ``-1`` = none) that
    ``ann_ids [U, n']`` also holds; NaN for rows with no exact item."""
    if ann_ids.ndim != 2 or exact_ids.ndim != 2 or len(ann_ids) != len(exact_ids):
        raise ValueError(f"ann_ids, exact_ids: expected [U, n] arrays, got {ann_ids.shape} and {exact_ids.shape}")
    rows = np.arange(len(exact_ids))[:, None]
    stride = int(max(ann_ids.max(initial=0), exact_ids.max(initial=0))) + 1
    exact_keys = np.where(exact_ids > 0, rows * stride + exact_ids, -1)
    ann_keys = np.where(ann_ids > 0, rows * stride + ann_ids, -2)
    found = np.isin(exact_keys, ann_keys) & (exact_ids > 0)
    total = (exact_ids > 0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, found.sum(axis=1) / total, np.nan)


def save_index(index: Any, path: str | Path) -> None:
    """Write a FAISS index built by :func:`build_index` (label ``j`` = item ``j+1``), whole or not
    at all (:func:`recsys.io.atomic_save`)."""
    atomic_save(path, lambda tmp: write_index(index, tmp))


def write_index(index: Any, path: str | Path) -> None:
    """FAISS's own write of ``index`` to ``path``, in place: for a writer that publishes the file
    itself (:meth:`recsys.run.RunDir.save_file`); :func:`save_index` is the whole-or-absent one."""
    _faiss().write_index(index, str(path))


def load_index(path: str | Path) -> Any:
    """Read an index written by :func:`save_index` (with the search settings it was saved with;
    :meth:`Retriever.from_index` can set others)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"index file not found: {path}")
    return _faiss().read_index(str(path))


def _exclude_keys(exclude: Exclude, bsz: int, stride: int) -> np.ndarray:
    """Flatten ``exclude`` into sorted unique keys ``row * stride + item``."""
    if isinstance(exclude, tuple | SparseRows):
        indptr, items = exclude if isinstance(exclude, tuple) else (exclude.indptr, exclude.indices)
        indptr = np.asarray(indptr, dtype=np.int64)
        items = np.asarray(items, dtype=np.int64)
        if indptr.shape != (bsz + 1,) or indptr[0] != 0 or indptr[-1] != len(items):
            raise ValueError(f"exclude: CSR indptr must have {bsz + 1} entries from 0 to len(items)")
        rows = np.repeat(np.arange(bsz, dtype=np.int64), np.diff(indptr))
    else:
        if isinstance(exclude, torch.Tensor):
            exclude = exclude.detach().cpu().numpy()
        dense = np.asarray(exclude, dtype=np.int64)
        if dense.ndim != 2 or dense.shape[0] != bsz:
            raise ValueError(f"exclude: expected [B={bsz}, L] ids padded with 0, got shape {dense.shape}")
        rows = np.repeat(np.arange(bsz, dtype=np.int64), dense.shape[1])
        items = dense.reshape(-1)
    valid = items > 0
    rows, items = rows[valid], items[valid]
    if len(items) and items.max() >= stride:
        raise ValueError(f"exclude: item id {items.max()} is outside the catalogue of {stride} ids")
    return np.unique(rows * stride + items)


class Retriever:
    """Top-``n`` items per user from ``K`` interest vectors, by inner product.

    Args:
        item_emb: ``[num_items, d]`` (numpy or torch; row 0 = padding, never returned).
            The torch backend keeps a torch tensor on its device (CUDA works).
        settings: the factory (a FAISS ``index_factory`` string; the torch backend needs
            ``"Flat"``), the backend (``"auto" | "faiss" | "torch"``, see the module docstring),
            the search settings of IVF / HNSW indexes and the HNSW build beam (see
            :func:`build_index`); default ``RetrievalConfig()``, exact search.
        item_category: ``[num_items]`` int categories, needed for ``diversity_lambda > 0``.
        new_items: ``[num_items]`` bool, the items without training clicks
            (:func:`recsys.items.new_items`): with ``settings.new_item_share > 0`` every list keeps
            that share of its places for them (:mod:`recsys.retrieval.new_items`), searched
            exactly over their rows of ``item_emb``.
    """

    def __init__(
        self,
        item_emb: np.ndarray | torch.Tensor,
        settings: RetrievalConfig | None = None,
        *,
        item_category: np.ndarray | None = None,
        new_items: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        settings = settings if settings is not None else RetrievalConfig()
        if item_emb.ndim != 2 or item_emb.shape[0] < 2:
            raise ValueError(f"item_emb: expected [num_items >= 2, d] (row 0 = padding), got {tuple(item_emb.shape)}")
        backend = self.resolve_backend(settings, item_emb)
        self.backend = backend
        self.factory = settings.factory
        self.num_items, self.dim = int(item_emb.shape[0]), int(item_emb.shape[1])
        self.item_category = _check_categories(item_category, self.num_items)
        self.index: Any = None
        if backend == "faiss":
            self.index = build_index(item_emb, settings)
        self._emb: torch.Tensor | None = _exact_table(item_emb)
        self._new = _NewItems.of(self._emb, new_items, settings.new_item_share)

    @staticmethod
    def resolve_backend(settings: RetrievalConfig, item_emb: np.ndarray | torch.Tensor) -> str:
        """``"torch"`` or ``"faiss"``: what ``settings.backend`` (``auto``: torch for ``Flat``
        over CUDA embeddings or without FAISS) means for ``settings.factory`` over ``item_emb``."""
        backend, factory = settings.backend, settings.factory
        if backend not in _BACKENDS:
            raise ValueError(f"retrieval.backend: {backend!r} is not one of {list(_BACKENDS)}")
        is_flat = factory.strip() == "Flat"
        if backend == "auto":
            on_cuda = isinstance(item_emb, torch.Tensor) and item_emb.is_cuda
            backend = "torch" if is_flat and (on_cuda or not _has_faiss()) else "faiss"
        if backend == "torch" and not is_flat:
            raise ValueError(f"retrieval.backend: 'torch' is exact search and needs factory 'Flat', got {factory!r}")
        return backend

    @classmethod
    def from_index(
        cls,
        index: Any,
        settings: RetrievalConfig | None = None,
        *,
        item_category: np.ndarray | None = None,
        item_emb: np.ndarray | torch.Tensor | None = None,
        new_items: np.ndarray | torch.Tensor | None = None,
    ) -> Retriever:
        """Wrap a FAISS index from :func:`build_index` / :func:`load_index`, searched with
        ``settings``' ``nprobe`` / ``ef_search`` (default: the index's own); ``settings.factory``
        should be the string the index was built from (kept for display). ``item_emb [N, d]``,
        the embeddings the index was built over, lets :meth:`candidates` fill the rows an
        approximate index leaves short by exact search; without it such rows stay short. It is
        needed for ``new_items`` (the constructor's) with ``settings.new_item_share > 0``."""
        self = cls.__new__(cls)
        if settings is not None:
            set_search_params(index, settings)
        factory = settings.factory if settings is not None else ""
        self.backend, self.factory, self.index = "faiss", factory, index
        self.num_items, self.dim = int(index.ntotal) + 1, int(index.d)
        if item_emb is not None and tuple(item_emb.shape) != (self.num_items, self.dim):
            raise ValueError(
                f"item_emb: expected [{self.num_items}, {self.dim}] like the index, got {tuple(item_emb.shape)}"
            )
        self._emb = None if item_emb is None else _exact_table(item_emb)
        self.item_category = _check_categories(item_category, self.num_items)
        self._new = _NewItems.of(self._emb, new_items, 0.0 if settings is None else settings.new_item_share)
        return self

    def save(self, path: str | Path) -> None:
        """Write the FAISS index (faiss backend only); reload with :func:`load_index` + :meth:`from_index`."""
        if self.index is None:
            raise ValueError("Retriever.save: the torch backend has no index to save; use backend='faiss'")
        save_index(self.index, path)

    def _knn(self, queries: torch.Tensor | np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``queries [Q, d]`` -> ``(item ids [Q, k] int64, scores [Q, k] float32)``; id 0 = no hit."""
        if self.index is not None:
            qn = _as_float32_numpy(queries, "interests")
            scores, labels = self.index.search(qn, k)
            return np.where(labels >= 0, labels + 1, 0), scores
        return self._exact_knn(queries, k)

    def _exact_knn(self, queries: torch.Tensor | np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_knn` by a chunked ``matmul`` + ``topk`` over the embeddings (exact)."""
        emb = self._emb
        assert emb is not None
        q = queries if isinstance(queries, torch.Tensor) else torch.from_numpy(np.asarray(queries))
        q = q.detach().to(emb.device, torch.float32)
        if not torch.isfinite(q).all():
            raise ValueError("interests: contains NaN or infinite values")
        chunk = max(1, _TORCH_CHUNK_BYTES // (4 * self.num_items))
        ids, scores = [], []
        for start in range(0, q.shape[0], chunk):
            block = q[start : start + chunk] @ emb.T  # [chunk, N]
            block[:, 0] = -torch.inf  # padding
            top = torch.topk(block, k, dim=1)
            ids.append(top.indices.cpu())
            scores.append(top.values.cpu())
        return torch.cat(ids).numpy().astype(np.int64), torch.cat(scores).numpy()

    @property
    def on_device(self) -> bool:
        """True when :meth:`top_items` can answer (the torch backend: exact search where the
        embeddings live)."""
        return self.index is None and self._emb is not None

    def top_items(
        self,
        interests: torch.Tensor,
        n: int,
        exclude: torch.Tensor | None = None,
        rows_n: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`search` without leaving the device (torch backend only): nothing here waits
        for the GPU, so a loop over batches queues its work and reads the results back once.

        ``interests [B, K, d]`` (a tensor; moved to the embeddings' device) and ``exclude [B, E]``
        (item ids padded with 0, on that device, or None) -> ``(ids [B, n] int64, scores [B, n]
        float32, interest_of [B, n] int64)`` on the embeddings' device, best first, ``-1 / -inf
        / -1`` where fewer than ``n`` items are left. Each item scores its best inner product over
        the ``K`` interests, as :func:`~recsys.retrieval.aggregate.max_merge` of the per-interest
        hits does (the same items up to ties). Unlike :meth:`search` the interests are not checked
        for NaN (that needs the host); check them when the results are read. ``rows_n [B]``
        (default ``n`` each): the length each row will be cut to, which new items' places follow.
        """
        emb = self._emb
        if emb is None or not self.on_device:
            raise ValueError(f"top_items: the {self.backend} backend searches on the host; use search()")
        if interests.ndim != 3 or interests.shape[2] != self.dim:
            raise ValueError(f"interests: expected [B, K, d={self.dim}], got {tuple(interests.shape)}")
        if n <= 0:
            raise ValueError(f"n: must be > 0, got {n}")
        q = interests.detach().to(emb.device, torch.float32)
        bsz, num_k, _ = q.shape
        k = min(n, self.num_items - 1)
        rows = max(1, _TORCH_CHUNK_BYTES // (4 * num_k * self.num_items))  # users per [rows, K, N] block
        ids, scores, which = [], [], []
        for start in range(0, bsz, rows):
            best, best_k = (q[start : start + rows] @ emb.T).max(dim=1)  # [rows, K, N] -> [rows, N]
            best[:, 0] = -torch.inf  # padding
            if exclude is not None:
                best.scatter_(1, exclude[start : start + rows], -torch.inf)  # id 0 (padding) is -inf already
            top = torch.topk(best, k, dim=1)
            ids.append(top.indices)
            scores.append(top.values)
            which.append(best_k.gather(1, top.indices))
        top_ids, top_scores, top_k = torch.cat(ids), torch.cat(scores), torch.cat(which)
        missing = top_scores == -torch.inf
        top_ids, top_k = top_ids.masked_fill(missing, -1), top_k.masked_fill(missing, -1)
        if k < n:  # a catalogue smaller than n
            pad = (0, n - k)
            top_ids = torch.nn.functional.pad(top_ids, pad, value=-1)
            top_scores = torch.nn.functional.pad(top_scores, pad, value=-torch.inf)
            top_k = torch.nn.functional.pad(top_k, pad, value=-1)
        return self.keep_new_items(interests, (top_ids, top_scores, top_k), n if rows_n is None else rows_n, exclude)

    def keep_new_items(
        self, interests: torch.Tensor | np.ndarray, top: _Top, n: int | Any, exclude: Exclude = None
    ) -> _Top:
        """``top``, merged lists ``[B, W]`` (numpy or torch, as :meth:`search` and :meth:`top_items`
        return them) for ``interests [B, K, d]``, with the places kept for new items filled
        (:func:`~recsys.retrieval.new_items.keep_new_items`): ``n`` (a scalar or ``[B]``) is each
        row's length and ``exclude`` (as :meth:`candidates` takes it) what the row never returns.
        ``top`` itself where the retriever keeps no places."""
        if self._new is None:
            return top
        host = isinstance(top[0], np.ndarray)
        device = self._new.is_new.device
        bsz = top[0].shape[0]
        lengths = torch.broadcast_to(torch.as_tensor(n).to(device).long(), (bsz,))
        places = reserved_places(self._new.share, lengths)
        if bsz == 0 or int(places.max()) == 0:
            return top
        exclusions = self._new.exclusions(exclude, bsz, self.num_items)
        new_top = self._new.top(torch.as_tensor(interests), int(places.max()), exclusions)
        lists = tuple(torch.as_tensor(a).to(device) for a in top)
        out = keep_new_items((lists[0], lists[1], lists[2]), new_top, self._new.is_new, lengths, places)
        if host:
            return out[0].cpu().numpy(), out[1].cpu().numpy(), out[2].cpu().numpy()
        return out

    def candidates(
        self, interests: torch.Tensor | np.ndarray, n: int | np.ndarray, exclude: Exclude = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw per-interest hits, deep enough that merging yields ``n`` items wherever the
        catalogue holds them.

        ``interests [B, K, d]`` and ``n`` (a scalar or ``[B]``) -> ``(ids, scores,
        interest_of)``, each ``[B, K·k]`` with ``k = min(max(n + E), num_items - 1)``; row ``b``
        keeps each interest's top ``n[b] + E[b]`` (``E`` = that row's distinct excluded items)
        and marks excluded items, missing hits and deeper slots with id ``-1`` and score
        ``-inf``. Each interest's own top ``n + E`` contains every item whose best interest it
        is among the user's true top ``n``, so max-merging these is exact for exact indexes.

        An approximate index (HNSW, IVF, PQ) may return fewer distinct items than that, e.g.
        HNSW over inner products reaches only part of its graph. Rows holding fewer than
        ``min(n, eligible items)`` distinct items are searched again exactly over the
        embeddings (when the retriever has them), so no list is short while the catalogue
        allows a full one.
        """
        if interests.ndim != 3 or interests.shape[2] != self.dim:
            raise ValueError(f"interests: expected [B, K, d={self.dim}], got {tuple(interests.shape)}")
        bsz, num_k, _ = interests.shape
        rows_n = np.broadcast_to(np.asarray(n, dtype=np.int64), (bsz,))
        if bsz and rows_n.min() <= 0:
            raise ValueError(f"n: must be > 0, got {int(rows_n.min())}")
        keys = np.empty(0, np.int64) if exclude is None else _exclude_keys(exclude, bsz, self.num_items)
        excluded = np.bincount(keys // self.num_items, minlength=bsz)  # [B] distinct excluded items
        depth = rows_n + excluded  # [B] each row's own search depth
        k = int(min(depth.max(initial=1), self.num_items - 1))
        hits = self._knn(interests.reshape(bsz * num_k, self.dim), k)
        ids, scores, interest_of = self._mark(*hits, num_k, keys, depth)
        short = np.flatnonzero(_distinct_valid(ids) < np.minimum(rows_n, self.num_items - 1 - excluded))
        if len(short) and self.index is not None and self._emb is not None:
            queries = interests[short] if isinstance(interests, np.ndarray) else interests[torch.from_numpy(short)]
            sub_keys = keys[np.isin(keys // self.num_items, short)]
            sub_keys = np.searchsorted(short, sub_keys // self.num_items) * self.num_items + sub_keys % self.num_items
            exact = self._exact_knn(queries.reshape(len(short) * num_k, self.dim), k)
            ids[short], scores[short], interest_of[short] = self._mark(*exact, num_k, sub_keys, depth[short])
        return ids, scores, interest_of

    def _mark(
        self, ids: np.ndarray, scores: np.ndarray, num_k: int, keys: np.ndarray, depth: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-interest hits ``[B·K, k]`` -> ``[B, K·k]`` ids, scores and interests, with
        missing hits, excluded items (``keys``: sorted ``row * num_items + item``) and slots
        deeper than the row's ``depth`` as ``-1 / -inf / -1``."""
        bsz, k = len(depth), ids.shape[1]
        ids = ids.reshape(bsz, num_k * k)  # row b: interest 0's k hits, then interest 1's, ...
        scores = scores.reshape(bsz, num_k * k)
        interest_of = np.broadcast_to(np.repeat(np.arange(num_k, dtype=np.int64), k), ids.shape)
        rank = np.tile(np.arange(k), num_k)  # [K * k] rank within its interest
        invalid = (ids <= 0) | (rank[None, :] >= depth[:, None])
        if len(keys):
            row_keys = np.arange(bsz, dtype=np.int64)[:, None] * self.num_items + ids
            invalid |= np.isin(row_keys, keys)
        return (
            np.where(invalid, -1, ids),
            np.where(invalid, np.float32(-np.inf), scores.astype(np.float32)),
            np.where(invalid, -1, interest_of),
        )

    def search(
        self,
        interests: torch.Tensor | np.ndarray,
        n: int,
        exclude: Exclude = None,
        *,
        diversity_lambda: float = 0.0,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``n`` distinct items per user.

        ``interests [B, K, d]`` (numpy or torch, any device) -> ``(ids [B, n] int64,
        scores [B, n] float32, interest_of [B, n] int64)``, best first. Each item scores
        its best inner product over the ``K`` interests; padding and ``exclude``'d items
        never appear. Where fewer than ``n`` distinct items exist, the row ends with id
        ``-1``, score ``-inf``, interest ``-1``. With ``diversity_lambda > 0`` the items are
        picked by ComiRec's greedy category-diversity rule instead (needs ``item_category``).
        """
        ids, scores, interest_of = self.candidates(interests, n, exclude)
        if diversity_lambda > 0:
            if self.item_category is None:
                raise ValueError("diversity_lambda > 0 needs item categories: pass item_category to Retriever")
            picked = diverse_merge(ids, scores, interest_of, self.item_category, n, diversity_lambda)
            return self.keep_new_items(interests, picked, n, exclude)
        if diversity_lambda < 0:
            raise ValueError(f"diversity_lambda: must be >= 0, got {diversity_lambda}")
        return self.keep_new_items(interests, max_merge(ids, scores, interest_of, n), n, exclude)


@dataclass
class _NewItems:
    """The items without training clicks, searched apart for the places a list keeps for them."""

    share: float  # the share of each list's places kept for them
    is_new: torch.Tensor  # [num_items] bool, on the embeddings' device
    ids: torch.Tensor  # [h + 1] int64: row j of ``search`` is item ids[j] (row 0: padding, -1)
    position: torch.Tensor  # [num_items] int64: an item's row in ``search``, 0 for the others
    search: Retriever  # exact search over [padding, their h rows]

    @classmethod
    def of(
        cls, emb: torch.Tensor | None, new_items: np.ndarray | torch.Tensor | None, share: float
    ) -> _NewItems | None:
        """None where no place is kept (no share, no new item); ``emb`` ``[num_items, d]`` is needed otherwise."""
        if new_items is None or share <= 0:
            return None
        mask = torch.as_tensor(new_items).detach().cpu().bool().clone()
        if emb is None:
            raise ValueError("new_items: keeping places for them needs the item embeddings (item_emb)")
        if mask.shape != (emb.shape[0],):
            raise ValueError(f"new_items: expected [{emb.shape[0]}] bool like the embeddings, got {tuple(mask.shape)}")
        mask[0] = False
        ids = torch.nonzero(mask).squeeze(1)  # [h]
        if not len(ids):
            return None
        position = torch.zeros(len(mask), dtype=torch.int64)
        position[ids] = torch.arange(1, len(ids) + 1)
        rows = torch.cat([emb.new_zeros(1, emb.shape[1]), emb[ids.to(emb.device)]])  # [h + 1, d]
        return cls(
            share,
            mask.to(emb.device),
            torch.cat([ids.new_full((1,), -1), ids]).to(emb.device),
            position.to(emb.device),
            Retriever(rows, RetrievalConfig(backend="torch")),
        )

    def exclusions(self, exclude: Exclude, bsz: int, num_items: int) -> torch.Tensor | None:
        """``exclude`` (as :meth:`Retriever.candidates` takes it) as ``[B, E]`` rows of ``search``, padded with 0."""
        if exclude is None:
            return None
        if isinstance(exclude, torch.Tensor) and exclude.ndim == 2:
            return self.position[exclude.to(self.position.device).clamp_min(0)]
        keys = _exclude_keys(exclude, bsz, num_items)
        rows, items = keys // num_items, keys % num_items
        sub = self.position.cpu().numpy()[items]
        rows, sub = rows[sub > 0], sub[sub > 0]
        counts = np.bincount(rows, minlength=bsz)
        col = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)  # keys are sorted by row
        dense = np.zeros((bsz, max(1, int(counts.max(initial=0)))), dtype=np.int64)
        dense[rows, col] = sub
        return torch.from_numpy(dense).to(self.position.device)

    def top(self, interests: torch.Tensor, m: int, exclude: torch.Tensor | None) -> _Top:
        """The best ``m`` new items per row, as item ids (``[B, m]`` each, ``-1 / -inf / -1`` past the last)."""
        ids, scores, which = self.search.top_items(interests, m, exclude)
        return torch.where(ids > 0, self.ids[ids.clamp_min(0)], -1), scores, which


def _exact_table(item_emb: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``item_emb`` as a float32 torch tensor on its own device (numpy: the CPU), checked finite."""
    emb = item_emb if isinstance(item_emb, torch.Tensor) else torch.from_numpy(np.asarray(item_emb))
    emb = emb.detach().float()
    if not torch.isfinite(emb).all():
        raise ValueError("item_emb: contains NaN or infinite values")
    return emb.contiguous()


def _distinct_valid(ids: np.ndarray) -> np.ndarray:
    """``[B]`` distinct ids ``> 0`` in each row of ``ids [B, M]``."""
    ordered = np.sort(ids, axis=1)
    first = ordered > 0
    first[:, 1:] &= ordered[:, 1:] != ordered[:, :-1]
    return first.sum(axis=1)


def _check_categories(item_category: np.ndarray | None, num_items: int) -> np.ndarray | None:
    if item_category is None:
        return None
    cats = np.asarray(item_category, dtype=np.int64)
    if cats.shape != (num_items,):
        raise ValueError(f"item_category: expected [{num_items}] (one per item id), got {cats.shape}")
    return cats


def _has_faiss() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True
