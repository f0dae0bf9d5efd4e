"""The ``recsys`` command: ``config | data | train | tune | evaluate | inspect | plot | index | recommend | export |
serve``.

A thin layer over the Python API (:mod:`recsys.api`): every command parses its options and
calls one API function. Commands that build a config take ``--config FILE`` and any number of
``--set section.key=value`` overrides; with neither they run on the built-in synthetic data.
The resolved config is saved with every run and printed with ``--verbose``. Long work shows
progress bars on stderr when it is a terminal; ``--quiet`` turns them off.

Errors: :func:`main` is the one place where failures become messages. A known failure (bad
config, bad data, a damaged run file, a missing extra, a file or port problem, a full disk
however the writer reported it) prints one line ``recsys CMD: error: ...`` and exits with status
2; ``--debug`` (or ``RECSYS_DEBUG=1``) shows the traceback instead. Ctrl-C prints
``recsys CMD: interrupted`` (for a training run with a checkpoint, with the command that resumes
it) and exits with status 130. Warnings (e.g. rows dropped by ``data.skip_bad_rows``) print as one line each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import TextIO, TypeAlias

from recsys.config import Config, ConfigError, apply_overrides, load_config
from recsys.extras import install_hint
from recsys.io import atomic_write_text, full_disk
from recsys.text import count

# failures with a message meant for the user: ConfigError, DataError, IntegrityError and
# TrainingDiverged are ValueErrors; OSError covers missing files, existing run names and ports
# in use; ImportError names the extra to install
KNOWN_ERRORS = (ValueError, OSError, ImportError, MemoryError)
EXIT_ERROR = 2


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="TOML config file; repeatable, later files win (see experiments/configs/)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value; repeatable (e.g. --set model.dim=32)",
    )
    p.add_argument("--data", help="shortcut for --set data.source=PATH")
    p.add_argument("--model", help="shortcut for --set model.name=NAME")


def _add_common_args(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: set only where given, so `recsys data --debug list` and `recsys data list --debug` both work
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback of an error (also: RECSYS_DEBUG=1)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the config as given before the command's own output (`train --dry-run` prints it resolved)",
    )


def _config(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if getattr(args, "data", None):
        overrides.insert(0, f"data.source={args.data}")
    if getattr(args, "model", None):
        overrides.insert(0, f"model.name={args.model}")
    cfg = load_config(args.config, overrides)
    _show_config(args, cfg, "given")
    return cfg


def _show_config(args: argparse.Namespace, cfg: Config, what: str) -> None:
    if getattr(args, "verbose", False):
        print(f"# {what} config\n" + cfg.to_toml(), flush=True)


def _run_config(run: str | Path) -> Config:
    from recsys.run import RunDir

    return RunDir(run).read_config()


def _check_out(path: str | None) -> None:
    """Fail before any work when ``--out``'s folder does not exist."""
    if path and not Path(path).resolve().parent.is_dir():
        raise FileNotFoundError(f"--out: folder {Path(path).parent} does not exist")


def _progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "quiet", False)


# the budget, and how the step is launched (a run saved when train.cuda_graph defaulted to false
# can resume as a CUDA graph; a run resumed on another machine, or a busier one, on other CPU threads)
RESUME_KEYS = (
    "train.max_steps",
    "train.max_epochs",
    "train.max_minutes",
    "train.patience",
    "train.lr_drops",
    "train.cuda_graph",
    "train.cpu_threads",
)


def _resumed_config(args: argparse.Namespace) -> Config:
    """The run's saved config; ``--set`` may extend its budget or change how the step is launched
    (``RESUME_KEYS``), which is written back to the run's ``config.json``. Anything else would
    change what is being continued, so it is an error naming the option or key."""
    for option in ("config", "data", "model"):
        if getattr(args, option):
            raise ConfigError(f"--{option} cannot change a run being resumed; it keeps the config it was started with")
    from recsys.run import RunDir

    run = RunDir(args.resume)
    cfg = run.read_config()
    for assignment in args.overrides:
        key = assignment.split("=", 1)[0].strip()
        if key not in RESUME_KEYS:
            raise ConfigError(f"{key}: a resumed run can only change {', '.join(RESUME_KEYS)}")
    if args.overrides:
        apply_overrides(cfg, args.overrides)
        run.save_config(cfg)
    return cfg


