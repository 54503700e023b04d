"""Throughput and driver memory of every pipeline stage on a generated fleet (a script that prints figures).

    .venv/bin/python bench/pipeline.py                       # 5000 containers x 2000 steps = 10M rows
    .venv/bin/python bench/pipeline.py --containers 200 --steps 500
    .venv/bin/python bench/pipeline.py --jobs 2                # and each stage's Spark jobs of 2 s or more

Stages, each timed on its own: generate (Spark writes the fleet as parquet), ingest (parquet -> bronze MERGE +
quarantine), window (bronze -> silver, scaler fitted on the training containers), train (CRBM on a sample of
``--sample-size`` windows + k-means on every training window + hold-out score), label (all of silver ->
phases), behaviour (sequences, transitions, phase stats, graphs) and policies (replay of the held-out fleet).

For each stage: rows in, seconds, rows/s, and driver memory peaks during the stage:

- ``py_rss_peak``: the Python driver's peak RSS (VmHWM of this process, reset before each stage through
  ``/proc/self/clear_refs``; ``ru_maxrss``, the whole-run peak, is printed as well);
- ``jvm_rss_peak``: the JVM's peak RSS (VmHWM of the py4j gateway's java process, reset the same way). In
  ``local[*]`` mode the JVM is driver and executor at once, so this is the whole Spark process;
- ``jvm_heap_peak``: the highest used heap (``Runtime.totalMemory - freeMemory``) seen by a sampler thread
  every 0.5 s.

Nothing is collected to the driver here beyond counts (the library's own small collects stay as they are).
The last line is ``BENCH_JSON {...}`` for machines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ai4dl.config import load_config  # noqa: E402
from stage_jobs import ui_rest  # noqa: E402  (bench/, the script's own folder)


def _status_kb(pid: int | str, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _reset_hwm(pid: int | str) -> bool:
    """Reset a process's VmHWM to its current RSS (Linux >= 4.0, own processes); False if not possible."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def jvm_pid(spark) -> int | None:
    """The JVM behind the py4j gateway: the Popen'd spark-submit process execs java; else its java child."""
    proc = getattr(spark.sparkContext._gateway, "proc", None) or getattr(spark.sparkContext._gateway, "java_process", None)
    candidates = [proc.pid] if proc is not None else _children(os.getpid())
    for pid in candidates:
        if "java" in _cmdline(pid).split(" ")[0]:
            return pid
        for child in _children(pid):
            if "java" in _cmdline(child).split(" ")[0]:
                return child
    return None


class HeapSampler:
    """Highest used JVM heap seen since the last :meth:`reset` (py4j call from a daemon thread)."""

    def __init__(self, spark, interval: float = 0.5) -> None:
        self.runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        self.max_heap = int(self.runtime.maxMemory())
        self.peak = 0
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            used = int(self.runtime.totalMemory()) - int(self.runtime.freeMemory())
        except Exception:  # the gateway going away at shutdown
            return
        self.peak = max(self.peak, used)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def reset(self) -> None:
        self.peak = 0
        self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class PythonWorkers:
    """Spark's Python workers on this machine (``pyspark.daemon`` and the workers it forks, which share its
    command line), sampled every ``interval`` s: the most alive at once and how many distinct processes were
    seen since the last :meth:`reset` (with ``spark.python.worker.reuse`` each task slot keeps one worker; every
    further process is a worker started again, paying the UDF modules' imports, torch's among them)."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak = 0
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        alive = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and "pyspark.daemon" in _cmdline(int(d.name)):
                alive.append(int(d.name))
        self.peak = max(self.peak, len(alive))
        self.seen.update(alive)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def reset(self) -> None:
        self.peak = 0
        self.seen = set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


_SIZE = re.compile(r"([0-9][0-9.,]*)\s*(B|KiB|MiB|GiB|TiB)\b")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _bytes_of(text: str) -> float:
    """The first size in a SQL metric's text (``"1024.0 KiB"``, or ``"total (min, med, max)\n3.0 MiB (...)"``)."""
    m = _SIZE.search(text or "")
    return float(m.group(1).replace(",", "")) * _UNITS[m.group(2)] if m else 0.0


