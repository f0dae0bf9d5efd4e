"""A run's saved ANN index: build, measure against exact search, save beside the run, reopen.

``recsys index RUN --factory F`` writes two files under the run's ``index/`` folder (names from
:meth:`RunDir.index_files`)::

    <slug>.faiss   the FAISS index over the run's item embeddings (label j = item j + 1)
    <slug>.json    what it is: factory (as asked and as built), nprobe, ef_search,
                   ef_construction, num_items, dim, build seconds, a SHA-1 of the embeddings it
                   indexes, how its search was chosen, and the recall of its top-n against exact
                   search on the run's held-out (test) users

The search setting (``nprobe`` of an IVF index, ``ef_search`` of an HNSW one) is chosen from a
measurement on the run itself unless given: starting from the run's ``retrieval`` value, it is
widened until the index's top n holds :data:`~recsys.retrieval.index.TARGET_RECALL` of exact
search's for the interests of a sample of test users
(:func:`~recsys.retrieval.index.calibrate`), and saved with the index. An index built in memory
(a factory without a saved index) is calibrated the same way.

Both are recorded in the run's manifest (:mod:`recsys.io.manifest`). :func:`open_run_index`
(used by ``recsys recommend``, ``recsys serve`` and ``Run.recommend``) verifies them, loads the
saved index when its embedding hash matches the weights, and otherwise builds the index in
memory; either way it says which search answers and the recall measured for it. IVF factories
are clamped to what the catalogue can train (:func:`recsys.retrieval.index.clamp_ivf`), with a
warning.

The settings travel as one :class:`~recsys.config.RetrievalConfig`; :func:`retrieval_settings`
is where the options a user gives (``--factory``, ``--nprobe``, ...) meet the run's
``retrieval`` section and a saved index's own settings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recsys.config import RetrievalConfig, with_values
from recsys.io import IntegrityError
from recsys.items import new_items
from recsys.retrieval.index import (
    TARGET_RECALL,
    Calibration,
    Retriever,
    ann_recall,
    build_index,
    calibrate,
    clamp_ivf,
    embedding_hash,
    load_index,
    search_params,
    search_setting,
    with_search,
    write_index,
)
from recsys.run.experiment import LoadedRun
from recsys.text import count

__all__ = ["IndexReport", "build_run_index", "open_run_index", "retrieval_settings"]

Log = Callable[[str], None]
CALIBRATION_USERS = 10_000  # test users (a seeded sample of more) whose interests choose a search setting
RECALL_N = 50  # the top-n an index built in memory is calibrated at (recommend's default n)


@dataclass
class IndexReport:
    """What :func:`build_run_index` built and measured (also saved as ``<slug>.json``).

    ``recall`` is the mean over ``users`` test users of ``|ANN top-n ∩ exact top-n| / |exact
    top-n|`` after max-merging the ``K`` interests, and ``short_lists`` the share of them whose
    ANN list held fewer items than the exact one, both of the index's own answers (served lists
    are filled by exact search, :meth:`Retriever.candidates`); ``*_users_per_s`` time those
    searches (one index call per batch of users, ``K`` queries per user). ``nprobe`` /
    ``ef_search`` are the values the index is saved and searched with; ``calibration`` says how
    the one its kind has was chosen for ``target_recall`` (:meth:`Calibration.describe`).
    """

    factory: str  # as built (IVF lists possibly clamped)
    requested_factory: str
    nprobe: int
    ef_search: int
    search_params: str  # the search settings this kind of index has, e.g. "ef_search=64" ("" for Flat)
    ef_construction: int
    num_items: int  # catalogue size, padding excluded
    dim: int
    build_s: float
    embedding_sha1: str
    n: int
    users: int
    recall: float
    short_lists: float  # share of users whose ANN list held fewer than n items (filled by exact search when served)
    exact_users_per_s: float
    ann_users_per_s: float
    index_file: str
    created: str
    target_recall: float = TARGET_RECALL
    calibration: str = ""


def _build(emb: np.ndarray, settings: RetrievalConfig, log: Log, progress: bool) -> tuple[Any, RetrievalConfig, float]:
    """Build ``settings.factory`` (IVF lists clamped to the catalogue, with a warning) over
    ``emb [N, d]``: ``(index, the settings as built, build seconds)``."""
    built_factory, warning = clamp_ivf(settings.factory, len(emb) - 1)
    if warning:
        log(f"warning: {warning}")
    built = dataclasses.replace(settings, factory=built_factory)
    t0 = time.perf_counter()
    index = build_index(emb, built, progress=progress)
    return index, built, time.perf_counter() - t0


def retrieval_settings(
    run: LoadedRun,
    factory: str | None = None,
    *,
    nprobe: int | None = None,
    ef_search: int | None = None,
    ef_construction: int | None = None,
    new_item_share: float | None = None,
    saved: bool = True,
) -> RetrievalConfig:
    """The settings a request for ``factory`` means: the run's ``retrieval`` section; with
    ``saved``, the settings a saved ``recsys index`` of that factory was built and measured with;
    then each value given here (``None``: not given). Checked like ``--set retrieval.KEY=VALUE``:
    a bad value is a ``ConfigError`` naming the key.

    Without ``factory``: with ``saved``, that of the run's most recently saved index (it was built
    to be used: ``recsys index RUN --factory F``, then ``recsys recommend RUN`` searches ``F``),
    else, or when there is none, the run's ``retrieval.factory``."""
    if not factory:
        factory = (saved_factory(run) if saved else None) or run.cfg.retrieval.factory
    values: dict[str, Any] = {"factory": factory}
    if saved:
        values.update(_saved_settings(run, factory))
    given: dict[str, float | None] = {"nprobe": nprobe, "ef_search": ef_search, "ef_construction": ef_construction}
    given["new_item_share"] = new_item_share
    values.update({key: value for key, value in given.items() if value is not None})
    return with_values(run.cfg, {f"retrieval.{key}": value for key, value in values.items()}).retrieval


