"""The Python API: train on a click table, then evaluate, recommend, embed, index and export.

::

    import recsys

    run = recsys.fit(clicks_df, overrides={"model.name": "comirec_sa", "train.max_steps": 2000})
    run.evaluate()                                    # {"recall@10": ..., "ndcg@10": ..., "mrr@10": ..., ...}
    recs = run.recommend(users=["17", "42"], n=10)    # DataFrame: user, rank, item, score, interest
    run = recsys.Run.load("runs/comirec_sa-...")      # any run directory, e.g. from `recsys train`
    run.add_items("items-2027.csv")                   # new items of a newer feature file, without retraining

Ids are raw ids throughout (the ones in your data, as strings); the internal ids (1..N-1 by
falling popularity, 0 = padding) never surface except in exports.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from recsys.config import Config, apply_overrides, load_config, with_values
from recsys.data import IN_MEMORY, Dataset
from recsys.data.batches import pad_sequences
from recsys.data.features import NewItems
from recsys.data.split import EvalSet
from recsys.data.synthetic import planted_for
from recsys.evaluate.diagnostics import health_with_config
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.models import InterestModel
from recsys.retrieval.aggregate import check_lambda
from recsys.retrieval.index import TARGET_RECALL
from recsys.run import (
    IndexReport,
    LoadedRun,
    add_items,
    build_experiment,
    build_run_index,
    load_run,
    retrieval_settings,
)
from recsys.serve.batch import recommend_table, resolve_users
from recsys.serve.recommender import Recommender
from recsys.text import count

__all__ = ["Run", "evaluate_untrained", "fit"]

Log = Callable[[str], None]
Clicks = pd.DataFrame | str | Path
SPLITS = ("test", "valid")


class Run:
    """A trained run directory in memory: its config, dataset (with the id maps), split and best
    model. Open one with :meth:`load` or get one from :func:`fit`."""

    def __init__(self, loaded: LoadedRun) -> None:
        self._run = loaded
        self._recommender: Recommender | None = None

    @classmethod
    def load(cls, path: str | Path, *, device: str | torch.device = "auto") -> Run:
        """Open run directory ``path`` with its best weights (``device``: ``auto`` = CUDA when
        available). A path that is not a trained run raises ``FileNotFoundError`` naming it."""
        return cls(load_run(path, device=device))

    def __repr__(self) -> str:
        ds = self.dataset
        return (
            f"Run({str(self.path)!r}, model={self.config.model.name!r}, users={ds.num_users:,}, "
            f"items={ds.num_items - 1:,})"
        )

    @property
    def path(self) -> Path:
        """The run directory."""
        return self._run.path

    @property
    def config(self) -> Config:
        """The resolved config the run was trained with."""
        return self._run.cfg

    @property
    def dataset(self) -> Dataset:
        """The prepared dataset (raw ids ``item_raw`` / ``user_raw``, click sequences)."""
        return self._run.dataset

    @property
    def model(self) -> InterestModel:
        """The trained model (eval mode): ``interests(seq [B, L], lengths [B]) -> [B, K, d]``."""
        return self._run.model

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(
        self, split: str = "test", *, diversity_lambda: float | None = None, progress: bool = False
    ) -> dict[str, float]:
        """Metrics on the run's ``test`` (or ``valid``) users under its own protocol (``data.split``:
        ComiRec's, or leave-one-out with full ranking): ``{"recall@10", "ndcg@10", "hitrate@10",
        "mrr@10", "coverage@10", ..., "users"}`` at each ``eval.topn`` cutoff (and ``diversity@n``
        with categories). ``diversity_lambda`` overrides ``eval.diversity_lambda``."""
        cfg = self.config
        if diversity_lambda is not None:
            check_lambda(diversity_lambda, "diversity_lambda")
            cfg = copy.deepcopy(cfg)
            cfg.eval.diversity_lambda = diversity_lambda
        eval_set = self.eval_set(split)
        return evaluate_with_config(
            self.model, eval_set, cfg, item_category=self.dataset.catalogue_category, progress=progress
        )

    def health(self, split: str = "test", *, max_users: int = 2048) -> dict[str, float]:
        """Multi-interest health on the first ``max_users`` ``test`` (or ``valid``) users:
        effective clicks per interest, readout and served shares, interest cosine and, on the synthetic data,
        planted recovery (:mod:`recsys.evaluate.diagnostics` defines each)."""
        eval_set = self.eval_set(split)
        ds = self.dataset
        planted = planted_for(self.config, ds.user_raw[eval_set.users[:max_users]], ds.category_raw)
        return health_with_config(
            self.model, eval_set, self.config, max_users=max_users, item_category=ds.catalogue_category, planted=planted
        )

    def draw_interests(self, path: str | Path, split: str = "test", *, users: int = 4) -> Path:
        """PNG ``path``: for ``users`` ``test`` (or ``valid``) users, each interest's attention over
        the input clicks and its top items with categories (:func:`recsys.plots.draw_interests`;
        needs the ``plot`` extra)."""
        from recsys.plots import draw_interests

        k = int(getattr(self.model, "num_interests", 1))
        return draw_interests(
            self.model,
            self.dataset,
            self.eval_set(split),
            path,
            users=users,
            title=f"{self.path.name}: {self.config.model.name}, K = {k}",
        )

    def eval_set(self, split: str = "test") -> EvalSet:
        """The run's ``test`` or ``valid`` users: inputs ``[U, L]``, lengths ``[U]``, truth (its ``data.split``)."""
        if split not in SPLITS:
            raise ValueError(f"split: {split!r} is not one of {list(SPLITS)}")
        return self._run.split.test if split == "test" else self._run.split.valid

    # -- embeddings -----------------------------------------------------------------------
    def item_embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """``(raw item ids [N], embeddings [N, d] float32)`` for the N items of the catalogue
        (padding excluded; new items of the item features included); scores are inner products
        with :meth:`interests`."""
        return self.dataset.catalogue_raw[1:].astype(str), self._run.item_table()[1:]

    def interests(self, sequences: Sequence[Sequence[Any]], *, batch_size: int = 2048) -> np.ndarray:
        """``[N, K, d]`` float32 interests of ``N`` click sequences of raw item ids (oldest
        first; the last ``data.max_len`` known items are used, unknown ids skipped). A sequence
        with no known item raises ``ValueError`` naming it."""
        indptr, items = self._encode_sequences(sequences)
        inputs, lengths = pad_sequences(indptr, items, np.arange(len(indptr) - 1), self.config.data.max_len)
        return self._run.interests(inputs, lengths, batch_size)

    def _encode_sequences(self, sequences: Sequence[Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Raw-id sequences -> CSR ``(indptr [S + 1], items)`` of known internal ids."""
        if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence):
            raise TypeError("sequences: expected a list of click sequences (lists of raw item ids)")
        if not sequences:
            raise ValueError("sequences: no sequences given")
        if any(isinstance(s, (str, bytes)) or np.ndim(s) != 1 for s in sequences):
            raise TypeError("sequences: each sequence must be a list of raw item ids, e.g. [['50', '172'], ['9']]")
        ids = self.dataset.item_map.lookup(x for s in sequences for x in s)  # -1 = unknown
        rows = np.repeat(np.arange(len(sequences)), [len(s) for s in sequences])
        keep = ids > 0
        indptr = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows[keep], minlength=len(sequences)), out=indptr[1:])
        empty = np.flatnonzero(np.diff(indptr) == 0)
        if len(empty):
            raise ValueError(f"sequences[{empty[0]}]: no item known to the run ({len(empty)} such sequences)")
        return indptr, ids[keep].astype(np.int64)

    # -- new items ----------------------------------------------------------------------
    def add_items(self, path: str | Path, *, log: Log | None = None) -> NewItems:
        """Add the items of feature file ``path`` (any format ``data.item_features`` reads, read with
        the run's ``data`` settings) that the run's catalogue lacks, without retraining: each gets an
        id after the catalogue's and is represented by the model's feature part alone (its values in
        the run's trained vocabularies, a value the run never saw contributing nothing; its vector
        through the trained projection). Items the run has keep their representation (the file's
        values for them are not read). The addition is saved in the run directory, so every later
        load sees it; :meth:`recommend` and :meth:`item_embeddings` see it at once, and raw ids of
        new items work in ``sequences``. Returns what was added (``.num_new``, ``.describe()``,
        also passed to ``log``); a file without new items changes nothing.

        A run trained without item features raises ``ValueError``: train it with
        ``data.item_features``. See :mod:`recsys.run.new_items`."""
        found = add_items(self._run, path, log=log or (lambda _: None))
        if found.num_new:
            self._recommender = None  # the next recommend() searches the grown catalogue
        return found

    # -- retrieval ------------------------------------------------------------------------
    def use_index(
        self,
        factory: str | None = None,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        new_item_share: float | None = None,
        log: Log | None = None,
        progress: bool = False,
    ) -> Run:
        """Make :meth:`recommend` search with ``factory`` (default: the run's most recently saved
        index, else its ``retrieval.factory``): the saved index when it matches the weights, else
        built in memory; searched with the saved index's ``nprobe`` / ``ef_search`` (chosen by
        :meth:`index` for its recall), or for one built in memory the values chosen the same way,
        unless given here; ``new_item_share``: the share of each list kept for items without clicks
        (default the run's ``retrieval.new_item_share``, chosen when it trained). :attr:`search`
        then says which search answers. Returns ``self``."""
        settings = retrieval_settings(
            self._run, factory, nprobe=nprobe, ef_search=ef_search, new_item_share=new_item_share
        )
        self._recommender = Recommender.of_run(
            self._run,
            settings,
            log=log or (lambda _: None),
            progress=progress,
            widen=nprobe is None and ef_search is None,
        )
        return self

    @property
    def search(self) -> str:
        """Which search :meth:`recommend` answers with: ``"Flat: exact search ..."``, or the index,
        where it comes from, its search setting and the recall of exact search's top n measured
        for it (``"HNSW32,Flat loaded from ... (ef_search=256; recall@50 0.962 of exact search on
        2,000 test users)"``). Opens the default search when :meth:`use_index` has not run."""
        if self._recommender is None:
            self.use_index()
        assert self._recommender is not None  # set by use_index
        return self._recommender.search

    def index(
        self,
        factory: str | None = None,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        ef_construction: int | None = None,
        n: int = 50,
        target_recall: float = TARGET_RECALL,
        log: Log | None = None,
        progress: bool = False,
    ) -> IndexReport:
        """Build the FAISS index ``factory`` (e.g. ``"HNSW32,Flat"``; default the run's
        ``retrieval.factory``), choose its search setting (``nprobe`` for IVF, ``ef_search`` for
        HNSW, unless given here) as the smallest from the run's value up, doubling, whose top
        ``n`` holds ``target_recall`` of exact search's for a sample of test users, save it with
        that setting in the run directory, measure its recall@``n`` against exact search on all
        test users, and use it for :meth:`recommend` from now on. Settings not given here are the
        run's ``retrieval`` ones."""
        settings = retrieval_settings(
            self._run, factory, nprobe=nprobe, ef_search=ef_search, ef_construction=ef_construction, saved=False
        )
        log = log or (lambda _: None)
        widen = nprobe is None and ef_search is None
        report = build_run_index(
            self._run, settings, n=n, target=target_recall, widen=widen, log=log, progress=progress
        )
        self._recommender = None  # recommend() opens the index just saved (the run's most recent)
        return report

    def recommend(
        self,
        users: Sequence[Any] | None = None,
        sequences: Sequence[Sequence[Any]] | None = None,
        n: int = 50,
        exclude_seen: bool = True,
        *,
        diversity_lambda: float = 0.0,
        strict: bool = True,
        batch_size: int = 1024,
        progress: bool = False,
    ) -> pd.DataFrame:
        """Top ``n`` items as a DataFrame with columns ``user, rank, item, score, interest``
        (one row per user and rank; raw ids; ``interest`` = which of the K interests found it);
        ``result.attrs["search"]`` says which search found them (:attr:`search`).

        Args:
            users: raw user ids of the run's dataset (their last ``data.max_len`` clicks are
                the input). With neither ``users`` nor ``sequences``: every user.
            sequences: click sequences of raw item ids instead (oldest first); the ``user``
                column is then the sequence's position 0..S-1.
            exclude_seen: never recommend an item the user (or sequence) clicked (the default,
                as for ``recsys recommend`` and the service; offline evaluation follows
                ``eval.exclude_history`` instead).
            diversity_lambda: ComiRec's diversity-controlled pick (0 = by score; finite, at
                most :data:`recsys.config.MAX_DIVERSITY_LAMBDA`).
            strict: unknown user ids raise ``ValueError``; otherwise they are skipped and
                listed in ``result.attrs["unknown_users"]``.
        """
        if users is not None and sequences is not None:
            raise ValueError("recommend: pass users or sequences, not both")
        check_lambda(diversity_lambda, "diversity_lambda")  # before any work
        if isinstance(users, (str, bytes)):
            raise TypeError("users: expected a list of raw user ids, got a single string")
        if self._recommender is None:
            self.use_index()
        rec = self._recommender
        assert rec is not None  # set by use_index
        options: dict[str, Any] = {
            "exclude_seen": exclude_seen,
            "diversity_lambda": diversity_lambda,
            "batch_size": batch_size,
            "progress": progress,
        }
        if sequences is not None:
            indptr, items = self._encode_sequences(sequences)
            table = recommend_table(rec, np.arange(len(indptr) - 1), n, sequences=(indptr, items), **options)
            table.attrs["search"] = rec.search
            return table
        known, unknown = resolve_users(rec, None if users is None else list(users), strict=strict, what="users")
        table = recommend_table(rec, known, n, **options)
        table.attrs["unknown_users"] = unknown
        table.attrs["search"] = rec.search
        return table

    # -- export ---------------------------------------------------------------------------
    def export(self, path: str | Path | None = None, format: str = "onnx") -> Path:
        """Write the sequence-to-interests network (``format``: ``onnx`` or ``torchscript``),
        the item embedding table and the id map to folder ``path`` (default: the run's
        ``export/<format>/``); see :mod:`recsys.serve.export`. Returns the folder."""
        from recsys.serve.export import export_run

        return export_run(self._run, path if path is not None else self._run.dir.export_dir(format), format)


def _resolve_config(
    config: Config | str | Path | Sequence[str | Path] | None, overrides: Mapping[str, Any] | Sequence[str] | None
) -> Config:
    """``config`` (a Config, TOML file(s) or None for the defaults) with ``overrides`` applied:
    a mapping of dotted keys to Python values, or ``section.key=value`` strings as ``--set``
    takes them. Unknown keys and bad values raise :class:`ConfigError` naming the key.

    TOML files and overrides are loaded in one :func:`load_config`, so the automatic values
    (``model.score_cap``, ``train.soft_readout_steps``) follow an overridden ``model.name``."""
    if not isinstance(config, Config):
        if isinstance(overrides, Mapping):
            return load_config(config, values=overrides)
        return load_config(config, list(overrides or []))
    cfg = copy.deepcopy(config)
    if not overrides:
        return cfg
    if not isinstance(overrides, Mapping):
        return apply_overrides(cfg, list(overrides))
    return with_values(cfg, overrides)


def fit(
    clicks: Clicks | None,
    *,
    config: Config | str | Path | Sequence[str | Path] | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    run_dir: str | Path | None = None,
    log: Log | None = print,
    progress: bool = False,
    init_from: str | Path | Run | None = None,
) -> Run:
    """Train a model on ``clicks`` and return the trained :class:`Run` (best weights).

    Args:
        clicks: a pandas DataFrame with columns named by ``data.user_col`` / ``data.item_col``
            (default ``user`` / ``item``), optionally a time column (``data.time_col``, default
            ``timestamp``; a DataFrame without it uses a ``time`` column, or else its row order
            as click order) and ``data.category_col``; or a path to any input ``recsys data``
            reads; or ``None`` for ``config``'s ``data.source``.
        config: a :class:`Config`, TOML file(s) (later win) or ``None`` for the defaults.
        overrides: ``{"model.name": "comirec_sa", "train.max_steps": 2000}`` (or
            ``["model.name=comirec_sa"]``), checked like ``--set``.
        run_dir: where the run is written (default a new folder under ``output_dir``).
        log: where training lines go (``None``: silent).
        progress: progress bars while preparing the data (on a terminal).
        init_from: a trained run (its directory, or a :class:`Run`) to start from: a warm start on
            a newer log, the network by name and the item rows by raw item id, with a fresh
            optimiser (docs/training.md, "Starting from yesterday's run").
    """
    from recsys.train.trainer import train

    frame = clicks if isinstance(clicks, pd.DataFrame) else None
    if clicks is not None and not isinstance(clicks, pd.DataFrame) and not Path(clicks).exists():
        raise FileNotFoundError(f"clicks: {clicks} does not exist")
    cfg = _resolve_config(config, overrides)
    if frame is not None:
        cfg.data.source = IN_MEMORY
        if cfg.data.time_col not in frame.columns:
            cfg.data.time_col = "time" if "time" in frame.columns else ""
    elif clicks is not None:
        cfg.data.source = str(clicks)
    origin = init_from.path if isinstance(init_from, Run) else init_from
    result = train(cfg, run_dir=run_dir, log=log or (lambda _: None), clicks=frame, progress=progress, init_from=origin)
    return Run.load(result.run_dir)


def evaluate_untrained(cfg: Config, split: str = "test", log: Log = print, progress: bool = False) -> dict[str, float]:
    """Evaluate a model that needs no training (``popular``) on ``cfg``'s data."""
    if split not in SPLITS:
        raise ValueError(f"split: {split!r} is not one of {list(SPLITS)}")
    exp = build_experiment(cfg, progress=progress)
    ds, sp = exp.dataset, exp.split
    log(
        f"data after filtering: {count(ds.num_users, 'user')}, {count(ds.num_items - 1, 'item')}, "
        f"{count(len(ds.items), 'click')}; eval users: valid {len(sp.valid.users):,}, test {len(sp.test.users):,}"
    )
    if exp.model.trainable:
        raise ValueError(f"model.name: {cfg.model.name!r} must be trained first (recsys train), then evaluate its run")
    eval_set = sp.test if split == "test" else sp.valid
    return evaluate_with_config(
        exp.model.eval(), eval_set, exp.cfg, item_category=ds.catalogue_category, progress=progress
    )