def spark_work_since(spark, after_stage: int, after_sql: int) -> dict:
    """What a bench stage asked of Spark, from the UI's REST API: tasks, executor run and GC time, input and shuffle
    bytes of the Spark stages after ``after_stage``; how many broadcasts the SQL executions after ``after_sql``
    built and their sizes (BroadcastExchange's ``data size``)."""
    stages = [s for s in ui_rest(spark, "stages?status=complete") if s["stageId"] > after_stage]
    sql = [e for e in ui_rest(spark, "sql?details=true&planDescription=false&length=100000") if e["id"] > after_sql]
    broadcasts = [_bytes_of(m["value"]) for e in sql for n in e.get("nodes", []) if n.get("nodeName") == "BroadcastExchange"
                  for m in n.get("metrics", []) if m.get("name") == "data size"]
    return {
        "spark_stages": len(stages),
        "tasks": sum(s["numTasks"] for s in stages),
        "executor_run_s": round(sum(s["executorRunTime"] for s in stages) / 1000, 1),
        "gc_s": round(sum(s.get("jvmGcTime", 0) for s in stages) / 1000, 1),
        "input_mb": round(sum(s["inputBytes"] for s in stages) / 2**20, 1),
        "shuffle_write_mb": round(sum(s["shuffleWriteBytes"] for s in stages) / 2**20, 1),
        "shuffle_read_mb": round(sum(s["shuffleReadBytes"] for s in stages) / 2**20, 1),
        "broadcasts": len(broadcasts),
        "broadcast_mb_total": round(sum(broadcasts) / 2**20, 2),
        "broadcast_mb_max": round(max(broadcasts, default=0.0) / 2**20, 2),
    }


def table_files(spark, lake) -> dict[str, dict]:
    """Per Delta table of the lake: its data files and MB at the end (``DESCRIBE DETAIL``); Delta's write
    commands do not report their files in the SQL metrics the stages are read from."""
    from ai4dl.lake.tables import TABLES
    out = {}
    for name in TABLES:
        if lake.exists(name):
            d = spark.sql(f"DESCRIBE DETAIL delta.`{lake.path(name)}`").first()
            out[name] = {"files": int(d["numFiles"]), "mb": round(int(d["sizeInBytes"]) / 2**20, 1)}
    return out


def _last_ids(spark) -> tuple[int, int]:
    stages = ui_rest(spark, "stages")
    sql = ui_rest(spark, "sql?details=false&length=100000")
    return max((s["stageId"] for s in stages), default=-1), max((e["id"] for e in sql), default=-1)


