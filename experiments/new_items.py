"""New items on Amazon Beauty (issue 57's acceptance): how well models with item features retrieve
items that had no training click, against the attribute-popularity baseline.

For each seed, a random ``--share`` (10%) of the prepared items is drawn and written to a file that
``data.held_out_items`` names: every click on them leaves the training part of ComiRec's user split
(:mod:`recsys.data.split`), while the validation and test users keep them in their inputs and truth.
Each model trains twice, with item features (an item without training clicks is its features alone,
:mod:`recsys.items.features`) and with ids alone (``model.use_features = false``), under
``train.max_minutes = --minutes``. Each is then scored on the **held-out targets**: every test
user's truth restricted to held-out items, users without one left out (Recall@50 = the share of a
user's held-out truth clicks in the top 50 of the whole catalogue, averaged over those users).

The baseline (:func:`attribute_popularity`) ranks the whole catalogue for each test user from the
attributes of the user's whole input (it never sees the target's), in three ways:

- ``any``: the items sharing at least one attribute with the input first, then the others; each
  group by popularity;
- ``shared``: by the number of distinct input attributes an item shares, then by popularity;
- ``weighted``: by the sum, over the item's attributes, of the input clicks carrying each, then by
  popularity;

each with two popularities: ``train`` (training clicks, what the models see: a held-out item has 0)
and ``observed`` (training clicks plus every click of the validation and test users' inputs: every
click but the truth, so held-out items have the clicks the evaluation users' inputs give them). Ties
left are broken by a seeded random order, not by item id (ids follow the whole log's popularity).
The best of these six is the baseline the ratio divides by. ``whole log`` rows (popularity from every
click, the truth included) are printed as a ceiling that sees the answers, outside the ratio.

**Within held-out items**: the same targets when models and baselines rank the held-out items alone
(told which items are new): how well features order new items among themselves, apart from how
their scores compare with the clicked items'. Its ratio divides by the best baseline there.

Prints one markdown table: Recall@50 and HitRate@50 on the held-out targets, the ratio of Recall@50
to the best baseline, Recall@50 within held-out items and its ratio, Recall@50 on all test targets,
the best and last validated steps and what ended each run; then the baselines' rows and the counts
(held-out items and clicks, test users with a held-out target). ``--score DIR`` scores the runs an
earlier call wrote (each run's dataset holds its held-out items) without training.

    python experiments/new_items.py --data ../shared/data/amazon-beauty/interactions.csv \\
        --features ../shared/data/amazon-beauty/item_attributes.json \\
        --models comirec_sa,sasrec --seeds 42 --minutes 10 --ids-minutes 2.5 --set train.cpu_threads=1
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from recsys.config import Config, load_config
from recsys.data import Dataset, EvalSet, load_dataset, split_dataset
from recsys.evaluate.evaluator import evaluate_with_config
from recsys.evaluate.metrics import compute_metrics
from recsys.run import RunDir, load_run
from recsys.train.new_items import choose_for_new_items
from recsys.train.trainer import train

TOPN = (20, 50)
KEY, HIT = "recall@50", "hitrate@50"
KEYS = ("any", "shared", "weighted")  # the baseline's orders (module docstring)
POPULARITIES = ("train", "observed")  # the baseline's popularities; "whole log" sees the truth


def draw_held_out(ds: Dataset, share: float, seed: int) -> np.ndarray:
    """``[h]`` sorted item ids: a random ``share`` of the prepared (clicked) items, drawn with ``seed``."""
    items = np.arange(1, ds.num_items)
    size = max(1, round(share * len(items)))
    return np.sort(np.random.default_rng(seed).choice(items, size=size, replace=False))


def held_truth(eval_set: EvalSet, held: np.ndarray) -> EvalSet:
    """``eval_set`` with each user's truth restricted to the items of ``held``; users left without
    truth are dropped."""
    keep = np.isin(eval_set.truth_items, held)
    user = np.repeat(np.arange(len(eval_set)), np.diff(eval_set.truth_indptr))
    kept = np.bincount(user[keep], minlength=len(eval_set))
    subset = eval_set.rows(np.flatnonzero(kept > 0))
    indptr = np.concatenate([[0], np.cumsum(kept[kept > 0])]).astype(np.int64)
    return dataclasses.replace(subset, truth_indptr=indptr, truth_items=eval_set.truth_items[keep])


def item_attributes(ds: Dataset) -> sp.csr_matrix:
    """``[catalogue_size, V]`` 0/1: item ``i`` has attribute ``a``, every field's values side by side."""
    if ds.features is None or not ds.features.fields:
        raise ValueError("the baseline needs categorical item features (data.item_features)")
    parts = [
        sp.csr_matrix((np.ones(len(f.indices)), f.indices, f.indptr), shape=(ds.catalogue_size, f.vocab_size))
        for f in ds.features.fields
    ]
    return sp.hstack(parts, format="csr")