def cmd_config(args: argparse.Namespace) -> int:
    """Every config key with its value, as a TOML file that ``--config`` takes back."""
    from recsys.config import automatic_keys
    from recsys.run.settings import rules

    cfg = _config(args)
    rule = rules(cfg.model.name)
    notes = {key: f"automatic: {rule[key]}" for key in automatic_keys(cfg)}
    print(
        "# every key of the config, as `--config` files and `--set section.key=value` take them;\n"
        '# the automatic values (-1, 0 or "auto": recsys.config.AUTOMATIC) are decided once the data is read,\n'
        "# each by the rule beside it; `recsys train --dry-run` prints them decided (docs/configuration.md)\n"
        + cfg.to_toml(notes=notes),
        end="",
    )
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    """Read, filter and describe a dataset; optionally save the prepared form."""
    from recsys.data import describe, load_dataset

    cfg = _config(args)
    ds = load_dataset(cfg, progress=_progress(args))
    print(describe(ds))
    if args.out:
        ds.save(args.out)
        print(f"prepared dataset written to {args.out}")
    return 0


def cmd_data_registry(args: argparse.Namespace) -> int:
    """``recsys data list`` (the registered datasets) and ``recsys data fetch NAME``."""
    from recsys.data.fetch import fetch
    from recsys.data.registry import format_registry, registry

    if args.data_command == "list":
        print(format_registry(registry()))
    else:
        fetch(args.name, dest=args.dest, sources=args.sources, force=args.force, progress=not args.no_progress)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train, validate, early-stop and test; print the test metrics table."""
    from recsys.evaluate.evaluator import format_table
    from recsys.train.trainer import dry_run, train

    if args.resume and args.init_from:
        raise ConfigError("--init-from starts a new run from another run's weights; --resume continues a run: use one")
    if args.dry_run:
        if args.resume:
            raise ConfigError("--dry-run shows a new run; a resumed run goes on with the config it was started with")
        lines: list[str] = []
        resolved = dry_run(_config(args), progress=_progress(args), log=lines.append, init_from=args.init_from)
        print("# the config this run would use and save, every automatic value resolved\n" + resolved.to_toml())
        print("\n".join(lines))
        return 0
    if args.resume:
        cfg = _resumed_config(args)
        _show_config(args, cfg, "resumed")
    else:
        cfg = _config(args)
    result = train(
        cfg, run_dir=args.resume, resume=bool(args.resume), progress=_progress(args), init_from=args.init_from
    )
    if result.test_metrics:
        print(
            f"\ntest metrics ({cfg.model.name}, best step {result.best_step}, "
            f"{result.wall_s:.0f}s, {result.samples_per_s:,.0f} samples/s, {result.targets_per_s:,.0f} targets/s):"
        )
        print(format_table({cfg.model.name: result.test_metrics}))
        print(f"run directory: {result.run_dir}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate a saved run (``recsys evaluate RUN``) or an untrained model (``--model popular``)."""
    from recsys.api import Run, evaluate_untrained
    from recsys.evaluate.evaluator import TABLE_METRICS, format_table
    from recsys.retrieval.aggregate import check_lambda

    _check_out(args.out)
    if args.diversity_lambda is not None:
        check_lambda(args.diversity_lambda, "--diversity-lambda")
    if args.run:
        for option in ("config", "data", "model", "overrides"):
            if getattr(args, option):
                raise ConfigError(f"--{option}: a saved run is evaluated with its own config; drop --{option}")
        name = Path(args.run).name
        metrics = Run.load(args.run).evaluate(
            args.split, diversity_lambda=args.diversity_lambda, progress=_progress(args)
        )
    else:
        cfg = _config(args)
        if args.diversity_lambda is not None:
            cfg.eval.diversity_lambda = args.diversity_lambda
        name, metrics = cfg.model.name, evaluate_untrained(cfg, split=args.split, log=print, progress=_progress(args))
    shown = TABLE_METRICS + (("diversity",) if any(k.startswith("diversity@") for k in metrics) else ())
    print(format_table({name: metrics}, metrics=shown))
    if args.out:
        atomic_write_text(args.out, json.dumps(metrics, indent=2) + "\n")
        print(f"metrics written to {args.out}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Multi-interest health of a saved run, printed, and a PNG of what each interest reads and retrieves."""
    from recsys.api import Run
    from recsys.plots import require_matplotlib

    _check_out(args.out)
    picture = True
    try:
        require_matplotlib()
    except ImportError as err:
        if args.out:  # the picture was asked for: fail before any work
            raise
        picture, no_picture = False, f"no picture: {err}"
    run = Run.load(args.run)
    health = run.health(args.split, max_users=args.max_users)
    k = int(getattr(run.model, "num_interests", 1))
    print(f"multi-interest health of {run.path.name} ({args.split} users, K = {k}):")
    print("| interest | effective clicks | readout share | served share |")
    print("|---:|---:|---:|---:|")

    def cell(key: str, digits: int) -> str:
        value = health.get(key)
        return "–" if value is None else f"{value:.{digits}f}"

    for i in range(k):
        shares = f"{cell(f'mi_readout_share_k{i}', 3)} | {cell(f'mi_served_share_k{i}', 3)}"
        print(f"| {i} | {cell(f'mi_eff_clicks_k{i}', 2)} | {shares} |")
    for key, label in (
        ("mi_cosine", "mean pairwise cosine of a user's interests"),
        ("mi_planted_recovery", "planted interests recovered"),
        ("mi_planted_in_input", "planted interests present in the input"),
    ):
        if key in health:
            print(f"{label}: {health[key]:.3f}")
    if not picture:  # the table is the answer; the picture is an extra
        print(no_picture)
        return 0
    out = run.draw_interests(args.out or f"{run.path.name}-interests.png", args.split, users=args.users)
    print(f"picture written to {out}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Search hyperparameters with Optuna; write the best config, retrain it and print its test metrics."""
    from recsys.evaluate.evaluator import format_table
    from recsys.tune import read_tune_tables, trials_table, tune

    cfg = _config(args)
    result = tune(
        cfg,
        args.out,
        trials=args.trials,
        max_minutes=args.max_minutes,
        jobs=args.jobs,
        space=read_tune_tables(args.config),
    )
    print("\n" + trials_table(result))
    print(
        f"\nbest: trial {result.best_trial}, valid {result.key} {result.best_valid:.4f}; "
        f"its config: {result.best_config} (recsys train --config {result.best_config})"
    )
    if result.run_dir:  # else --max-minutes left no time to retrain it (a line said so)
        print(f"test metrics of the best config retrained ({result.run_dir}):")
        print(format_table({cfg.model.name: result.test_metrics}))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """Training loss and validation curves of one or several runs in one PNG."""
    from recsys.plots import draw_curves
    from recsys.run import RunDir
    from recsys.run.settings import objective

    _check_out(args.out)
    runs = {Path(run).name: RunDir(run).read_metrics() for run in args.runs}
    if len(runs) < len(args.runs):
        raise ValueError("two runs share a folder name; give runs with distinct names")
    first = RunDir(args.runs[0])  # the validation metric drawn is the first run's eval.objective
    key = objective(first.read_config().eval) if first.has_config() else "recall@50"
    print(f"curves written to {draw_curves(runs, args.out, key)}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    """Build and save a FAISS index for a run; report build time and recall against exact search."""
    from recsys.api import Run

    if args.remove_added_items:
        from recsys.run import RunDir

        removed = RunDir(args.run).remove_added_items()
        print(f"removed {count(removed, 'addition')} of items to {args.run} (its catalogue is training's again)")
    run = Run.load(args.run, device="cpu")
    if args.item_features:
        run.add_items(args.item_features, log=print)
    report = run.index(
        args.factory,
        nprobe=args.nprobe,
        ef_search=args.ef_search,
        ef_construction=args.ef_construction,
        n=args.n,
        **({} if args.target_recall is None else {"target_recall": args.target_recall}),
        log=print,
        progress=_progress(args),
    )
    searched = f" ({report.search_params})" if report.search_params else ""
    print(
        f"built {report.factory}{searched} over {count(report.num_items, 'item')} (d={report.dim}) "
        f"in {report.build_s:.2f}s -> {report.index_file}"
    )
    print(f"search: {report.calibration} (target {report.target_recall:g})")
    print(
        f"recall@{report.n} against exact search on {count(report.users, 'test user')}: {report.recall:.4f}  "
        f"({report.ann_users_per_s:,.0f} users/s vs exact {report.exact_users_per_s:,.0f} users/s)"
    )
    if report.short_lists:
        print(
            f"the index alone left {report.short_lists:.1%} of those lists short of {report.n} items; "
            "recommend and serve fill them by exact search"
        )
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    """Batch top-N for users of a run (raw ids in, raw ids out) to Parquet or CSV."""
    from recsys.api import Run
    from recsys.retrieval.aggregate import check_lambda
    from recsys.serve.batch import output_format, read_user_file, write_recommendations

    check_lambda(args.diversity_lambda, "--diversity-lambda")
    if args.batch_size <= 0:
        raise ValueError(f"--batch-size: must be > 0, got {args.batch_size}")
    output_format(args.out)  # an unknown suffix or a missing extra fails before any work
    _check_out(args.out)
    raw = None if args.all else read_user_file(args.users)
    run = Run.load(args.run, device="cpu").use_index(
        args.factory,
        nprobe=args.nprobe,
        ef_search=args.ef_search,
        new_item_share=args.new_item_share,
        log=print,
        progress=_progress(args),
    )
    table = run.recommend(
        users=raw,
        n=args.n,
        exclude_seen=args.exclude_seen,
        diversity_lambda=args.diversity_lambda,
        strict=args.strict,
        batch_size=args.batch_size,
        progress=_progress(args),
    )
    unknown = table.attrs.get("unknown_users", [])
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        print(f"skipped {count(len(unknown), 'unknown user')}: {shown}", file=sys.stderr)
    if args.n > run.dataset.catalogue_size - 1:
        print(
            f"--n {args.n:,} is more than the {count(run.dataset.catalogue_size - 1, 'item')} of the catalogue; "
            "capped at that"
        )
    path = write_recommendations(table, args.out)
    held = table.groupby("user", sort=False).size()
    each = count(held.max(), "item") if held.min() == held.max() else f"{held.min():,} to {held.max():,} items"
    print(f"{count(len(table), 'recommendation')} for {count(len(held), 'user')} ({each} each) written to {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a run's network, item embeddings and id map for a serving stack."""
    from recsys.api import Run

    out = Run.load(args.run, device="cpu").export(args.out, format=args.format)
    print(f"{args.format} export of {args.run} written to {out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a run over HTTP (needs the serve extra)."""
    from recsys.device import resolve_device
    from recsys.serve.app import run_server  # first: a missing serve extra fails before any work
    from recsys.serve.recommender import Recommender

    device = resolve_device(args.device, "--device")  # before the run is read
    cfg = _run_config(args.run)
    overrides = [
        f"serve.{key}={value}" for key, value in (("host", args.host), ("port", args.port)) if value is not None
    ] + list(args.overrides)
    apply_overrides(cfg, overrides)
    rec = Recommender.from_run(
        args.run,
        factory=args.factory,
        nprobe=args.nprobe,
        ef_search=args.ef_search,
        device=device,
        item_features=args.item_features,
        new_item_share=args.new_item_share,
    )
    run_server(rec, cfg.serve, run=args.run, threads=args.threads, access_log=args.access_log)
    return 0


SEARCH_FACTORY = (
    "(a saved `recsys index` of it is reused; default: the run's most recently saved index, else its retrieval.factory)"
)


def _add_index_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("run", help="run directory (written by recsys train)")
    p.add_argument("--factory", help=f"FAISS index_factory string {what}")
    p.add_argument("--nprobe", type=int, help="IVF lists searched per query")
    p.add_argument("--ef-search", type=int, help="HNSW search beam width")


def _add_new_item_share(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--new-item-share",
        type=float,
        metavar="F",
        help="keep this share of each list for items without training clicks where fewer earn a place by score "
        "(default: the run's retrieval.new_item_share, chosen on validation when it trained)",
    )


def _add_item_features(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--item-features",
        metavar="FILE",
        help="first add the items of this feature file that the run lacks, without retraining (a run trained "
        "with data.item_features; read as training read its file): each is its features alone, a value the "
        "run never saw contributing nothing; items the run has keep theirs; saved in the run",
    )


def _add_split(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument(
        "--split",
        choices=("test", "valid"),
        default="test",
        help=f"which held-out users to {verb}: test (default; never seen in training or model selection) "
        "or valid (the users early stopping was judged on)",
    )


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars (they show only on a terminal anyway)")


Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # what add_subparsers returns


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recsys",
        description="Multi-interest sequential retrieval: train, evaluate, index, recommend, export, serve.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    registry_commands = _add_data_commands(sub)
    _add_train_command(sub)
    _add_run_commands(sub)
    _add_index_commands(sub)
    _add_serving_commands(sub)
    for p in [*sub.choices.values(), *registry_commands.choices.values()]:  # every command: --debug, --verbose
        _add_common_args(p)
    return parser


def _add_data_commands(sub: Subcommands) -> Subcommands:
    """``recsys config`` and ``recsys data``; returns ``data``'s own commands (the registered
    datasets' ``list`` and ``fetch``)."""
    p = sub.add_parser("config", help="list every config key with its value (defaults, or with --config/--set applied)")
    _add_config_args(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("data", help="read, filter and describe a click dataset")
    _add_config_args(p)
    p.add_argument("--out", help="save the prepared dataset to this folder")
    _add_quiet(p)
    p.set_defaults(func=cmd_data)
    registry_commands = p.add_subparsers(dest="data_command", metavar="{list,fetch}")
    registry_commands.add_parser("list", help="the registered public datasets (data/*.toml)").set_defaults(
        func=cmd_data_registry
    )
    f = registry_commands.add_parser("fetch", help="download, verify and prepare a registered dataset")
    f.add_argument("name", help="a name from `recsys data list`")
    f.add_argument("--dest", help="data root to use instead of $RECSYS_DATA_DIR / the user cache")
    f.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        metavar="FILE",
        help="a file downloaded by hand instead of downloading it; repeatable",
    )
    f.add_argument("--force", action="store_true", help="prepare again even if already prepared")
    f.add_argument("--no-progress", action="store_true", help="no download progress bar")
    f.set_defaults(func=cmd_data_registry)
    return registry_commands


def _add_train_command(sub: Subcommands) -> None:
    """``recsys train``."""
    p = sub.add_parser("train", help="train a model, then evaluate it on the test users")
    _add_config_args(p)
    p.add_argument(
        "--resume",
        metavar="RUN",
        help="continue the run in this directory from its last checkpoint (on the CPU bit for bit as if "
        "uninterrupted only with one thread, train.cpu_threads=1)",
    )
    p.add_argument(
        "--init-from",
        metavar="RUN",
        help="start a new run (on its own data and config, e.g. a newer log) from this trained run's best "
        "weights: the network by name, item rows by raw item id (items new to this log start fresh, or from "
        "their features), a fresh optimiser; the model must be the same (docs/training.md, "
        '"Starting from yesterday\'s run")',
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="prepare the data and build the model, print the resolved config and the run's plan, and exit "
        "(no training, no run directory)",
    )
    _add_quiet(p)
    p.set_defaults(func=cmd_train)


def _add_run_commands(sub: Subcommands) -> None:
    """The commands that study runs: ``evaluate``, ``inspect``, ``tune``, ``plot``."""
    p = sub.add_parser("evaluate", help="evaluate a run directory, or an untrained model such as popular")
    p.add_argument("run", nargs="?", help="run directory (omit to evaluate --model on --data)")
    _add_config_args(p)
    _add_split(p, "evaluate")
    p.add_argument("--diversity-lambda", type=float, help="ComiRec's diversity-controlled aggregation")
    p.add_argument("--out", help="also write the metrics as JSON here")
    _add_quiet(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("inspect", help="multi-interest health of a run, and a PNG of what each interest reads")
    p.add_argument("run", help="run directory (written by recsys train)")
    _add_split(p, "inspect")
    p.add_argument("--users", type=int, default=4, help="users drawn in the picture (default 4)")
    p.add_argument("--max-users", type=int, default=2048, help="users the health metrics average over")
    p.add_argument("--out", help="PNG path (default: ./RUN_NAME-interests.png, drawn when matplotlib is installed)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("tune", help="search hyperparameters (Optuna), write the best config, retrain and test it")
    _add_config_args(p)
    p.add_argument("--trials", type=int, default=20, help="finished trials the tune should hold (default 20)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="wall-clock budget of the tune, the retrain included (default none)",
    )
    p.add_argument("--jobs", type=int, default=1, help="trials trained at once, one process each (default 1)")
    p.add_argument("--out", help="tune folder; the same folder again resumes (default OUTPUT_DIR/tune-MODEL-DATA)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("plot", help="training loss and validation curves of one or several runs, to a PNG")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (written by recsys train)")
    p.add_argument("--out", default="curves.png", help="PNG path (default ./curves.png)")
    p.set_defaults(func=cmd_plot)


def _add_index_commands(sub: Subcommands) -> None:
    """``recsys index`` and ``recsys recommend`` (a run's saved index and batch top-N)."""
    p = sub.add_parser("index", help="build and save a FAISS index beside a run; report its recall")
    _add_index_args(p, 'e.g. "HNSW32,Flat", "IVF1024,Flat", "Flat" (default: the run\'s retrieval.factory)')
    p.add_argument("--ef-construction", type=int, help="HNSW build beam (default: the run's retrieval.ef_construction)")
    p.add_argument("--n", type=int, default=50, help="top-N compared with exact search (default 50)")
    p.add_argument(
        "--target-recall",
        type=float,
        help="the search setting (--nprobe of IVF, --ef-search of HNSW, when not given) is widened until the "
        "index's top-N holds this share of exact search's on the test users (default 0.95)",
    )
    _add_item_features(p)
    p.add_argument(
        "--remove-added-items",
        action="store_true",
        help="first remove every item added to the run after training (before --item-features, if given)",
    )
    _add_quiet(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("recommend", help="batch top-N for many users of a run, to Parquet or CSV")
    _add_index_args(p, SEARCH_FACTORY)
    _add_new_item_share(p)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--users", metavar="FILE", help="raw user ids, one per line")
    who.add_argument("--all", action="store_true", help="every user of the run's dataset")
    p.add_argument("--n", type=int, default=50, help="items per user (default 50)")
    p.add_argument("--out", required=True, help="output file: .parquet, .csv, .csv.gz or .tsv")
    p.add_argument(
        "--exclude-seen",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="never recommend an item the user clicked (default; --no-exclude-seen keeps them)",
    )
    p.add_argument("--diversity-lambda", type=float, default=0.0, help="ComiRec's diversity-controlled pick")
    p.add_argument("--strict", action="store_true", help="fail on unknown user ids instead of skipping them")
    p.add_argument("--batch-size", type=int, default=1024, help="users per model call")
    _add_quiet(p)
    p.set_defaults(func=cmd_recommend)


def _add_serving_commands(sub: Subcommands) -> None:
    """``recsys export`` and ``recsys serve``."""
    p = sub.add_parser("export", help="export a run's network (ONNX or TorchScript), item embeddings and id map")
    p.add_argument("run", help="run directory (written by recsys train)")
    p.add_argument(
        "--format",
        choices=("onnx", "torchscript"),
        default="onnx",
        help=f"onnx (needs {install_hint('export')}) or torchscript (default onnx)",
    )
    p.add_argument("--out", help="output folder (default: RUN/export/FORMAT)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("serve", help="serve a run over HTTP (POST /recommend, GET /health, GET /info)")
    _add_index_args(p, SEARCH_FACTORY)
    _add_new_item_share(p)
    p.add_argument("--host", help="bind address (default: serve.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: serve.port, 8000)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="serve.KEY=VALUE",
        help="override a serve setting, e.g. --set serve.fallback_popular=true",
    )
    p.add_argument("--device", default="cpu", help="where the model runs (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch/FAISS CPU threads (default 1)")
    p.add_argument("--access-log", action="store_true", help="log every request (slower)")
    _add_item_features(p)
    p.set_defaults(func=cmd_serve)


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` for the CLI: the message only, no Python source line."""
    print(f"recsys: warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    """Run one command; the CLI's single error path (see the module docstring)."""
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False) or os.environ.get("RECSYS_DEBUG", "") not in ("", "0")
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _one_line_warning
        try:
            return args.func(args)
        except Exception as err:
            full = full_disk(err)  # whatever a writer wrapped it in (torch, DuckDB): one line
            if debug or not (full is not None or isinstance(err, KNOWN_ERRORS)):
                raise
            print(f"recsys {args.command}: error: {_first_line(full or err)}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt as err:
            if debug:
                raise
            how = f"; {err}" if str(err) else ""  # a training run says how to resume it
            print(f"recsys {args.command}: interrupted{how}", file=sys.stderr)
            return 130


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]
