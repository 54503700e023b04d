"""Throughput and delay of the live stream (``ai4dl stream``) on a generated fleet (a script that prints figures).

    .venv/bin/python bench/stream.py                                  # default: a few minutes
    .venv/bin/python bench/stream.py --containers 100 --backlog-steps 500 --feed-seconds 120
    .venv/bin/python bench/stream.py --ages-only                      # measurement 3 alone, no Spark stream

Three measurements, one local Spark session (``--master``, default ``local[2]``), the imported reference model
(no training; or ``--model DIR``, e.g. a model with the default derived features) and a policy model fitted on
another generated fleet (``ai4dl policies`` there, as a production stream deploys a model fitted offline),
deploying ``--policy`` (default ``vpa``, the dearest state: two decaying histograms per container):

1. **Sustained rows/s**: ``containers x backlog-steps`` samples ingested into bronze first, then one
   ``availableNow`` run labels them all and writes phases and recommendations; rows / wall seconds of that run
   (query start included).
2. **Delay at a given input rate**: a continuous query (micro-batch every ``--interval`` s) runs while a feeder
   ingests ``--feed-steps`` new steps of every container every ``--period`` seconds for ``--feed-seconds``
   (input rate = containers x feed-steps / period rows/s). The delay of a sample is from its ``ingested_at``
   (bronze's load timestamp, taken when its ingest MERGE starts) to the end of the micro-batch that committed
   its phase and its container's recommendation; p50 / p99 / max over all fed samples.
3. **State and work per container against its age** (``--ages``, default 100 to 20,000 steps): the stream's
   per-container step (:func:`ai4dl.stream.online.advance`, what each micro-batch runs for each container) fed
   a container's trace in micro-batches of ``--batch-steps`` steps; at each age, the mean time of the next
   micro-batches and the size of the state Spark's store keeps (the window's raw samples, the phase run, the
   policies' JSON summaries), for each policy of ``--age-policies``. A state and a per-batch time that stay flat
   from 100 to 20,000 steps are what "O(1) in the container's age" means.

The last line is ``BENCH_JSON {...}`` for machines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ai4dl.config import load_config  # noqa: E402


def fit_policy_model(cfg, spark, model: str, work: Path, containers: int, steps: int) -> str:
    """A policy model fitted on another generated fleet (seed 11), labelled by ``model``: what the stream
    deploys, fitted offline as in production."""
    from ai4dl import stages
    from ai4dl.traces.synthetic import generate_fleet, write_fleet

    train = cfg.replace(lake={"root": str(work / "training-lake")})
    path = str(work / "raw" / "training")
    write_fleet(generate_fleet(spark, containers, steps, seed=11, partitions=2), path, "csv")
    stages.ingest(train, spark, input=path)
    stages.window(train, spark, scaler_from_model=model)
    stages.label(train, spark, model=model)
    return stages.policies(train, spark).details["path"]


def state_against_age(cfg, model_dir: str, policy_dir: str, policies: list[str], ages: list[int], batch_steps: int,
                      timed_batches: int) -> list[dict]:
    """Measurement 3: the per-container step of the stream at each age, for each policy (no Spark)."""
    import numpy as np
    import pandas as pd

    from ai4dl.lake.columns import BEHAVIOUR, METRICS
    from ai4dl.method.model import load
    from ai4dl.policies.live import Deployment
    from ai4dl.policies.model import load as load_policies
    from ai4dl.stream.online import Live, advance, state_to_tuple

    model, policy_model = load(model_dir), load_policies(policy_dir)
    n = max(ages) + timed_batches * batch_steps
    rng = np.random.default_rng(5)
    cores, limit = 4.0, 8e9
    cpu = np.clip(rng.gamma(2.0, 0.6, n), 0, cores)
    mem = np.clip(2e9 + np.cumsum(rng.normal(0, 3e7, n)), 3e8, limit)
    frame = pd.DataFrame({m: 0.0 for m in METRICS}, index=range(n))
    frame["cpu_num_cores"], frame["cpu_usage_cores"], frame["cpu_usage"] = cores, cpu, cpu * 1e9
    frame["cpu_usage_pct"] = frame["cpu_usage_pct_container_requested"] = 100 * cpu / cores
    frame["mem_limit"], frame["mem_current"], frame["mem_working_set"] = limit, mem, mem
    frame["mem_usage_pct"] = 100 * mem / limit
    frame["pod_id"], frame["service"], frame[BEHAVIOUR] = "p", "s", None
    frame["ts"] = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.arange(n) * 30, unit="s")
    frame["source_file"], frame["ingested_at"] = "bench", frame["ts"]
    out = []
    for policy in policies:
        live = Live(model=model, model_id=model.model_id, n_history=cfg.window.n_history,
                    deployment=Deployment.of(policy_model, policy), next_phase=policy_model.next_phase,
                    service_next_phase=policy_model.service_next_phase)
        state, done = None, 0
        for age in sorted(ages):
            while done < age:  # grow the container to this age, a micro-batch at a time (untimed)
                _, state = advance("p", frame.iloc[done:min(done + batch_steps, age)], state, live)
                done = min(done + batch_steps, age)
            probe, seconds = state, []
            for b in range(timed_batches):  # the next micro-batches at this age, timed; the container stays at `age`
                rows = frame.iloc[age + b * batch_steps: age + (b + 1) * batch_steps]
                t = time.perf_counter()
                _, probe = advance("p", rows, probe, live)
                seconds.append(time.perf_counter() - t)
            size = sum(len(v) if isinstance(v, str) else 8 * len(v) if isinstance(v, list) else 8
                       for v in state_to_tuple(state) if v is not None)
            out.append({"policy": policy, "deployed": live.deployment.policies, "age_steps": age,
                        "batch_ms": round(1000 * float(np.median(seconds)), 2), "state_bytes": size})
            print(f"  {policy:<16} age {age:>6} steps: micro-batch of {batch_steps} steps {out[-1]['batch_ms']:.1f} ms "
                  f"(median of {timed_batches}), state {size:,} bytes")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--containers", type=int, default=20)
    p.add_argument("--backlog-steps", type=int, default=200)
    p.add_argument("--feed-steps", type=int, default=3, help="new steps per container and feed period")
    p.add_argument("--period", type=float, default=5.0, help="seconds between two feeds")
    p.add_argument("--feed-seconds", type=float, default=40.0)
    p.add_argument("--interval", type=float, default=1.0, help="micro-batch interval of the continuous query")
    p.add_argument("--policy", default="vpa", help="what the stream deploys: best, or a live policy")
    p.add_argument("--ages", default="100,1000,5000,20000", help="measurement 3: container ages in steps")
    p.add_argument("--age-policies", default="vpa,prev.step.rules,phase.headroom,best")
    p.add_argument("--batch-steps", type=int, default=10, help="measurement 3: steps per micro-batch")
    p.add_argument("--ages-only", action="store_true", help="measurement 3 alone")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--reference-model", default=str(ROOT.parent / "shared" / "data" / "reference" / "reference_model.json"))
    p.add_argument("--model", help="a trained model directory to label with instead of the imported reference model "
                   "(e.g. one with the default derived features)")
    p.add_argument("--work", help="working folder (default: a temporary one, removed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    a = p.parse_args()

    work = Path(a.work or tempfile.mkdtemp(prefix="ai4dl-bench-stream-"))
    cfg = load_config(None, [
        f"spark.master={a.master}", "spark.shuffle_partitions=2", "spark.driver_memory=2g",
        f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}", f"lake.root={work / 'lake'}", f"lake.models={work / 'models'}",
        f"report.dir={work / 'report'}", f"stream.policy={a.policy}", f"stream.interval_seconds={a.interval}",
        *a.set,
    ])
    from ai4dl import stages
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake
    from ai4dl.traces.synthetic import generate_fleet, write_fleet

    spark = get_spark(cfg)
    lake = Lake.for_config(spark, cfg)
    try:
        model = a.model or stages.import_reference_model(cfg, spark, path=a.reference_model).details["path"]
        policy_model = fit_policy_model(cfg, spark, model, work, containers=40, steps=300)
        cfg = cfg.replace(label={"model": model}, policies={"model": policy_model})
        print(f"[stream] load {os.getloadavg()[0]:.2f}; policy model {policy_model}")
        print(f"state and work per container against its age ({a.batch_steps}-step micro-batches):")
        ages = state_against_age(cfg, model, policy_model, a.age_policies.split(","), [int(x) for x in a.ages.split(",")],
                                 a.batch_steps, timed_batches=20)
        if a.ages_only:
            print("BENCH_JSON " + json.dumps({"ages": ages, "loadavg": os.getloadavg()[0]}))
            return
        feeds = max(int(a.feed_seconds // a.period), 1)
        total_steps = a.backlog_steps + feeds * a.feed_steps
        interval_s = cfg.generate.interval_seconds
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        fleet = generate_fleet(spark, a.containers, total_steps, seed=3, partitions=2)
        # each container starts at its own offset: cut by step, not by timestamp
        first_ts = F.min("timestamp").over(Window.partitionBy(F.col("`pod.id`")))
        fleet = fleet.withColumn("_step", ((F.col("timestamp") - first_ts) / interval_s).cast("int")).cache()

        def write(where: str, path: str) -> str:
            write_fleet(fleet.where(where).drop("_step"), path, "csv")
            return path

        backlog = write(f"_step < {a.backlog_steps}", str(work / "raw" / "backlog"))
        chunks = []
        for i in range(feeds):
            lo = a.backlog_steps + i * a.feed_steps
            chunks.append(write(f"_step >= {lo} AND _step < {lo + a.feed_steps}", str(work / "raw" / f"feed{i:03d}")))
        stages.ingest(cfg, spark, input=backlog)

        # 1. sustained throughput over the backlog
        t0 = time.time()
        first = stages.stream(cfg, spark).details["report"]
        seconds = time.time() - t0
        rows = first.phases
        assert rows == a.containers * a.backlog_steps, f"labelled {rows} of {a.containers * a.backlog_steps} backlog rows"
        throughput = rows / seconds
        print(f"backlog micro-batch by part: " + ", ".join(f"{k} {v:.1f}s" for k, v in first.parts.items()))
        print(f"throughput: {rows} rows ({a.containers} containers x {a.backlog_steps} steps) in {seconds:.1f}s "
              f"= {throughput:.0f} rows/s ({first.batches} micro-batch(es), policy {a.policy})")

        # 2. delay at an input rate, continuous trigger
        rate = a.containers * a.feed_steps / a.period
        result: dict = {}
        cont = cfg.replace(stream={"trigger": "continuous", "max_seconds": a.feed_seconds + 30.0})

        def run() -> None:
            result["report"] = stages.stream(cont, spark, measure_delays=True).details["report"]

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        time.sleep(10.0)  # let the query start before the first sample lands
        fed = 0
        for path in chunks:
            t = time.time()
            stages.ingest(cfg, spark, input=path)
            fed += a.containers * a.feed_steps
            time.sleep(max(a.period - (time.time() - t), 0.0))
        runner.join()
        report = result["report"]
        import numpy as np

        d = np.asarray(report.delays)
        figures = {
            "containers": a.containers, "backlog_rows": rows, "throughput_rows_per_s": round(throughput, 1),
            "input_rate_rows_per_s": rate, "fed_rows": fed, "delayed_rows": int(d.size),
            "delay_p50_s": round(float(np.percentile(d, 50)), 2) if d.size else None,
            "delay_p99_s": round(float(np.percentile(d, 99)), 2) if d.size else None,
            "delay_max_s": round(float(d.max()), 2) if d.size else None,
            "micro_batches": report.batches, "policy": a.policy, "master": a.master,
            "loadavg": os.getloadavg()[0],
        }
        print(f"delay at {rate:.0f} rows/s input (feed every {a.period:.0f}s, micro-batch every {a.interval:.0f}s): "
              f"p50 {figures['delay_p50_s']}s, p99 {figures['delay_p99_s']}s, max {figures['delay_max_s']}s over "
              f"{d.size} of {fed} fed rows, {report.batches} micro-batches; load average {figures['loadavg']:.1f}")
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in report.parts.items())
        print(f"micro-batch time by part (continuous run, summed): {parts}; total {sum(report.batch_seconds):.1f}s")
        figures["batch_parts_s"] = {k: round(v, 2) for k, v in report.parts.items()}
        figures["ages"] = ages
        print("BENCH_JSON " + json.dumps(figures))
    finally:
        spark.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
