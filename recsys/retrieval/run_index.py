"""A run's saved ANN index: build, measure against exact search, save beside the run, reopen.

``recsys index RUN --factory F`` writes two files under ``RUN/index/``::

    <slug>.faiss   the FAISS index over the run's item embeddings (label j = item j + 1)
    <slug>.json    what it is: factory (as asked and as built), nprobe, ef_search,
                   ef_construction, num_items, dim, build seconds, a SHA-1 of the embeddings it indexes, and the recall of
                   its top-n against exact search on the run's held-out (test) users

``slug`` is the factory string as asked for, made file-safe (``"HNSW32,Flat"`` ->
``HNSW32_Flat``). Both are recorded in the run's manifest (:mod:`recsys.integrity`).
:func:`open_run_index` (used by ``recsys recommend`` and ``recsys serve``) verifies them, loads
the saved index when its embedding hash matches the weights, and otherwise builds the index in
memory.

IVF factories ask for ``nlist`` lists; FAISS wants at least 39 training vectors per list, so
:func:`clamp_ivf` lowers ``nlist`` to ``num_items // 39`` (at least 1) on small catalogues and
says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recsys import integrity
from recsys.retrieval.index import Retriever, build_index, load_index, save_index

if TYPE_CHECKING:
    from recsys.data.split import EvalSet
    from recsys.runs import LoadedRun

__all__ = [
    "IndexReport", "ann_recall", "build_run_index", "clamp_ivf", "embedding_hash", "index_paths",
    "index_slug", "open_run_index", "run_item_embeddings",
]

INDEX_DIR = "index"
MIN_POINTS_PER_LIST = 39  # FAISS warns below this many training vectors per IVF list
Log = Callable[[str], None]


@dataclass
class IndexReport:
    """What :func:`build_run_index` built and measured (also saved as ``<slug>.json``).

    ``recall`` is the mean over ``users`` test users of ``|ANN top-n ∩ exact top-n| / |exact
    top-n|`` after max-merging the ``K`` interests; ``*_users_per_s`` time those searches
    (one index call per batch of users, ``K`` queries per user).
    """

    factory: str  # as built (IVF lists possibly clamped)
    requested_factory: str
    nprobe: int
    ef_search: int
    ef_construction: int
    num_items: int  # catalogue size, padding excluded
    dim: int
    build_s: float
    embedding_sha1: str
    n: int
    users: int
    recall: float
    exact_users_per_s: float
    ann_users_per_s: float
    index_file: str
    created: str


def index_slug(factory: str) -> str:
    """A file-safe name for ``factory``: ``"HNSW32,Flat"`` -> ``"HNSW32_Flat"``."""
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", factory.strip()).strip("_.")
    if not slug:
        raise ValueError(f"retrieval.factory: {factory!r} is empty")
    return slug


def index_paths(run_dir: str | Path, factory: str) -> tuple[Path, Path]:
    """``(RUN/index/<slug>.faiss, RUN/index/<slug>.json)`` for ``factory`` as asked for."""
    base = Path(run_dir) / INDEX_DIR / index_slug(factory)
    return base.with_suffix(".faiss"), base.with_suffix(".json")


def clamp_ivf(factory: str, num_vectors: int) -> tuple[str, str | None]:
    """``factory`` with its ``IVF<nlist>`` lowered to what ``num_vectors`` can train, and a
    warning saying so (``None`` when nothing changed)."""
    match = re.search(r"IVF(\d+)", factory)
    if match is None:
        return factory, None
    nlist = int(match.group(1))
    allowed = max(1, num_vectors // MIN_POINTS_PER_LIST)
    if nlist <= allowed:
        return factory, None
    clamped = factory[: match.start(1)] + str(allowed) + factory[match.end(1) :]
    return clamped, (
        f"{factory!r} asks for {nlist} IVF lists but {num_vectors} items train at most {allowed} "
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


def run_item_embeddings(run: LoadedRun) -> np.ndarray:
    """``[num_items, d]`` float32 item embeddings of the run's model (row 0 = padding)."""
    with torch.inference_mode():
        return run.model.item_embeddings().detach().to("cpu", torch.float32).numpy().copy()


def _test_interests(run: LoadedRun, eval_set: EvalSet, batch_size: int) -> list[np.ndarray]:
    """The model's interests ``[b, K, d]`` for each batch of ``eval_set``'s users."""
    device = next(run.model.parameters()).device
    out = []
    with torch.inference_mode():
        for start in range(0, len(eval_set.lengths), batch_size):
            seq = torch.from_numpy(np.asarray(eval_set.inputs[start : start + batch_size], dtype=np.int64))
            lengths = torch.from_numpy(np.asarray(eval_set.lengths[start : start + batch_size], dtype=np.int64))
            out.append(run.model.interests(seq.to(device), lengths.to(device)).float().cpu().numpy())
    return out


def _build(emb: np.ndarray, factory: str, nprobe: int, ef_search: int, ef_construction: int,
           log: Log) -> tuple[Any, str, float]:
    """Build ``factory`` (IVF lists clamped to the catalogue, with a warning) over ``emb``:
    ``(index, factory as built, build seconds)``."""
    built_factory, warning = clamp_ivf(factory, len(emb) - 1)
    if warning:
        log(f"warning: {warning}")
    t0 = time.perf_counter()
    index = build_index(emb, built_factory, nprobe=nprobe, ef_search=ef_search, ef_construction=ef_construction)
    return index, built_factory, time.perf_counter() - t0


