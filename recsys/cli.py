"""The ``recsys`` command: ``data | train | evaluate | index | recommend | serve``.

Every subcommand takes ``--config FILE`` and any number of ``--set section.key=value``
overrides; with neither it runs on the built-in synthetic data. The resolved config is printed
first, so a run's log says exactly what it did.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recsys.config import Config, ConfigError, config_from_dict, load_config


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="TOML config file; repeatable, later files win (see experiments/configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value; repeatable (e.g. --set model.dim=32)")
    p.add_argument("--data", help="shortcut for --set data.source=PATH")
    p.add_argument("--model", help="shortcut for --set model.name=NAME")


def _config(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if getattr(args, "data", None):
        overrides.insert(0, f"data.source={args.data}")
    if getattr(args, "model", None):
        overrides.insert(0, f"model.name={args.model}")
    cfg = load_config(args.config, overrides)
    print("# resolved config\n" + cfg.to_toml(), flush=True)
    return cfg


def _run_config(run: Path) -> Config:
    path = run / "config.json"
    if not path.exists():
        raise ConfigError(f"{run} is not a run directory (no config.json)")
    return config_from_dict(json.loads(path.read_text()))


def cmd_data(args: argparse.Namespace) -> int:
    """Read, filter and describe a dataset; optionally save the prepared form."""
    from recsys.data import describe, load_dataset

    cfg = _config(args)
    ds = load_dataset(cfg)
    print(describe(ds))
    if args.out:
        ds.save(args.out)
        print(f"prepared dataset written to {args.out}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train, validate, early-stop and test; print the test metrics table."""
    from recsys.evaluate.evaluator import format_table
    from recsys.train.trainer import train

    if args.resume:
        cfg = _run_config(Path(args.resume))
        print("# resumed config\n" + cfg.to_toml(), flush=True)
    else:
        cfg = _config(args)
    result = train(cfg, run_dir=args.resume, resume=bool(args.resume))
    if result.test_metrics:
        print(f"\ntest metrics ({cfg.model.name}, best step {result.best_step}, "
              f"{result.wall_s:.0f}s, {result.samples_per_s:,.0f} samples/s):")
        print(format_table({cfg.model.name: result.test_metrics}))
        print(f"run directory: {result.run_dir}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate a saved run (``recsys evaluate RUN``) or an untrained model (``--model popular``)."""
    from recsys.evaluate.evaluator import format_table
    from recsys.runs import evaluate_run, evaluate_untrained

    if args.run:
        cfg = _run_config(Path(args.run))
        cfg.eval.diversity_lambda = args.diversity_lambda if args.diversity_lambda is not None else cfg.eval.diversity_lambda
        name, metrics = Path(args.run).name, evaluate_run(Path(args.run), cfg, split=args.split)
    else:
        cfg = _config(args)
        if args.diversity_lambda is not None:
            cfg.eval.diversity_lambda = args.diversity_lambda
        name, metrics = cfg.model.name, evaluate_untrained(cfg, split=args.split, log=print)
    print(format_table({name: metrics}))
    if args.out:
        Path(args.out).write_text(json.dumps(metrics, indent=2))
        print(f"metrics written to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recsys", description="Multi-interest sequential retrieval: train, evaluate, index, serve."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("data", help="read, filter and describe a click dataset")
    _add_config_args(p)
    p.add_argument("--out", help="save the prepared dataset to this folder")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("train", help="train a model, then evaluate it on the test users")
    _add_config_args(p)
    p.add_argument("--resume", metavar="RUN", help="continue the run in this directory from its last checkpoint")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="evaluate a run directory, or an untrained model such as popular")
    p.add_argument("run", nargs="?", help="run directory (omit to evaluate --model on --data)")
    _add_config_args(p)
    p.add_argument("--split", choices=("test", "valid"), default="test")
    p.add_argument("--diversity-lambda", type=float, help="ComiRec's diversity-controlled aggregation")
    p.add_argument("--out", help="also write the metrics as JSON here")
    p.set_defaults(func=cmd_evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"recsys {args.command}: error: {err}", file=sys.stderr)
        return 2
