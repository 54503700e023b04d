"""Where a stage's seconds go: the Spark jobs each of ingest, window and label runs, in one warm session.

    .venv/bin/python bench/stage_jobs.py                          # 200 containers x 1100 steps = 220k rows
    .venv/bin/python bench/stage_jobs.py --demo                   # the demo's stages on the demo's fleet
    .venv/bin/python bench/stage_jobs.py --containers 20 --steps 200 --min-seconds 0
    .venv/bin/python bench/stage_jobs.py --set 'spark.conf={"spark.databricks.delta.snapshotPartitions": "50"}'

Generates a CSV fleet (once, kept under ``--workdir``), imports the original AI4DL model, then runs the three
stages on a fresh lake and, after each, lists the Spark jobs it ran with their wall time and task count, read
from the Spark UI's REST API (``/api/v1/applications/<id>/jobs``): the job's call site says which line of ai4dl
(or which Delta internal: snapshot state reconstruction, commit hooks) it was. Jobs shorter than
``--min-seconds`` are summed into one line; seconds outside any job (driver-side Python: torch, pandas, plots,
Delta's commit protocol) are the difference between the wall time and the jobs' time. ``--demo`` runs what
``ai4dl demo`` runs (generate, ingest, window, train, label, behaviour, policies, report) with
``conf/local.yaml``'s fleet and a trained model instead of the original one. Look at ``uptime`` first.

``--profile`` also runs each stage under cProfile and prints where the driver's seconds go by kind of Delta
operation a stage pays for whatever its size (run-log appends, table creation and existence checks, MERGEs,
overwrites, history and property reads), then the heaviest ai4dl/Delta functions; and, once, what importing
the stage layer costs a fresh Python process. Run it on a small fleet (``--containers 6 --steps 381``, 2,286
rows) to see a small command's fixed cost.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _seconds(job: dict) -> float:
    def when(text: str) -> datetime:
        return datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")

    if not job.get("completionTime"):
        return float("nan")
    return (when(job["completionTime"]) - when(job["submissionTime"])).total_seconds()


def ui_rest(spark, path: str):
    """One endpoint of this application's monitoring REST API (``jobs``, ``stages?status=complete``, ``sql?...``)."""
    sc = spark.sparkContext
    with urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/{path}", timeout=60) as resp:
        return json.load(resp)


def jobs_since(spark, after: int) -> list[dict]:
    jobs = ui_rest(spark, "jobs")
    return sorted((j for j in jobs if j["jobId"] > after), key=lambda j: j["jobId"])


# Kinds of Delta work a stage pays whatever its size: (label, the ai4dl/delta-spark function that does it).
FIXED_COSTS = (
    ("run-log appends", "tables.py", "_append_run_log"),
    ("table creation", "tables.py", "ensure_table"),
    ("existence checks", "tables.py", "exists"),
    ("MERGEs", "tables.py", "merge_new"),
    ("overwrites", "tables.py", "overwrite"),
    ("history reads", "delta/tables.py", "history"),
    ("property reads", "tables.py", "properties"),
    ("counts", "tables.py", "count"),
)


def profile_lines(profile, top: int) -> list[str]:
    """The profile's seconds per kind of fixed cost (cumulative; kinds overlap where one calls another, e.g. a
    MERGE's creation of its table), then the ``top`` heaviest ai4dl/Delta functions."""
    import pstats

    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, primitive, tottime, cumtime, callers)
    lines = []
    for label, file, name in FIXED_COSTS:
        hits = [(v[1], v[3]) for (f, _, n), v in stats.items() if n == name and f.endswith(file)
                and ("/delta/" in f) == file.startswith("delta/")]
        if hits:
            calls, seconds = max(hits, key=lambda h: h[1])  # the public entry point: the largest cumulative
            lines.append(f"   {label:<17} {seconds:6.2f}s  ({calls} calls)")
    ours = sorted(((v[3], v[1], f"{Path(f).parent.name}/{Path(f).name}:{line} {n}") for (f, line, n), v in stats.items()
                   if ("/ai4dl/" in f or "/delta/" in f) and n not in ("run_stage", "run", "<lambda>")),
                  reverse=True)[:top]
    lines += [f"   {cum:6.2f}s {calls:4d}x  {where}" for cum, calls, where in ours]
    return lines


