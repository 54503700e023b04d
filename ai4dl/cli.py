"""``ai4dl <verb>``: every stage of the product from one command line (``jobs/*.py`` call the same table).

Common options: ``--conf conf/local.yaml`` (a YAML job config) and ``--set section.key=value`` (repeatable)
overlaid on it; ``--master`` is a shortcut for ``--set spark.master=...``. The configuration is validated
before Spark starts. Expected failures (bad input, bad config, a missing table, a model that does not fit)
print one line and exit 2; anything else is a bug and shows its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from ai4dl.errors import Ai4dlError


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", help="YAML job config (default: built-in defaults)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    common.add_argument("--master", help="Spark master URL (local[*], spark://host:7077, yarn, k8s://...)")

    p = argparse.ArgumentParser(prog="ai4dl", description=_plain(__doc__.split("\n\n")[0]), epilog=_plain(EPILOG),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    g = sub.add_parser("generate", parents=[common], help="write a synthetic fleet of container traces")
    g.add_argument("--containers", type=int, help="shortcut for --set generate.containers=N")
    g.add_argument("--steps", type=int, help="shortcut for --set generate.steps=N")
    g.add_argument("--seed", type=int, help="shortcut for --set generate.seed=N")
    g.add_argument("--profile", help="shortcut for --set generate.profile=NAME (ai4dl: the default; training-loop)")
    g.add_argument("--out", default="data/raw/generated", help="output folder")
    g.add_argument("--format", default="csv", choices=["csv", "parquet", "delta"])

    i = sub.add_parser("ingest", parents=[common], help="ingest traces into bronze (bad rows to quarantine)")
    i.add_argument("input", nargs="?", help="file, folder or glob, or a Prometheus URL (default: ingest.input)")
    i.add_argument("--format", "--from", dest="format", choices=["csv", "parquet", "delta", "prometheus"],
                   help="input format; --from prometheus URL reads a Prometheus server's cAdvisor series")
    i.add_argument("--start", help="Prometheus: start of the range (epoch seconds, ISO-8601, now-6h)")
    i.add_argument("--end", help="Prometheus: end of the range (default now)")
    i.add_argument("--step", help="Prometheus: query step, one row per container and step (default 10s)")

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

    st = sub.add_parser("stream", parents=[common], help="live phases and recommendations as bronze grows (Structured Streaming)")
    st.add_argument("--trigger", choices=["availableNow", "continuous"], help="shortcut for --set stream.trigger=...")
    st.add_argument("--interval", type=float, help="continuous: seconds between micro-batches (stream.interval_seconds)")
    st.add_argument("--model", help="model directory (default: label.model, else the latest trained version, "
                    "checked again at every micro-batch)")
    st.add_argument("--checkpoint", help="checkpoint folder (default: <lake.root>/_checkpoints/stream)")
    st.add_argument("--input", dest="stream_input", metavar="FOLDER", help="a folder to watch: its new trace files are ingested "
                    "(same validation and quarantine as `ingest`) and labelled (stream.input)")

    rc = sub.add_parser("recommendations", parents=[common], help="the live recommendations as Kubernetes objects (YAML)")
    rc.add_argument("--format", default="vpa", choices=["vpa", "resize", "patch"],
                    help="vpa: a VerticalPodAutoscaler per container targeting its owner, the recommendation in its "
                    "status; resize: the body of the pod's resize subresource (Kubernetes >= 1.33, any owner); "
                    "patch: a strategic-merge patch of a Deployment's or StatefulSet's pod template (not a Job's: "
                    "its template is immutable)")
    rc.add_argument("--owner-kind", default="Job", choices=["Job", "Deployment", "StatefulSet"],
                    help="the kind of workload the containers run in (default Job)")
    rc.add_argument("--update-mode", default="Off",
                    choices=["Off", "Initial", "Recreate", "Auto", "InPlaceOrRecreate", "InPlace"],
                    help="vpa: spec.updatePolicy.updateMode (default Off: publish the recommendation only)")
    rc.add_argument("--out", help="output YAML file (default: standard output)")
    rc.add_argument("--namespace", help="the objects' namespace")
    rc.add_argument("--container", help="container name in the pod (default: from pod_id <pod>/<container>, else the service name)")

    d = sub.add_parser("demo", parents=[common], help="generate -> ingest -> window -> train -> label -> behaviour -> policies -> report")
    d.add_argument("--input", help="ingest these traces instead of generating a fleet")
    d.add_argument("--format", choices=["csv", "parquet", "delta"],
                   help="format of --input (default: guessed from the path, else ingest.format)")

    many = sub.add_parser(
        "run", parents=[common], help="several stages in order in one Spark session (JVM and Delta start paid once)",
        description="Runs the given stages in order in one Spark session, each with its options from the config "
        "(e.g. `ai4dl run ingest window label behaviour policies`). Stages that need arguments of their own "
        "(refine, import-reference-model) are run alone.",
    )
    many.add_argument("stages", nargs="+", choices=list(PIPELINE_STAGES), metavar="STAGE",
                      help=f"one or more of: {', '.join(PIPELINE_STAGES)}")
    many.add_argument("--input", help="ingest these traces instead of ingest.input")
    many.add_argument("--format", choices=["csv", "parquet", "delta"], help="format of the ingest input")
    many.add_argument("--model", help="label with this model directory (default: label.model or the latest)")

    sq = sub.add_parser("sql", parents=[common], help="a read-only JDBC/ODBC endpoint for BI tools over the lake's catalog",
                        description="Starts Spark's Thrift JDBC/ODBC server over the lake's named tables and BI views "
                        "(lake.schema, default ai4dl; every table the lake has is named first), read-only for its "
                        "clients, until Ctrl-C. Connect with jdbc:hive2://HOST:PORT/SCHEMA.")
    sq.add_argument("--port", type=int, default=10000, help="port (default 10000)")
    sq.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                    "another address exposes the lake: set up authentication first, see the README)")

    lg = sub.add_parser("log", parents=[common], help="the last runs from the run log; flags unfinished runs and their commits")
    lg.add_argument("--last", type=int, default=20, help="how many runs (default 20)")

    v = sub.add_parser(
        "vpa-recommend",
        help="the Kubernetes VPA recommender over a CSV of usage samples (no Spark, no lake)",
        description="Reads pod_id,timestamp_seconds,cpu_cores_used,memory_bytes_used; writes VPA's target, lower "
        "and upper bounds before every INTERVAL-th sample of each container, as the conformance harness "
        "(../shared/tools/vpa-reference) does. Other arguments are the harness's VPA flags, e.g. "
        "-step-seconds 10 -cpu-half-life 1200s -mem-half-life 1200s -mem-interval 1200s -oom-on-shortfall.",
    )
    v.add_argument("input", help="CSV of usage samples")
    v.add_argument("--interval", type=int, default=10, help="ask for a recommendation every N samples (default 10)")
    v.add_argument("--out", required=True, help="output CSV")
    return p


# Stages ``ai4dl run`` chains: those that need no argument of their own beyond the config.
PIPELINE_STAGES = ("generate", "ingest", "window", "train", "label", "behaviour", "policies", "optimize", "report")


def _pipeline_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per-stage options of ``ai4dl run`` (only the stages that take the shared flags)."""
    return {"ingest": {"input": args.input, "fmt": args.format}, "label": {"model": args.model}}