class Meter:
    def __init__(self, spark, jobs_over: float | None = None, spark_work: bool = False) -> None:
        self.spark = spark
        self.jvm = jvm_pid(spark)
        self.heap = HeapSampler(spark)
        self.stages: list[dict] = []
        self.jobs_over = jobs_over
        self.workers = PythonWorkers() if spark_work else None

    def _print_jobs(self, after: int, seconds: float) -> None:
        """The stage's Spark jobs from the UI's REST API (as bench/stage_jobs.py), the longer ones by call site."""
        from stage_jobs import _seconds, jobs_since

        jobs = jobs_since(self.spark, after)
        in_jobs = sum(_seconds(j) for j in jobs)
        print(f"[bench]   {len(jobs)} Spark jobs taking {in_jobs:.1f}s, {seconds - in_jobs:.1f}s outside jobs")
        small = [j for j in jobs if _seconds(j) < self.jobs_over]
        for j in jobs:
            if _seconds(j) >= self.jobs_over:
                print(f"[bench]   job {j['jobId']:>4} {_seconds(j):7.1f}s {j['numTasks']:>5} tasks  {j['name'][:110]}")
        if small:
            print(f"[bench]   {len(small)} jobs under {self.jobs_over}s: {sum(_seconds(j) for j in small):.1f}s")

    def run(self, name: str, rows_in, fn, *args, **kwargs):
        """Time ``fn``; ``rows_in`` is an int or a callable evaluated (untimed) before the stage."""
        n = rows_in() if callable(rows_in) else rows_in
        py_reset = _reset_hwm("self")
        jvm_reset = self.jvm is not None and _reset_hwm(self.jvm)
        self.heap.reset()
        if self.jobs_over is not None:
            from stage_jobs import jobs_since

            last_job = max((j["jobId"] for j in jobs_since(self.spark, -1)), default=-1)
        if self.workers is not None:
            last_ids = _last_ids(self.spark)
            self.workers.reset()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds = time.perf_counter() - t0
        self.heap._sample()
        rec = {
            "stage": name,
            "rows_in": int(n),
            "seconds": round(seconds, 2),
            "rows_per_s": round(n / seconds, 1) if seconds > 0 else None,
            "py_rss_peak_mb": round((_status_kb("self", "VmHWM") or 0) / 1024, 1),
            "py_peak_is_stage": py_reset,
            "jvm_rss_peak_mb": round((_status_kb(self.jvm, "VmHWM") or 0) / 1024, 1) if self.jvm else None,
            "jvm_peak_is_stage": bool(jvm_reset),
            "jvm_heap_peak_mb": round(self.heap.peak / 2**20, 1),
        }
        if self.workers is not None:
            self.workers._sample()
            rec.update(spark_work_since(self.spark, *last_ids), python_workers_peak=self.workers.peak,
                       python_workers_seen=len(self.workers.seen))
        self.stages.append(rec)
        print(
            f"[bench] {name:<10} rows_in={n:>11,} {seconds:9.1f}s {rec['rows_per_s'] or 0:>12,.0f} rows/s  "
            f"py_rss_peak={rec['py_rss_peak_mb']:.0f}MB jvm_rss_peak={rec['jvm_rss_peak_mb']}MB "
            f"jvm_heap_peak={rec['jvm_heap_peak_mb']:.0f}MB",
            flush=True,
        )
        if self.workers is not None:
            print(f"[bench]   {rec['tasks']} tasks in {rec['spark_stages']} Spark stages, executors {rec['executor_run_s']} s "
                  f"(GC {rec['gc_s']} s); shuffle write {rec['shuffle_write_mb']} MB; {rec['broadcasts']} broadcasts "
                  f"({rec['broadcast_mb_total']} MB, largest {rec['broadcast_mb_max']} MB); Python workers: "
                  f"{rec['python_workers_peak']} at once, {rec['python_workers_seen']} processes", flush=True)
        if self.jobs_over is not None:
            self._print_jobs(last_job, seconds)
        return out