def attribute_popularity(
    attributes: sp.csr_matrix,
    history: tuple[np.ndarray, np.ndarray],
    popularity: np.ndarray,
    key: str,
    n: int,
    seed: int = 0,
    exclude_history: bool = False,
    candidates: np.ndarray | None = None,
    block: int = 1024,
) -> np.ndarray:
    """``[U, n]`` item ids: each user's top ``n`` of the whole catalogue by ``key`` (``any``, ``shared``
    or ``weighted``, module docstring) computed from the attributes of its input, then by ``popularity``
    ``[N]``, then by a random order drawn with ``seed``.

    ``attributes [N, V]``: :func:`item_attributes`; ``history``: each user's whole input as CSR
    ``(indptr [U + 1], items)``; the padding id 0 is never ranked; ``exclude_history`` leaves the
    input's items out, as ``eval.exclude_history`` does for the models; ``candidates [c]`` (item ids),
    when given, are the only items ranked.
    """
    num_items = attributes.shape[0]
    indptr, items = history
    users = len(indptr) - 1
    clicks = sp.csr_matrix((np.ones(len(items)), items, indptr), shape=(users, num_items))  # [U, N]
    carried = (clicks @ attributes).tocsr()  # [U, V]: input clicks carrying each attribute
    # the tie-breaks as one number in (0, 1): rank by popularity, then by a random order
    shuffle = np.random.default_rng(seed).permutation(num_items)
    order = np.lexsort((shuffle, -np.asarray(popularity, dtype=np.float64)))  # best first
    after = np.empty(num_items)
    after[order] = (num_items - np.arange(num_items)) / (num_items + 1)
    out = np.zeros((users, n), dtype=np.int64)
    for start in range(0, users, block):
        rows = carried[start : start + block]
        if key == "weighted":
            first = (rows @ attributes.T).toarray()
        else:
            first = ((rows > 0).astype(np.float64) @ attributes.T).toarray()  # distinct input attributes shared
            if key == "any":
                first = (first > 0).astype(np.float64)
            elif key != "shared":
                raise ValueError(f"key: {key!r} is not one of {KEYS}")
        score = first + after[None, :]  # [b, N]
        score[:, 0] = -np.inf
        if candidates is not None:
            score[:, np.setdiff1d(np.arange(num_items), candidates)] = -np.inf
        if exclude_history:
            seen = clicks[start : start + block].tocoo()
            score[seen.row, seen.col] = -np.inf
        top = np.argpartition(-score, n - 1, axis=1)[:, :n]
        best = np.take_along_axis(score, top, axis=1)
        out[start : start + block] = np.take_along_axis(top, np.argsort(-best, axis=1, kind="stable"), axis=1)
    return out


def popularities(ds: Dataset, split: Any) -> dict[str, np.ndarray]:
    """The baseline's popularities ``[catalogue_size]``: ``train`` (training clicks), ``observed``
    (plus every validation and test input click) and ``whole log`` (every click, the truth included)."""
    size = ds.catalogue_size
    train_counts = split.train_item_counts(size)
    observed = train_counts.copy()
    for eval_set in (split.valid, split.test):
        observed += np.bincount(eval_set.history(0, len(eval_set))[1], minlength=size)
    whole = np.zeros(size, dtype=np.int64)
    whole[: ds.num_items] = ds.item_counts
    return {"train": train_counts, "observed": observed, "whole log": whole}


def baselines(
    ds: Dataset, split: Any, subset: EvalSet, exclude_history: bool, seed: int, held: np.ndarray
) -> dict[str, dict]:
    """Every baseline's metrics on ``subset`` (the held-out targets), keyed ``"<key>, <popularity>"``:
    ``"all"`` ranking the whole catalogue, ``"within"`` the held-out items alone."""
    attributes = item_attributes(ds)
    history = subset.history(0, len(subset))
    rows: dict[str, dict] = {}
    for name, popularity in popularities(ds, split).items():
        for key in KEYS:
            row = rows.setdefault(f"{key}, {name}", {})
            for scope, candidates in (("all", None), ("within", held)):
                top = attribute_popularity(
                    attributes, history, popularity, key, max(TOPN), seed, exclude_history, candidates=candidates
                )
                row[scope] = compute_metrics(top, subset.truth_indptr, subset.truth_items, topn=TOPN)
    return rows