EPILOG = """examples:
  ai4dl demo                                    the whole pipeline on a generated fleet
  ai4dl demo --input traces/ --format parquet   the same on your own traces
  ai4dl ingest exports/2026-12-01/ --conf conf/local.yaml
  ai4dl report --set report.dir=out/report

``ai4dl <command> --help`` lists a command's options. Expected failures print one line and exit 2."""


def _plain(text: str) -> str:
    """Docstring text as a terminal shows it: reST literals (````x````) without their backticks."""
    return text.replace("``", "")


# Verb -> (stage, its options from the parsed arguments). Config shortcuts are handled in _overrides.
VERBS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "generate": lambda a: {"out": a.out, "fmt": a.format},
    "ingest": lambda a: {"input": a.input, "fmt": a.format},
    "window": lambda a: {"scaler_from_model": a.scaler_from_model},
    "train": lambda a: {},
    "label": lambda a: {"model": a.model},
    "refine": lambda a: {"phase": a.phase, "k": a.k, "model": a.model},
    "import-reference-model": lambda a: {"path": a.path, "name": a.name},
    "behaviour": lambda a: {},
    "policies": lambda a: {},
    "optimize": lambda a: {"tables": tuple(a.tables)},
    "report": lambda a: {"out": a.out},
    "demo": lambda a: {"input": a.input, "fmt": a.format},
    "stream": lambda a: {"model": a.model},
}


