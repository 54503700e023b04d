"""Reliability under kill -9: ingest, window and label killed at random moments, rerun, and compared with a clean run.

    .venv/bin/python bench/faults.py                  # 3 rounds x (ingest, window, label), 40 containers x 300 steps
    .venv/bin/python bench/faults.py --rounds 5 --seed 2

A clean lake is built first (generate -> ingest -> window -> train -> label, each stage a separate
``python -m ai4dl.cli`` process, as a scheduler would run them). Then, on a second lake, every round kills each
of ingest, window and label with SIGKILL (the whole process group: driver JVM and Python workers) after a
random delay within that stage's clean duration, reruns it to completion, and checks:

- the stage's output table equals the clean run's (same rows, load timestamps aside);
- the run log is consistent: no run failed, every run that logged ``finished`` logged ``started`` first, and a
  killed run that got as far as logging its start shows as ``unfinished`` (``ai4dl log``);
- table versions committed by a killed run, if any, are reported (``orphan_commits``): the data stays a
  complete Delta version, only the run log never recorded it.

Prints one line per kill and ``kills survived / attempted`` with any divergence. A figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TIMESTAMPS = {"ingested_at", "quarantined_at", "finished_at", "started_at"}
OUTPUT = {"ingest": "bronze", "window": "silver", "label": "phases"}


def _cli(verb_args: list[str], lake: Path, models: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "ai4dl.cli", *verb_args,
        "--set", "spark.master=local[2]", "--set", "spark.shuffle_partitions=4", "--set", "spark.driver_memory=2g",
        "--set", f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}",
        "--set", f"lake.root={lake}", "--set", f"lake.models={models}", "--set", f"report.dir={lake.parent / 'report'}",
        *extra,
    ]


def _run(cmd: list[str], log: Path) -> float:
    t0 = time.time()
    with log.open("ab") as out:
        code = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[3:5])} failed (rc={code}); see {log}")
    return time.time() - t0


def _kill_after(cmd: list[str], delay: float, log: Path) -> bool:
    """Start ``cmd``, SIGKILL its process group after ``delay`` s; False when it finished before the kill."""
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def _rows(spark, path: str) -> list:
    df = spark.read.format("delta").load(path)
    cols = [c for c in df.columns if c not in TIMESTAMPS]
    return sorted((json.dumps(r.asDict(recursive=True), sort_keys=True, default=str) for r in df.select(*cols).collect()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--containers", type=int, default=40)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", default="/tmp/ai4dl-faults")
    args = p.parse_args(argv)

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "runs.log"
    clean, faulty = work / "clean" / "lake", work / "faulty" / "lake"
    models = work / "models"
    small = ["--set", "train.epochs=3", "--set", "train.sample_size=5000", "--set", "train.device=cpu"]
    fleet = work / "fleet"
    print(f"[faults] load: {os.getloadavg()[0]:.2f} (1 min); workdir {work}", flush=True)

    _run(_cli(["generate", "--containers", str(args.containers), "--steps", str(args.steps), "--out", str(fleet)], clean, models, []), log)
    durations = {}
    durations["ingest"] = _run(_cli(["ingest", str(fleet)], clean, models, []), log)
    durations["window"] = _run(_cli(["window"], clean, models, []), log)
    _run(_cli(["train"], clean, models, small), log)
    model = sorted((models / "ai4dl").iterdir())[-1]
    durations["label"] = _run(_cli(["label", "--model", str(model)], clean, models, []), log)
    print("[faults] clean run: " + ", ".join(f"{k} {v:.0f}s" for k, v in durations.items()), flush=True)

    from ai4dl.config import load_config
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake, orphan_commits, run_history

    cfg = load_config(None, ["spark.master=local[1]", f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}", f"lake.root={faulty}"])
    spark = get_spark(cfg)
    clean_lake, faulty_lake = Lake(spark, str(clean)), Lake(spark, str(faulty))
    reference = {t: _rows(spark, clean_lake.path(t)) for t in OUTPUT.values()}

    rng = random.Random(args.seed)
    verb_args = {"ingest": ["ingest", str(fleet)], "window": ["window"], "label": ["label", "--model", str(model)]}
    attempted = survived = 0
    divergences: list[str] = []
    for rnd in range(args.rounds):
        for verb in ("ingest", "window", "label"):
            cmd = _cli(verb_args[verb], faulty, models, [])
            delay = rng.uniform(0.2, 1.0) * durations[verb]
            killed = _kill_after(cmd, delay, log)
            _run(cmd, log)  # the rerun, to completion
            attempted += 1
            table = OUTPUT[verb]
            same = _rows(spark, faulty_lake.path(table)) == reference[table]
            history = run_history(faulty_lake, last=1000)
            unfinished = set(history.loc[history["status"] == "unfinished", "run_id"])
            failed = set(history.loc[history["status"] == "failed", "run_id"])
            log_rows = faulty_lake.read("run_log").toPandas()
            started = set(log_rows.loc[log_rows["status"] == "started", "run_id"])
            finished = set(log_rows.loc[log_rows["status"] == "finished", "run_id"])
            orphans = [o for o in orphan_commits(faulty_lake) if o[0] == table]
            # Consistent: no failed run, every finished run logged its start, and every commit of the table made
            # by a run that did not finish belongs to a run whose "started" row is there (a kill before the run
            # logged its start leaves neither a row nor a commit).
            consistent = not failed and finished <= started and all(run in started for _, _, run in orphans)
            ok = same and consistent
            survived += ok
            if not ok:
                divergences.append(f"round {rnd} {verb}: table equal={same}, run log consistent={consistent}")
            print(f"[faults] round {rnd} {verb:<6} {'killed' if killed else 'finished first'} after {delay:5.1f}s; "
                  f"rerun -> {table} {'equal' if same else 'DIFFERENT'} to clean; run log {'consistent' if consistent else 'INCONSISTENT'}; "
                  f"unfinished runs so far {len(unfinished)}; versions of {table} by unfinished runs {[v for _, v, _ in orphans]}",
                  flush=True)
    print(f"[faults] kills survived {survived} / attempted {attempted}" + ("" if not divergences else "; " + "; ".join(divergences)))
    spark.stop()
    return 0 if survived == attempted else 1


if __name__ == "__main__":
    sys.exit(main())