def within_held(run: Any, subset: EvalSet, held: np.ndarray) -> dict[str, float]:
    """The run's metrics on ``subset`` when it ranks the held-out items ``held`` alone (each by its
    best interest): how well its features order the new items among themselves."""
    interests = run.interests(subset.inputs, subset.lengths)  # [U, K, d]
    items = run.item_table()[held]  # [h, d]
    scores = np.einsum("ukd,hd->ukh", interests, items).max(axis=1)  # [U, h]
    if run.cfg.eval.exclude_history:
        indptr, clicked = subset.history(0, len(subset))
        row = np.repeat(np.arange(len(subset)), np.diff(indptr))
        at = np.searchsorted(held, clicked)
        mine = (at < len(held)) & (held[np.minimum(at, len(held) - 1)] == clicked)
        scores[row[mine], at[mine]] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, : max(TOPN)]
    return compute_metrics(held[top], subset.truth_indptr, subset.truth_items, topn=TOPN)


def scored_as(
    run: Any, subset: EvalSet, held: np.ndarray, trained: dict[str, Any], form: str, scale: float, share: float
) -> dict[str, Any]:
    """The same run's weights scored with ``model.cold_rows = form``, ``model.cold_scale = scale``
    and ``retrieval.new_item_share = share`` (all read outside training only, so nothing is
    retrained), on the held-out targets, within the held-out items and on every test target."""
    table = run.model.embedding
    kept = table.cold_rows, table.cold_scale
    table.cold_rows, table.cold_scale = form, scale
    cfg = dataclasses.replace(run.cfg, retrieval=dataclasses.replace(run.cfg.retrieval, new_item_share=share))
    try:
        category = run.dataset.catalogue_category
        return {
            "scale": f"{scale:g}, {share:g}",
            "steps": trained["steps"],
            "ended": trained["ended"],
            "held": evaluate_with_config(run.model, subset, cfg, item_category=category),
            "within": within_held(run, subset, held),
            "all": evaluate_with_config(run.model, run.split.test, cfg, item_category=category),
        }
    finally:
        table.cold_rows, table.cold_scale = kept


def chosen_again(run: Any, log: Any = print) -> tuple[float, float]:
    """The ``model.cold_scale`` and ``retrieval.new_item_share`` a run's training chooses today
    (:func:`recsys.train.new_items.choose_for_new_items` on its validation sample), whatever the run
    saved (one trained before either was chosen loads 1 and 0)."""
    cfg = dataclasses.replace(
        run.cfg,
        model=dataclasses.replace(run.cfg.model, cold_scale=-1.0),
        retrieval=dataclasses.replace(run.cfg.retrieval, new_item_share=-1.0),
    )
    valid = run.split.valid.sample(cfg.eval.valid_users, cfg.data.seed)  # the trainer's sample
    chosen = choose_for_new_items(run.model, valid, cfg, run.dataset.catalogue_category, log)
    return (cfg.model.cold_scale, 0.0) if chosen is None else (chosen.model.cold_scale, chosen.retrieval.new_item_share)


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="the Amazon Beauty interactions.csv")
    ap.add_argument("--features", help="its item_attributes.json (data.item_features)")
    ap.add_argument("--models", default="comirec_sa,sasrec", help="comma-separated model names")
    ap.add_argument("--seeds", default="42", help="comma-separated seeds: the items drawn and train.seed")
    ap.add_argument("--minutes", type=float, default=6.0, help="train.max_minutes of each run with features")
    ap.add_argument("--ids-minutes", type=float, help="train.max_minutes of each run on ids alone (default --minutes)")
    ap.add_argument("--share", type=float, default=0.1, help="the share of items held out")
    ap.add_argument("--ids-alone", default="true", choices=("true", "false"), help="also train each model on ids alone")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="an extra --set for every run")
    ap.add_argument("--output-dir", default="/tmp/new_items_runs", help="where the runs, logs and held-out files go")
    ap.add_argument("--score", metavar="DIR", help="score the runs an earlier call wrote to DIR, training nothing")
    ap.add_argument(
        "--score-as",
        action="append",
        metavar="ROWS:SCALE[:SHARE]",
        help="also score each feature run with model.cold_rows=ROWS, model.cold_scale=SCALE and "
        "retrieval.new_item_share=SHARE (default 0) (repeatable; default attribute_mean:1)",
    )
    ap.add_argument(
        "--choose-again",
        action="store_true",
        help="also score each feature run at the values its training would choose today (a run saved before "
        "retrieval.new_item_share was chosen gets it chosen on its validation users)",
    )
    a = ap.parse_args(argv)
    if not a.score and not (a.data and a.features):
        ap.error("--data and --features are needed to train (or --score DIR)")
    return a