def import_seconds() -> float:
    """A fresh interpreter importing the stage layer and the lake (what every command imports before Spark)."""
    import subprocess

    code = "import time; t = time.perf_counter(); import ai4dl.stages, ai4dl.lake.tables, ai4dl.lake.session; " \
           "print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--containers", type=int, default=200)
    p.add_argument("--steps", type=int, default=1100)
    p.add_argument("--workdir", default="/tmp/ai4dl-stage-jobs")
    p.add_argument("--min-seconds", type=float, default=0.3, help="shorter jobs are summed into one line")
    p.add_argument("--reference-model", default=str(ROOT.parent / "shared" / "data" / "reference" / "reference_model.json"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--demo", action="store_true", help="the demo's stages and fleet (conf/local.yaml's generate)")
    p.add_argument("--profile", type=int, nargs="?", const=12, default=0, metavar="TOP",
                   help="profile each stage: seconds per kind of fixed Delta cost, then the TOP heaviest functions")
    args = p.parse_args(argv)

    from ai4dl import stages
    from ai4dl.config import load_config
    from ai4dl.lake.session import get_spark

    work = Path(args.workdir)
    fleet = work / f"fleet-{args.containers}x{args.steps}"
    shutil.rmtree(work / "lake", ignore_errors=True)
    shutil.rmtree(work / "models", ignore_errors=True)
    paths = [f"lake.root={work / 'lake'}", f"lake.models={work / 'models'}", f"report.dir={work / 'report'}",
             f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}"]
    if args.demo:
        cfg = load_config(str(ROOT / "conf" / "local.yaml"), [*paths, *args.overrides])
    else:
        cfg = load_config(None, [
            "spark.master=local[2]", "spark.driver_memory=4g", *paths,
            f"generate.containers={args.containers}", f"generate.steps={args.steps}", "generate.seed=7", *args.overrides,
        ])
    print(f"[stage-jobs] load {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    t_start = time.time()
    spark = get_spark(cfg)
    print(f"[stage-jobs] session started in {time.time() - t_start:.1f}s")
    last = max((j["jobId"] for j in jobs_since(spark, -1)), default=-1)
    if args.demo:
        generated: dict = {}
        plan = (
            ("generate", lambda: generated.update(path=stages.generate(cfg, spark).details["path"])),
            ("ingest", lambda: stages.ingest(cfg, spark, input=generated["path"], fmt="csv")),
            *((v, functools.partial(stages.run, v, cfg, spark)) for v in ("window", "train", "label", "behaviour", "policies", "report")),
        )
    else:
        model = stages.import_reference_model(cfg, spark, path=args.reference_model).details["path"]
        if not fleet.exists():
            stages.generate(cfg, spark, out=str(fleet), fmt="csv")
        last = max((j["jobId"] for j in jobs_since(spark, -1)), default=-1)
        plan = (
            ("ingest", lambda: stages.ingest(cfg, spark, input=str(fleet))),
            ("window", lambda: stages.window(cfg, spark, scaler_from_model=model)),
            ("label", lambda: stages.label(cfg, spark, model=model)),
        )
    figures = {}
    if args.profile:
        print(f"[stage-jobs] importing the stage layer in a fresh interpreter: {import_seconds():.2f}s")
    for name, run in plan:
        import cProfile

        profile = cProfile.Profile() if args.profile else None
        t0 = time.time()
        if profile is not None:
            profile.enable()
        run()
        if profile is not None:
            profile.disable()
        wall = time.time() - t0
        jobs = jobs_since(spark, last)
        last = max((j["jobId"] for j in jobs), default=last)
        in_jobs = sum(_seconds(j) for j in jobs)
        print(f"== {name}: {wall:.1f}s wall, {len(jobs)} Spark jobs taking {in_jobs:.1f}s, {wall - in_jobs:.1f}s outside jobs")
        small = [j for j in jobs if _seconds(j) < args.min_seconds]
        for j in jobs:
            if j not in small:
                print(f"   job {j['jobId']:5d} {_seconds(j):6.2f}s {j['numTasks']:5d} tasks  {j['name'][:100]}")
        if small:
            print(f"   {len(small)} jobs under {args.min_seconds}s: {sum(_seconds(j) for j in small):.2f}s")
        if profile is not None:
            print(f"   driver profile of {name}:")
            print("\n".join(profile_lines(profile, args.profile)))
        figures[name] = {"wall_s": round(wall, 2), "jobs": len(jobs), "jobs_s": round(in_jobs, 2)}
    rows = cfg.generate.containers * cfg.generate.steps
    total = sum(f["wall_s"] for f in figures.values())
    print(f"[stage-jobs] stages {total:.1f}s, {time.time() - t_start:.1f}s with the session start")
    print("BENCH_JSON " + json.dumps({"rows": rows, **figures, "stages_s": round(total, 1), "load": os.getloadavg()[0]}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