def saved_factory(run: LoadedRun) -> str | None:
    """The factory (as asked for) of the run's most recently saved index, or ``None`` when it
    has none (its description verified against the manifest)."""
    saved = run.dir.saved_index_descriptions()
    if not saved:
        return None
    factory = _saved_meta(run, None, saved[0]).get("requested_factory")
    if not isinstance(factory, str) or not factory.strip():
        raise IntegrityError(f"{saved[0]}: names no factory; {_rebuild_advice(run, None)}")
    return factory


def _saved_settings(run: LoadedRun, factory: str) -> dict[str, int]:
    """``nprobe`` / ``ef_search`` / ``ef_construction`` of the saved index of ``factory``
    (verified against the manifest), or nothing when there is none."""
    index_file, meta_file = run.dir.index_files(factory)
    if not (index_file.is_file() and meta_file.is_file()):
        return {}
    meta = _saved_meta(run, factory, meta_file)
    return {key: int(meta[key]) for key in ("nprobe", "ef_search", "ef_construction") if key in meta}


def _calibration_users(count: int) -> np.ndarray:
    """Sorted positions of up to :data:`CALIBRATION_USERS` of ``count`` test users, a seeded sample."""
    if count <= CALIBRATION_USERS:
        return np.arange(count)
    return np.sort(np.random.default_rng(0).choice(count, CALIBRATION_USERS, replace=False))


def _calibrated(
    index: Any,
    settings: RetrievalConfig,
    interests: np.ndarray,
    exact_ids: np.ndarray,
    *,
    target: float,
    widen: bool,
    log: Log,
) -> tuple[RetrievalConfig, Calibration]:
    """:func:`calibrate` ``index`` for the queries ``interests`` and their exact top-n ``exact_ids``:
    ``settings`` with the value chosen, and the measurement (a warning when the target is out of reach)."""
    calibration = calibrate(index, interests, exact_ids, settings, target=target, widen=widen)
    settings = with_search(settings, calibration.key, calibration.value)
    if calibration.reached:
        return settings, calibration
    found = f"{settings.factory} holds {calibration.recall:.3f} of exact search's top {calibration.n}"
    if widen or not calibration.key:
        log(
            f"warning: {found} at its widest search ({calibration.describe()}), below {target:g}; exact search "
            "(Flat) or another factory would give the lists evaluation measured"
        )
    else:
        log(
            f"note: {found} at {calibration.key}={calibration.value} as given, below {target:g}; without "
            f"--{calibration.key.replace('_', '-')} it is widened until it reaches that"
        )
    return settings, calibration


def _timed_search(retriever: Retriever, batches: list[np.ndarray], n: int) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    ids = np.concatenate([retriever.search(b, n)[0] for b in batches])
    return ids, time.perf_counter() - t0