def _overrides(args: argparse.Namespace) -> list[str]:
    out = list(args.overrides)
    if args.master:
        out.append(f"spark.master={args.master}")
    for flag, key in (("trigger", "stream.trigger"), ("interval", "stream.interval_seconds"), ("checkpoint", "stream.checkpoint"),
                      ("stream_input", "stream.input")):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={value}")
    for flag in ("containers", "steps", "seed", "profile"):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"generate.{flag}={value}")
    for flag in ("start", "end", "step"):
        value = getattr(args, flag, None)
        if value is not None:  # quoted: a time stays a string, not a YAML timestamp or number
            out.append(f"prometheus.{flag}={json.dumps(value)}")
    return out


def _vpa_recommend(args: argparse.Namespace, flags: list[str]) -> None:
    from ai4dl.policies.vpa import params_from_flags, recommend_csv

    out = recommend_csv(args.input, args.out, interval=args.interval, params=params_from_flags(flags))
    print(f"vpa-recommend: {len(out)} recommendations for {out['pod_id'].nunique()} containers -> {args.out}")


def _log(cfg: Any, args: argparse.Namespace) -> None:
    """Read-only: prints the run log's last runs and the commits of runs that never finished."""
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake, orphan_commits, run_history

    lake = Lake.for_config(get_spark(cfg), cfg)
    runs = run_history(lake, args.last)
    if runs.empty:
        print(f"log: no runs recorded under {cfg.lake.root}")
        return
    for r in runs.itertuples():
        flag = {"finished": "  ", "failed": "F ", "unfinished": "! "}[r.status]
        ended = "-" if r.finished_at is None or str(r.finished_at) == "NaT" else str(r.finished_at)[:19]
        detail = r.message if r.status == "failed" else ("still running or killed" if r.status == "unfinished" else r.written)
        print(f"{flag}{r.run_id} {r.job:<22} {str(r.started_at)[:19]} -> {ended:<19} {r.status:<10} {detail}")
    orphans = orphan_commits(lake)
    for table, version, run_id in orphans:
        print(f"! {table} version {version} was committed by run {run_id}, which never logged 'finished'")
    unfinished = int((runs["status"] == "unfinished").sum())
    print(f"log: {len(runs)} runs shown, {unfinished} unfinished, {len(orphans)} commits of unfinished runs")


def _recommendations(cfg: Any, args: argparse.Namespace) -> None:
    """Read-only: gold/recommendations as Kubernetes YAML (see ai4dl.policies.k8s), within the bounds of the
    policy model that allocated them."""
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake
    from ai4dl.policies.k8s import render
    from ai4dl.policies.model import resolve

    lake = Lake.for_config(get_spark(cfg), cfg)
    rows = [r.asDict() for r in lake.read("recommendations").orderBy("pod_id").collect()]
    model, _ = resolve(cfg.policies, cfg.lake.models)
    text = render(rows, args.format, owner_kind=args.owner_kind, update_mode=args.update_mode,
                  namespace=args.namespace, container=args.container, bounds=model.bounds)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text)
        print(f"recommendations: {len(rows)} {args.format} objects -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _sql(cfg: Any, args: argparse.Namespace) -> None:
    """Serves the lake read-only (it writes only the catalog's names of the lake's own tables)."""
    from ai4dl.lake.endpoint import serve

    serve(cfg, args.port, args.host)


# Commands that read the lake but write nothing to it (no run-log row of their own).
READERS: dict[str, Callable[[Any, argparse.Namespace], None]] = {"log": _log, "recommendations": _recommendations,
                                                                  "sql": _sql}

# Commands that touch neither Spark nor the lake: no config, no run log. They take unparsed extra arguments.
TOOLS: dict[str, Callable[[argparse.Namespace, list[str]], None]] = {"vpa-recommend": _vpa_recommend}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command not in TOOLS and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command in TOOLS:
            TOOLS[args.command](args, extra)
            return 0
        from ai4dl.config import load_config

        cfg = load_config(args.conf, _overrides(args))
        if args.command in READERS:
            READERS[args.command](cfg, args)
            return 0
        from ai4dl import stages

        if args.command == "run":
            stages.run_many(args.stages, cfg, options=_pipeline_options(args))
        else:
            stages.run(args.command, cfg, **VERBS[args.command](args))
    except Ai4dlError as exc:  # expected, explained failures: one line, exit 2
        print(f"ai4dl {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in ("pyspark", "delta", "py4j"):
            raise
        print(f"ai4dl {args.command}: Spark is not installed here ({exc.name}): pip install 'ai4dl[spark]' (the "
              "pinned pyspark + delta-spark pair; on Databricks the runtime brings its own)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