def _table(stages: list[dict]) -> str:
    head = f"{'stage':<10} {'rows in':>12} {'seconds':>9} {'rows/s':>12} {'py RSS MB':>10} {'JVM RSS MB':>11} {'JVM heap MB':>12}"
    lines = [head, "-" * len(head)]
    for s in stages:
        lines.append(
            f"{s['stage']:<10} {s['rows_in']:>12,} {s['seconds']:>9.1f} {s['rows_per_s'] or 0:>12,.0f} "
            f"{s['py_rss_peak_mb']:>10.0f} {s['jvm_rss_peak_mb'] or 0:>11.0f} {s['jvm_heap_peak_mb']:>12.0f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--containers", type=int, default=5000)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--workdir", default="/tmp/ai4dl-bench", help="fleet, lake, models and report go here")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--driver-memory", default="10g", help="spark.driver.memory (the whole local JVM)")
    p.add_argument("--shuffle-partitions", type=int, default=24)
    p.add_argument("--epochs", type=int, default=5, help="CRBM epochs (train.epochs)")
    p.add_argument("--sample-size", type=int, default=100_000, help="CRBM training sample (train.sample_size)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="extra config override")
    p.add_argument("--keep", action="store_true", help="keep the workdir afterwards (default: delete it)")
    p.add_argument("--jobs", type=float, default=None, metavar="SECONDS",
                   help="after each stage, list its Spark jobs of at least SECONDS (from the Spark UI's REST API)")
    p.add_argument("--spark-work", action="store_true",
                   help="per stage also what it asked of Spark (tasks, shuffle, broadcasts; the UI's REST API) and the "
                        "Python workers alive on this machine (bench/cluster.py)")
    p.add_argument("--stages", default="generate,ingest,window,train,label,behaviour,policies",
                   help="comma-separated subset, to rerun later stages on a kept workdir")
    args = p.parse_args(argv)

    work = Path(args.workdir).absolute()
    stages = args.stages.split(",")
    if "generate" in stages and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    fleet = str(work / "fleet")
    cfg = load_config(None, [
        f"spark.master={args.master}",
        f"spark.driver_memory={args.driver_memory}",
        f"spark.shuffle_partitions={args.shuffle_partitions}",
        f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}",
        f"spark.app_name=ai4dl-bench",
        f"lake.root={work / 'lake'}",
        f"lake.models={work / 'models'}",
        f"report.dir={work / 'report'}",
        f"train.epochs={args.epochs}",
        f"train.sample_size={args.sample_size}",
        f"generate.containers={args.containers}",
        f"generate.steps={args.steps}",
        f"generate.seed={args.seed}",
        *args.overrides,
    ])

    from ai4dl import stages as S
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake

    t_all = time.perf_counter()
    spark = get_spark(cfg)
    meter = Meter(spark, args.jobs, args.spark_work)
    rows = args.containers * args.steps
    print(f"[bench] {args.containers} containers x {args.steps} steps = {rows:,} rows; master {args.master}, "
          f"driver memory {args.driver_memory}, {args.shuffle_partitions} shuffle partitions, "
          f"parallelism {spark.sparkContext.defaultParallelism}; JVM pid {meter.jvm}; workdir {work}", flush=True)
    lake = Lake.for_config(spark, cfg)

    def count(name: str):
        return lambda: lake.count(name)

    # The same stage functions the CLI and the jobs run (run log included), timed one by one.
    extra: dict = {}
    if "generate" in stages:
        meter.run("generate", rows, S.generate, cfg, spark, out=fleet, fmt="parquet")
    if "ingest" in stages:
        res = meter.run("ingest", lambda: spark.read.parquet(fleet).count(), S.ingest, cfg, spark, input=fleet, fmt="parquet")
        extra["ingest"] = res.details["result"].summary()
    if "window" in stages:
        meter.run("window", count("bronze"), S.window, cfg, spark)
    if "train" in stages:
        report = meter.run("train", count("silver"), S.train, cfg, spark).details["report"]
        extra["train"] = {k: v for k, v in report.items() if not isinstance(v, (list, dict))}
    if "label" in stages:
        meter.run("label", count("silver"), S.label, cfg, spark)
    if "behaviour" in stages:
        meter.run("behaviour", count("phases"), S.behaviour, cfg, spark)
    if "policies" in stages:
        meter.run("policies", count("phases"), S.policies, cfg, spark)

    if args.spark_work:  # what the writes left: a cluster's file count is what its readers and OPTIMIZE pay for
        extra["table_files"] = table_files(spark, lake)
    meter.heap.stop()
    if meter.workers is not None:
        meter.workers.stop()
    total = time.perf_counter() - t_all
    ru_py = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    jvm_hwm = (_status_kb(meter.jvm, "VmHWM") or 0) / 1024 if meter.jvm else None
    print()
    print(_table(meter.stages))
    print(f"whole run {total:.0f}s; Python driver ru_maxrss {ru_py:.0f} MB (whole run); JVM max heap "
          f"{meter.heap.max_heap / 2**20:.0f} MB; peaks per stage when *_peak_is_stage, else since start")
    result = {
        "containers": args.containers, "steps": args.steps, "rows": rows, "master": args.master,
        "parallelism": spark.sparkContext.defaultParallelism, "driver_memory": args.driver_memory,
        "shuffle_partitions": args.shuffle_partitions, "epochs": args.epochs, "sample_size": args.sample_size,
        "total_seconds": round(total, 1), "py_ru_maxrss_mb": round(ru_py, 1),
        "jvm_max_heap_mb": round(meter.heap.max_heap / 2**20, 1),
        "jvm_rss_peak_last_stage_mb": round(jvm_hwm, 1) if jvm_hwm is not None else None,
        "stages": meter.stages, **extra,
    }
    print("BENCH_JSON " + json.dumps(result, default=str), flush=True)
    spark.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