def build_run_index(
    run: LoadedRun,
    settings: RetrievalConfig,
    *,
    n: int = 50,
    batch_size: int = 2048,
    target: float = TARGET_RECALL,
    widen: bool = True,
    log: Log = print,
    progress: bool = False,
) -> IndexReport:
    """Build ``settings.factory`` over ``run``'s item embeddings, choose its search setting for
    ``target`` recall of exact search's top ``n`` on a sample of the run's test users (from
    ``settings``' value up; ``widen=False`` keeps that value, one the user chose), save it in the
    run's ``index/`` folder, and measure it against exact (``Flat``) search on all test users.

    Returns the :class:`IndexReport` that is also written as ``<slug>.json``.
    """
    if n <= 0:
        raise ValueError(f"--n: must be > 0, got {n}")
    emb = run.item_table()
    index, built, build_s = _build(emb, settings, log, progress)
    test = run.split.test
    interests = run.interests(test.inputs, test.lengths, batch_size)
    batches = [interests[i : i + batch_size] for i in range(0, len(interests), batch_size)]
    exact = Retriever(emb, RetrievalConfig(factory="Flat", backend="faiss"))
    exact_ids, exact_s = _timed_search(exact, batches, n)
    sample = _calibration_users(len(exact_ids))
    built, calibration = _calibrated(
        index, built, interests[sample], exact_ids[sample], target=target, widen=widen, log=log
    )
    index_file, meta_file = _save_index(run, settings.factory, index)
    ann = Retriever.from_index(index)  # no embeddings: the index's own answers, short lists unfilled
    ann_ids, ann_s = _timed_search(ann, batches, n)
    users = len(exact_ids)
    report = IndexReport(
        factory=built.factory,
        requested_factory=settings.factory,
        nprobe=built.nprobe,
        ef_search=built.ef_search,
        search_params=search_params(index),
        ef_construction=settings.ef_construction,
        num_items=len(emb) - 1,
        dim=int(emb.shape[1]),
        build_s=build_s,
        embedding_sha1=embedding_hash(emb),
        n=n,
        users=users,
        recall=float(np.nanmean(ann_recall(ann_ids, exact_ids))) if users else float("nan"),
        short_lists=float(np.mean((ann_ids > 0).sum(axis=1) < (exact_ids > 0).sum(axis=1))) if users else 0.0,
        exact_users_per_s=users / max(exact_s, 1e-9),
        ann_users_per_s=users / max(ann_s, 1e-9),
        index_file=str(index_file),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        target_recall=target,
        calibration=calibration.describe(),
    )
    run.dir.write_json(meta_file.relative_to(run.path).as_posix(), asdict(report))
    return report


def _save_index(run: LoadedRun, factory: str, index: Any) -> tuple[Path, Path]:
    """Write ``index`` into the run's ``index/`` folder (through the manifest); the paths of the
    index file and of its description (``<slug>.json``, written by the caller)."""
    index_file, meta_file = run.dir.index_files(factory)
    index_file.parent.mkdir(parents=True, exist_ok=True)
    run.dir.save_file(index_file.relative_to(run.dir.path), lambda tmp: write_index(index, tmp))
    return index_file, meta_file


def _rebuild_advice(run: LoadedRun, factory: str | None) -> str:
    named = repr(factory) if factory else "F"
    return f"rebuild it with `recsys index {run.path} --factory {named}`, or delete it"


def _saved_meta(run: LoadedRun, factory: str | None, meta_file: Path) -> dict[str, Any]:
    """The saved index's description (``<slug>.json``), verified against the manifest."""
    advice = _rebuild_advice(run, factory)
    try:
        meta = run.dir.read_json(meta_file.relative_to(run.path).as_posix(), advice)
    except IntegrityError:
        raise
    except ValueError as err:  # invalid JSON, already naming the file
        raise IntegrityError(f"{err}; {advice}") from None
    if not isinstance(meta, dict):
        raise IntegrityError(f"{meta_file}: not a JSON object; {advice}")
    return meta


def _load_saved(run: LoadedRun, factory: str, index_file: Path, meta_file: Path) -> tuple[dict, Callable[[], Any]]:
    """The saved index's description and a loader for it, both verified against the manifest."""
    advice = _rebuild_advice(run, factory)
    run.dir.verify(index_file, advice)
    meta = _saved_meta(run, factory, meta_file)

    def load() -> Any:
        try:
            return load_index(index_file)
        except RuntimeError as err:  # FAISS: truncated or not an index
            reason = str(err).strip().splitlines()[0] if str(err).strip() else "unreadable"
            raise IntegrityError(f"{index_file}: cannot be read ({reason[:200]}); {advice}") from None

    return meta, load