def _config(a: argparse.Namespace, *sets: str) -> Config:
    base = [f"data.source={a.data}", f"data.item_features={a.features}", *a.overrides]
    return load_config(None, [*base, *sets])


def train_all(a: argparse.Namespace, out: Path) -> None:
    """Draw each seed's held-out items into ``out/held_out_SEED.txt`` and train every model and variant
    into ``out/MODEL-VARIANT-SEED/`` (its log beside it, ``.log``)."""
    models = [m for m in a.models.split(",") if m]
    if not models:
        raise SystemExit("--models: name at least one model")
    variants = [("features", "model.use_features=true", a.minutes)]
    if a.ids_alone == "true":
        variants.append(
            ("ids_alone", "model.use_features=false", a.minutes if a.ids_minutes is None else a.ids_minutes)
        )
    for seed in (int(s) for s in a.seeds.split(",")):
        every = load_dataset(_config(a))
        held = draw_held_out(every, a.share, seed)
        held_file = out / f"held_out_{seed}.txt"
        held_file.write_text("".join(f"{raw}\n" for raw in every.item_raw[held]))
        for model in models:
            for label, use, minutes in variants:
                sets = [f"data.held_out_items={held_file}", f"train.seed={seed}", f"model.name={model}", use]
                stem = out / f"{model}-{label}-{seed}"
                with open(stem.with_suffix(".log"), "w") as f:
                    result = train(
                        _config(a, *sets, f"train.max_minutes={minutes}"),
                        run_dir=stem,
                        log=lambda line, f=f: print(line, file=f, flush=True),
                    )
                print(f"trained {stem.name}: test R@50 {result.test_metrics[KEY]:.4f}", flush=True)


def score_all(out: Path, score_as: list[tuple[str, float, float]], choose_again: bool = False) -> str:
    """Score every run under ``out`` (written by :func:`train_all`) and the baselines on each seed's
    held-out targets; the tables."""
    table: dict[str, list[dict[str, Any]]] = {}
    base_rows: dict[str, list[dict[str, dict]]] = {}
    counts = []
    for held_file in sorted(out.glob("held_out_*.txt")):
        seed = int(held_file.stem.rsplit("_", 1)[1])
        runs = sorted(p for p in out.glob(f"*-{seed}") if (p / "config.json").is_file())
        subset = None
        for path in runs:
            run = load_run(path)
            held = run.dataset.held_out  # saved with the run's dataset
            assert held is not None, f"{path}: trained without data.held_out_items"
            mine = held_truth(run.split.test, held)
            if subset is None:
                subset, cfg = mine, run.cfg
            assert np.array_equal(mine.users, subset.users), "every run scores the same users"
            # chosen on validation by default
            row = {**_steps(path), "scale": f"{run.cfg.model.cold_scale:g}, {run.cfg.retrieval.new_item_share:g}"}
            row["held"] = evaluate_with_config(run.model, mine, run.cfg, item_category=run.dataset.catalogue_category)
            row["within"] = within_held(run, mine, held)
            row["all"] = RunDir(path).read_test_metrics()
            model, label, _ = path.name.rsplit("-", 2)
            table.setdefault(f"{model}, {label.replace('_', ' ')}", []).append(row)
            if run.cfg.model.use_features:
                for form, scale, share in score_as:
                    name = f"{model}, {label.replace('_', ' ')}, scored with {form} rows, ×{scale:g}, share {share:g}"
                    table.setdefault(name, []).append(scored_as(run, mine, held, row, form, scale, share))
                if choose_again:
                    scale, share = chosen_again(run)
                    name = f"{model}, {label.replace('_', ' ')}, as chosen on validation"
                    table.setdefault(name, []).append(
                        scored_as(run, mine, held, row, run.cfg.model.cold_rows, scale, share)
                    )
        if subset is None:
            continue
        ds = load_dataset(cfg)  # the features and held-out items of the runs' config
        assert ds.held_out is not None
        split = split_dataset(ds, cfg.data)
        for name, metrics in baselines(ds, split, subset, bool(cfg.eval.exclude_history), seed, ds.held_out).items():
            base_rows.setdefault(name, []).append(metrics)
        counts.append(
            {
                "seed": seed,
                "held items": len(ds.held_out),
                "held clicks": int(ds.item_counts[ds.held_out].sum()),
                "test users": len(split.test),
                "with a held-out target": len(subset),
                "held-out targets": len(subset.truth_items),
                "test targets": len(split.test.truth_items),
            }
        )
    return _tables(table, base_rows, counts)