def _timed_search(retriever: Retriever, batches: list[np.ndarray], n: int) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    ids = np.concatenate([retriever.search(b, n)[0] for b in batches])
    return ids, time.perf_counter() - t0


def build_run_index(
    run: LoadedRun,
    factory: str,
    *,
    nprobe: int = 16,
    ef_search: int = 128,
    ef_construction: int = 80,
    n: int = 50,
    batch_size: int = 2048,
    log: Log = print,
) -> IndexReport:
    """Build ``factory`` over ``run``'s item embeddings, save it under ``RUN/index/``, and
    measure it against exact (``Flat``) search on the run's test users.

    Returns the :class:`IndexReport` that is also written as ``<slug>.json``.
    """
    if n <= 0:
        raise ValueError(f"--n: must be > 0, got {n}")
    emb = run_item_embeddings(run)
    index, built_factory, build_s = _build(emb, factory, nprobe, ef_search, ef_construction, log)
    index_file, meta_file = index_paths(run.path, factory)
    index_file.parent.mkdir(parents=True, exist_ok=True)
    _save_recorded(run.path, index_file, lambda tmp: save_index(index, tmp))

    eval_set = run.split.test
    batches = _test_interests(run, eval_set, batch_size)
    exact = Retriever(emb, "Flat", backend="faiss")
    ann = Retriever.from_index(index)
    exact_ids, exact_s = _timed_search(exact, batches, n)
    ann_ids, ann_s = _timed_search(ann, batches, n)
    users = len(exact_ids)
    report = IndexReport(
        factory=built_factory, requested_factory=factory, nprobe=nprobe, ef_search=ef_search,
        ef_construction=ef_construction, num_items=len(emb) - 1, dim=int(emb.shape[1]), build_s=build_s,
        embedding_sha1=embedding_hash(emb), n=n, users=users,
        recall=float(np.nanmean(ann_recall(ann_ids, exact_ids))) if users else float("nan"),
        exact_users_per_s=users / max(exact_s, 1e-9), ann_users_per_s=users / max(ann_s, 1e-9),
        index_file=str(index_file), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    _save_recorded(run.path, meta_file, lambda tmp: tmp.write_text(json.dumps(asdict(report), indent=2) + "\n"))
    return report


def _save_recorded(run_dir: Path, path: Path, write: Callable[[Path], None]) -> None:
    """``write`` a temporary file beside ``path``, then move it into place, recorded in the
    run's manifest."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.chmod(tmp, integrity.default_file_mode())
        integrity.replace_recorded(tmp, path, run_dir)
    finally:
        tmp.unlink(missing_ok=True)


def _load_saved(run: LoadedRun, factory: str, index_file: Path, meta_file: Path) -> tuple[dict, Any]:
    """The saved index's description and a loader for it, both verified against the manifest."""
    advice = f"rebuild it with `recsys index {run.path} --factory {factory!r}`, or delete it"
    for path in (meta_file, index_file):
        integrity.verify(run.path, path, advice)
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise integrity.IntegrityError(f"{meta_file}: invalid JSON ({err}); {advice}") from None
    if not isinstance(meta, dict):
        raise integrity.IntegrityError(f"{meta_file}: not a JSON object; {advice}")

    def load() -> Any:
        try:
            return load_index(index_file)
        except RuntimeError as err:  # FAISS: truncated or not an index
            reason = str(err).strip().splitlines()[0] if str(err).strip() else "unreadable"
            raise integrity.IntegrityError(f"{index_file}: cannot be read ({reason[:200]}); {advice}") from None

    return meta, load


def open_run_index(
    run: LoadedRun,
    factory: str | None = None,
    *,
    nprobe: int | None = None,
    ef_search: int | None = None,
    log: Log = print,
) -> tuple[Retriever, str]:
    """A :class:`Retriever` for ``run`` with ``factory`` (default: the run's
    ``retrieval.factory``) and a one-line description of where it came from.

    A saved index (``recsys index``) is loaded when its embedding hash matches the run's
    weights, with its saved ``nprobe`` / ``ef_search`` unless given here; otherwise the index
    is built in memory (``Flat`` is instant; HNSW over 100k items takes tens of seconds).
    """
    cfg = run.cfg.retrieval
    factory = factory or cfg.factory
    emb = run_item_embeddings(run)
    categories = run.dataset.item_category
    index_file, meta_file = index_paths(run.path, factory)
    if index_file.is_file() and meta_file.is_file():
        meta, load = _load_saved(run, factory, index_file, meta_file)
        if meta.get("embedding_sha1") == embedding_hash(emb):
            index = load()
            nprobe = nprobe if nprobe is not None else int(meta["nprobe"])
            ef_search = ef_search if ef_search is not None else int(meta["ef_search"])
            retriever = Retriever.from_index(index, nprobe=nprobe, ef_search=ef_search, item_category=categories)
            retriever.factory = meta["factory"]
            return retriever, f"{meta['factory']} loaded from {index_file} (nprobe={nprobe}, ef_search={ef_search})"
        log(f"warning: {index_file} was built from other weights; building {factory!r} in memory instead")
    nprobe = nprobe if nprobe is not None else cfg.nprobe
    ef_search = ef_search if ef_search is not None else cfg.ef_search
    index, built_factory, build_s = _build(emb, factory, nprobe, ef_search, cfg.ef_construction, log)
    retriever = Retriever.from_index(index, item_category=categories)
    retriever.factory = built_factory
    return retriever, (
        f"{built_factory} built in memory in {build_s:.1f}s "
        f"(nprobe={nprobe}, ef_search={ef_search}; save it with `recsys index`)"
    )