def open_run_index(
    run: LoadedRun,
    settings: RetrievalConfig | None = None,
    *,
    log: Log = print,
    progress: bool = False,
    widen: bool = True,
) -> tuple[Retriever, str]:
    """A :class:`Retriever` for ``run`` with ``settings`` (default: :func:`retrieval_settings`
    of the run's own factory) and a one-line description of the search: exact, or the index with
    the recall of exact search's top n measured for its search setting.

    With ``Flat`` and ``settings.backend`` resolving to torch (``auto``: the model is on a GPU,
    or FAISS is missing) it is exact search on the model's device. Otherwise a saved index
    (``recsys index``) of ``settings.factory`` is loaded when its embedding hash matches the
    run's weights, searched with ``settings.nprobe`` / ``ef_search`` (the saved ones unless others
    were given). Otherwise the index is built in memory (``Flat`` is instant; HNSW over 100k
    items takes tens of seconds) and its search setting chosen as ``recsys index`` chooses it, at
    top :data:`RECALL_N` (``widen=False``: ``settings``' value, measured).
    """
    settings = settings if settings is not None else retrieval_settings(run)
    factory = settings.factory
    items: dict[str, Any] = {"item_category": run.dataset.catalogue_category, "new_items": new_items(run.model)}
    with torch.inference_mode():
        live = run.model.item_embeddings().detach()  # [N, d] where the model runs
    if factory.strip() == "Flat" and Retriever.resolve_backend(settings, live) == "torch":
        retriever = Retriever(live, dataclasses.replace(settings, backend="torch"), **items)
        return retriever, f"Flat: exact search with torch on {live.device}"
    emb = run.item_table()
    index_file, meta_file = run.dir.index_files(factory)
    if index_file.is_file() and meta_file.is_file():
        meta, load = _load_saved(run, factory, index_file, meta_file)
        if meta.get("embedding_sha1") == embedding_hash(emb):
            as_saved = dataclasses.replace(settings, factory=meta["factory"])
            index = load()
            retriever = Retriever.from_index(index, as_saved, item_emb=emb, **items)
            shown = _shown_params(index, _saved_recall(index, meta))
            return retriever, f"{meta['factory']} loaded from {index_file}{shown}"
        built_over = meta.get("num_items")
        if isinstance(built_over, int) and built_over != len(emb) - 1:  # items added since (recsys.run.new_items)
            log(
                f"warning: {index_file} was built over {count(built_over, 'item')}, the run has {len(emb) - 1:,} now; "
                f"building {factory!r} in memory instead (`recsys index {run.path}` saves one over them all)"
            )
        else:
            log(f"warning: {index_file} was built from other weights; building {factory!r} in memory instead")
    index, built, build_s = _build(emb, settings, log, progress)
    measured = "exact search"  # Flat: nothing to save or measure
    if factory.strip() != "Flat":
        test = run.split.test
        sample = _calibration_users(len(test.users))
        interests = run.interests(test.inputs[sample], test.lengths[sample])
        exact_ids = Retriever(emb, RetrievalConfig(factory="Flat", backend="faiss")).search(interests, RECALL_N)[0]
        built, calibration = _calibrated(index, built, interests, exact_ids, target=TARGET_RECALL, widen=widen, log=log)
        measured = f"{calibration.describe()}; save it with `recsys index`"
    retriever = Retriever.from_index(index, built, item_emb=emb, **items)
    return retriever, f"{built.factory} built in memory in {build_s:.1f}s{_shown_params(index, measured)}"


def _saved_recall(index: Any, meta: dict[str, Any]) -> str:
    """What ``recsys index`` measured for the saved index described by ``meta``, searched as
    ``index`` is now: its recall when that is the setting it was measured at."""
    if meta.get("requested_factory", "").strip() == "Flat" or meta.get("factory", "").strip() == "Flat":
        return "exact search"
    (key, now), recall = search_setting(index), meta.get("recall")
    if not isinstance(recall, (int, float)):
        return "recall not measured"
    measured = f"recall@{meta.get('n')} {recall:.3f} of exact search on {meta.get('users', 0):,} test users"
    if key and now != meta.get(key):
        return f"recall not measured at {key}={now} (recsys index measured {measured} at {key}={meta.get(key)})"
    return measured


def _shown_params(index: Any, advice: str) -> str:
    """`` (ef_search=64; advice)``: the search settings ``index`` has, and ``advice``, when any."""
    shown = "; ".join(part for part in (search_params(index), advice) if part)
    return f" ({shown})" if shown else ""
