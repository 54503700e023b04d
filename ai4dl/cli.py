"""``ai4dl <command>``: every job of the product from one command line (``jobs/*.py`` call the same code).

Common options: ``--conf conf/local.yaml`` (a YAML job config) and ``--set key.path=value`` (repeatable)
overlaid on it; ``--master`` is a shortcut for ``--set spark.master=...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from ai4dl.config import ConfigError, load_config
from ai4dl.session import SparkSetupError


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", help="YAML job config (default: built-in defaults)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    common.add_argument("--master", help="Spark master URL (local[*], spark://host:7077, yarn, k8s://...)")

    p = argparse.ArgumentParser(prog="ai4dl", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", parents=[common], help="write a synthetic fleet of container traces")
    g.add_argument("--containers", type=int)
    g.add_argument("--steps", type=int)
    g.add_argument("--seed", type=int)
    g.add_argument("--out", default="data/raw/generated", help="output folder")
    g.add_argument("--format", default="csv", choices=["csv", "parquet", "delta"])

    i = sub.add_parser("ingest", parents=[common], help="ingest traces into bronze (bad rows to quarantine)")
    i.add_argument("input", nargs="?", help="file, folder or glob (default: ingest.input)")
    i.add_argument("--format", choices=["csv", "parquet", "delta"])

    w = sub.add_parser("window", parents=[common], help="scale and window bronze into silver")
    w.add_argument("--scaler-from-model", help="use this model's scaler instead of fitting one")

    sub.add_parser("train", parents=[common], help="train CRBM + k-means on silver, save a model version")

    lab = sub.add_parser("label", parents=[common], help="label silver with a model into the phases table")
    lab.add_argument("--model", help="model directory (default: latest trained version)")

    r = sub.add_parser("refine", parents=[common], help="split one phase into sub-phases, save a new model version")
    r.add_argument("--phase", type=int, required=True)
    r.add_argument("--k", type=int, default=2)
    r.add_argument("--model", help="model directory (default: latest trained version)")

    imp = sub.add_parser("import-reference-model", parents=[common], help="import the original AI4DL model JSON")
    imp.add_argument("path")
    imp.add_argument("--name", default="reference", help="model name under lake.models")

    sub.add_parser("behaviour", parents=[common], help="phase sequences, transition graph, phase statistics (gold)")
    sub.add_parser("policies", parents=[common], help="replay the test fleet under allocation policies")
    opt = sub.add_parser("optimize", parents=[common], help="compact (and Z-order) the lake's Delta tables")
    opt.add_argument("tables", nargs="*", help="logical table names (default: all)")
    rep = sub.add_parser("report", parents=[common], help="HTML report of the current tables")
    rep.add_argument("--out", help="report folder (default: report.dir)")

    d = sub.add_parser("demo", parents=[common], help="generate -> ingest -> window -> train -> label -> behaviour -> policies -> report")
    d.add_argument("--input", help="ingest these traces instead of generating a fleet")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = list(args.overrides)
    if args.master:
        overrides.append(f"spark.master={args.master}")
    try:
        cfg = load_config(args.conf, overrides)
    except ConfigError as exc:
        print(f"ai4dl: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(args, cfg)
    except (ValueError, FileNotFoundError, SparkSetupError) as exc:  # the library's clear errors: one line
        print(f"ai4dl {args.command}: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, cfg: dict) -> int:
    from ai4dl import pipeline
    from ai4dl.session import get_spark

    cmd = args.command
    if cmd == "import-reference-model":
        from ai4dl.model import save_version
        from ai4dl.reference import import_reference

        model = import_reference(args.path)
        path = save_version(model, cfg["lake"]["models"], args.name)
        print(f"imported reference model {model.model_id} -> {path}")
        return 0

    spark = get_spark(cfg)
    if cmd == "generate":
        _generate(spark, cfg, args)
    elif cmd == "ingest":
        _ingest(spark, cfg, args.input, args.format)
    elif cmd == "window":
        _window(spark, cfg, args.scaler_from_model)
    elif cmd == "train":
        _train(spark, cfg)
    elif cmd == "label":
        _label(spark, cfg, args.model)
    elif cmd == "refine":
        from ai4dl.model import save_version
        from ai4dl.training import refine_model

        model, _ = pipeline.resolve_model(cfg, args.model)
        refined = refine_model(spark, cfg, model, args.phase, args.k)
        path = save_version(refined, cfg["lake"]["models"], cfg["train"]["model_name"])
        print(f"refined phase {args.phase} into {refined.refinements[args.phase][1]}: model {refined.model_id} -> {path}")
    elif cmd == "behaviour":
        _behaviour(spark, cfg)
    elif cmd == "policies":
        _policies(spark, cfg)
    elif cmd == "optimize":
        from ai4dl import lake

        for name in args.tables or [n for n in lake.TABLES if n != "run_log"]:
            if name not in lake.TABLES:
                raise ValueError(f"unknown table '{name}' (known: {', '.join(lake.TABLES)})")
            metrics = lake.optimize(spark, cfg, name)
            if metrics:
                print(f"optimize {name}: {metrics['files_removed']} files compacted into {metrics['files_added']}")
    elif cmd == "report":
        path = pipeline.run_report(spark, cfg, args.out)
        print(f"report: {path}")
    elif cmd == "demo":
        _demo(spark, cfg, args.input)
    return 0


def _generate(spark, cfg, args) -> str:
    from ai4dl.synthetic import generate_fleet, write_fleet

    g = cfg["generate"]
    n = args.containers or g["containers"]
    steps = args.steps or g["steps"]
    seed = args.seed if args.seed is not None else g["seed"]
    t0 = time.time()
    df = generate_fleet(spark, n, steps, seed, g["services"], g["start"], g["interval_seconds"], g["partitions"])
    write_fleet(df, args.out, args.format)
    print(f"generate: {n} containers x {steps} steps = {n * steps} rows ({args.format}) -> {args.out} in {time.time() - t0:.1f}s")
    return args.out


def _ingest(spark, cfg, path, fmt) -> None:
    from ai4dl import pipeline
    from ai4dl.ingest import ingest

    result = ingest(spark, cfg, path, fmt)
    print(f"ingest: {result.summary()}")
    pipeline.log(
        spark, cfg, "ingest", {"bronze": result.inserted, "quarantine": result.quarantined},
        versions={"bronze": result.bronze_version, "quarantine": result.quarantine_version},
    )


def _window(spark, cfg, scaler_from_model) -> None:
    from ai4dl import pipeline
    from ai4dl.model import load
    from ai4dl.windowing import run_window

    source = scaler_from_model or cfg["window"]["scaler_from_model"]
    scaler = load(source).scaler if source else None
    pipeline.log(spark, cfg, "window", run_window(spark, cfg, scaler))


def _train(spark, cfg) -> None:
    from ai4dl import pipeline
    from ai4dl.training import run_train

    _, path, report = run_train(spark, cfg)
    pipeline.save_json(Path(cfg["report"]["dir"]) / "train_report.json", {"model": path, **report})
    # A model version is a directory, not a Delta table: logged by path, rows = the CRBM's sampled windows.
    pipeline.log(spark, cfg, "train", {path: int(report.get("crbm_windows", 0))})


def _behaviour(spark, cfg) -> None:
    from ai4dl import pipeline

    pipeline.run_behaviour(spark, cfg)
    pipeline.log(spark, cfg, "behaviour", pipeline.table_counts(spark, cfg, ("sequences", "transitions", "phase_stats")))


def _policies(spark, cfg) -> None:
    from ai4dl import pipeline

    pipeline.run_policies(spark, cfg)
    pipeline.log(spark, cfg, "policies", pipeline.table_counts(spark, cfg, ("policy_replay",)))


def _label(spark, cfg, model_dir) -> None:
    from ai4dl import pipeline
    from ai4dl.labelling import run_label

    model, path = pipeline.resolve_model(cfg, model_dir)
    print(f"label: model {model.model_id} from {path}")
    pipeline.log(spark, cfg, "label", run_label(spark, cfg, model))


def _demo(spark, cfg, input_path) -> None:
    from ai4dl import pipeline

    t0 = time.time()
    if input_path is None:
        ns = argparse.Namespace(containers=None, steps=None, seed=None, out=str(Path(cfg["lake"]["root"]).parent / "raw" / "generated"), format="csv")
        input_path = pipeline.timed("generate", _generate, spark, cfg, ns)
    pipeline.timed("ingest", _ingest, spark, cfg, input_path, "csv")
    pipeline.timed("window", _window, spark, cfg, None)
    pipeline.timed("train", _train, spark, cfg)
    pipeline.timed("label", _label, spark, cfg, None)
    pipeline.timed("behaviour", _behaviour, spark, cfg)
    pipeline.timed("policies", _policies, spark, cfg)
    report = pipeline.timed("report", pipeline.run_report, spark, cfg, None)
    print(f"demo: done in {time.time() - t0:.0f}s; open {report}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
