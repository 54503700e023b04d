"""What changes out of one machine: the pipeline on ``local[2]`` against a standalone cluster of 2 workers x 1 core.

    .venv/bin/python bench/cluster.py                                   # 500 x 2000 = 1M rows, four runs
    .venv/bin/python bench/cluster.py --runs local,cluster --shuffle-partitions 8,24

Each run is ``bench/pipeline.py --spark-work`` in a fresh process on the same generated fleet (same seed):
``local`` on ``local[2]``; ``cluster`` on a Spark standalone master and two 1-core workers started here on
loopback from the pyspark install (``tests/standalone.py``, the cluster test's code), the driver a separate JVM
as on a real cluster; ``cluster-noreuse`` the same with ``spark.python.worker.reuse=false``;
``cluster-optimizewrite`` with Delta's optimized writes (``spark.databricks.delta.optimizeWrite.enabled``).
The same two cores either way, so what differs is what a cluster adds: a driver apart from its executors
(results and broadcasts cross a socket), executors' own JVMs and Python daemons (each imports the UDFs'
modules, torch among them), and the shuffle served between processes. Per stage and run: seconds, tasks,
executor time, shuffle written, broadcasts and the Python workers seen (``bench/pipeline.py``'s
``PythonWorkers``); per run, each Delta table's data files at the end. Prints a table per figure and one
``CLUSTER_JSON`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = ("local", "cluster", "cluster-noreuse", "cluster-optimizewrite")


def run_pipeline(name: str, args, partitions: int, work: Path) -> dict:
    """One ``bench/pipeline.py`` run; its BENCH_JSON (the stages) with the run's name and settings."""
    from tests.standalone import StandaloneCluster, cluster_env

    cluster = None
    conf: dict[str, str] = {}
    env = dict(os.environ)
    master = "local[2]"
    if name.startswith("cluster"):
        cluster = StandaloneCluster(work / "cluster", cores=1, memory=args.executor_memory, workers=2).start(timeout=120)
        master, env = cluster.master_url, cluster.env
        conf = {"spark.executor.memory": args.executor_memory, "spark.executor.cores": "1", "spark.cores.max": "2",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
        if name == "cluster-noreuse":
            conf["spark.python.worker.reuse"] = "false"
        if name == "cluster-optimizewrite":  # Delta's optimized writes: a shuffle before each write, fewer files
            conf["spark.databricks.delta.optimizeWrite.enabled"] = "true"
    else:
        env = cluster_env(work / "conf-local")  # the same environment (no machine spark-defaults) as the cluster's
        (work / "conf-local").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "bench" / "pipeline.py"), "--containers", str(args.containers),
           "--steps", str(args.steps), "--workdir", str(work / "pipeline"), "--master", master,
           "--driver-memory", args.driver_memory, "--shuffle-partitions", str(partitions), "--spark-work",
           "--set", f"spark.conf={json.dumps(conf)}"]
    log = work / "pipeline.log"
    t0 = time.time()
    try:
        with open(log, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    finally:
        if cluster is not None:
            cluster.stop()
    text = log.read_text(errors="replace")
    found = [line[len("BENCH_JSON "):] for line in text.splitlines() if line.startswith("BENCH_JSON ")]
    if rc != 0 or not found:
        raise SystemExit(f"{name}: bench/pipeline.py failed (rc {rc}); see {log}\n{text[-3000:]}")
    print(f"[cluster] {name}, {partitions} shuffle partitions: {time.time() - t0:.0f} s wall (log {log})", flush=True)
    return {"run": name, "shuffle_partitions": partitions, "master": master, **json.loads(found[-1])}


FIGURES = (
    ("seconds", "seconds", "{:.1f}"),
    ("tasks", "tasks", "{:d}"),
    ("executor_run_s", "executor time, s (summed over tasks)", "{:.1f}"),
    ("shuffle_write_mb", "shuffle written, MB", "{:.1f}"),
    ("broadcasts", "broadcasts built", "{:d}"),
    ("broadcast_mb_max", "largest broadcast, MB", "{:.2f}"),
    ("python_workers_seen", "Python worker processes seen", "{:d}"),
)


def tables(results: list[dict]) -> str:
    names = [f"{r['run']}/{r['shuffle_partitions']}" for r in results]
    stages = [s["stage"] for s in results[0]["stages"]]
    out = []
    for key, title, fmt in FIGURES:
        head = f"{title:<38}" + "".join(f"{n:>22}" for n in names)
        out += ["", head, "-" * len(head)]
        for i, stage in enumerate(stages):
            cells = [fmt.format(r["stages"][i].get(key, 0)) for r in results]
            out.append(f"{stage:<38}" + "".join(f"{c:>22}" for c in cells))
        if key in ("seconds", "tasks", "executor_run_s", "shuffle_write_mb"):
            total = [sum(s.get(key, 0) for s in r["stages"]) for r in results]
            out.append(f"{'sum':<38}" + "".join(f"{fmt.format(t):>22}" for t in total))
    with_files = [r for r in results if r.get("table_files")]
    if with_files:
        names = [f"{r['run']}/{r['shuffle_partitions']}" for r in with_files]
        head = f"{'Delta data files at the end (MB)':<38}" + "".join(f"{n:>22}" for n in names)
        out += ["", head, "-" * len(head)]
        for table in with_files[0]["table_files"]:
            cells = [r["table_files"].get(table, {}) for r in with_files]
            out.append(f"{table:<38}" + "".join(f"{c.get('files', 0):>14d} ({c.get('mb', 0):>5.1f})" for c in cells))
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--containers", type=int, default=500)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    p.add_argument("--shuffle-partitions", default="8", help="comma-separated: each run at each count")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--executor-memory", default="3g", help="each of the two executors (and its worker's memory)")
    p.add_argument("--workdir", default="/tmp/ai4dl-cluster-bench")
    args = p.parse_args(argv)
    runs = args.runs.split(",")
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        p.error(f"unknown run(s) {unknown}; known: {', '.join(RUNS)}")
    print(f"[cluster] load {os.getloadavg()[0]:.2f} (1 min); {args.containers} x {args.steps} rows; runs {runs}", flush=True)
    results = []
    for partitions in (int(x) for x in args.shuffle_partitions.split(",")):
        for name in runs:
            work = Path(args.workdir) / f"{name}-{partitions}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            results.append(run_pipeline(name, args, partitions, work))
            shutil.rmtree(work / "pipeline", ignore_errors=True)
    print(tables(results))
    print("CLUSTER_JSON " + json.dumps({"containers": args.containers, "steps": args.steps,
                                       "load_at_end": os.getloadavg()[0], "runs": results}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