def _steps(path: Path) -> dict[str, Any]:
    """The run's best step / last validated step, and whether its log says the time cap ended it."""
    valid = [r for r in RunDir(path).read_metrics() if r.get("split") == "valid"]
    best = max(valid, key=lambda r: r[KEY])["step"] if valid else 0
    log = path.with_suffix(".log")
    capped = log.is_file() and re.search(r"stopped at step \d+: train.max_minutes", log.read_text()) is not None
    return {"steps": f"{best}/{valid[-1]['step'] if valid else 0}", "ended": "time cap" if capped else "plateau"}


def main(argv: list[str] | None = None) -> None:
    a = _parse(sys.argv[1:] if argv is None else argv)
    if a.score:
        out = Path(a.score)
    else:
        out = Path(a.output_dir) / time.strftime("%Y%m%d-%H%M%S")
        out.mkdir(parents=True)
        train_all(a, out)
    score_as = [_score_as(v) for v in a.score_as or ["attribute_mean:1"]]
    print(score_all(out, score_as, a.choose_again))


def _score_as(value: str) -> tuple[str, float, float]:
    """``ROWS:SCALE[:SHARE]`` as ``(rows, scale, share)``."""
    rows, scale, *share = value.split(":")
    return rows, float(scale), float(share[0]) if share else 0.0


def _mean(rows: list[dict[str, float]], key: str) -> str:
    values = [r[key] for r in rows]
    text = f"{np.mean(values):.4f}"
    return text if len(values) == 1 else f"{text} ({min(values):.4f}–{max(values):.4f})"


def _best(base: dict[str, list[dict[str, dict]]], scope: str) -> tuple[str, float]:
    """The baseline (not seeing the truth) with the highest mean Recall@50 in ``scope``, and that mean."""
    honest = {k: float(np.mean([r[scope][KEY] for r in v])) for k, v in base.items() if not k.endswith("whole log")}
    name = max(honest, key=lambda k: honest[k])
    return name, honest[name]


def _tables(table: dict[str, list[dict[str, Any]]], base: dict[str, list[dict[str, dict]]], counts: list[dict]) -> str:
    (best_name, best), (within_name, best_within) = _best(base, "all"), _best(base, "within")
    lines = [
        "| model | R@50 held-out | HR@50 held-out | × best baseline | within held-out: R@50, × best | R@50 all targets "
        "| cold_scale, new_item_share | best/steps | ended by |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name, rows in table.items():
        held, within = [r["held"] for r in rows], [r["within"] for r in rows]
        ratio = np.mean([h[KEY] for h in held]) / best if best > 0 else float("inf")
        ratio_within = np.mean([h[KEY] for h in within]) / best_within if best_within > 0 else float("inf")
        scales = "; ".join(r["scale"] for r in rows)
        lines.append(
            f"| {name} | {_mean(held, KEY)} | {_mean(held, HIT)} | {ratio:.2f} | {_mean(within, KEY)}, "
            f"{ratio_within:.2f} | {_mean([r['all'] for r in rows], KEY)} | {scales} | "
            f"{', '.join(r['steps'] for r in rows)} | "
            f"{', '.join(r['ended'] for r in rows)} |"
        )
    lines += [
        "",
        "| attribute-popularity baseline (order, popularity) | R@50 held-out | HR@50 held-out | within: R@50 |",
        "|---|---:|---:|---:|",
    ]
    for name, rows in base.items():
        marks = [m for m, on in (("best", name == best_name), ("best within", name == within_name)) if on]
        mark = f" ({', '.join(marks)})" if marks else " (sees the truth)" if name.endswith("whole log") else ""
        all_rows, within = [r["all"] for r in rows], [r["within"] for r in rows]
        lines.append(f"| {name}{mark} | {_mean(all_rows, KEY)} | {_mean(all_rows, HIT)} | {_mean(within, KEY)} |")
    lines += [
        "",
        "| seed | held-out items | their clicks | test users | with a held-out target | held-out targets | all |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in counts:
        lines.append(
            f"| {c['seed']} | {c['held items']:,} | {c['held clicks']:,} | {c['test users']:,} | "
            f"{c['with a held-out target']:,} | {c['held-out targets']:,} | {c['test targets']:,} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
