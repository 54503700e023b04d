"""What one container's policy replay costs: every policy at every knob value of the grid, as the policies stage
replays each calibration and held-out container (a script that prints figures).

    .venv/bin/python bench/replay_cost.py --workdir /tmp/p1m                    # a kept bench/pipeline.py workdir
    .venv/bin/python bench/replay_cost.py --workdir /tmp/p1m --containers 60 --profile 15

Reads the labelled ``phases`` table and the latest policy model of a workdir that ``bench/pipeline.py --keep``
left (its lake under ``lake/``, its models under ``models/``), brings a seeded sample of containers to the
driver, and times :func:`ai4dl.policies.replay.replay_container_grid` on them in this process, one after the
other (no Spark in the timed part: the figure is the Python work a Spark task does per container, which the
stage multiplies by the containers it replays and divides by the cores). ``--profile N`` adds a cProfile of the
same replays, its N most expensive functions by own time. The last line is ``BENCH_JSON {...}``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ai4dl.config import load_config  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="a workdir bench/pipeline.py --keep left (lake/, models/)")
    p.add_argument("--containers", type=int, default=40, help="containers sampled (seeded) from the phases table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions (own time)")
    args = p.parse_args(argv)

    work = Path(args.workdir).absolute()
    cfg = load_config(None, [f"lake.root={work / 'lake'}", f"lake.models={work / 'models'}", "spark.master=local[2]",
                             f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}", "spark.app_name=ai4dl-bench-replay"])

    import numpy as np
    from pyspark.sql import functions as F

    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake
    from ai4dl.policies.fleet import _plain
    from ai4dl.policies.model import latest_version, load
    from ai4dl.policies.replay import INPUT_COLUMNS, replay_container_grid

    spark = get_spark(cfg)
    lake = Lake.for_config(spark, cfg)
    model_dir = latest_version(cfg.lake.models, cfg.policies.model_name)
    model = load(model_dir)
    stats, flat = _plain(model.phase_stats, model.transitions)
    phases = lake.read("phases")
    pods = sorted(r[0] for r in phases.select("pod_id").distinct().collect())
    chosen = sorted(np.random.default_rng(args.seed).choice(pods, min(args.containers, len(pods)), replace=False).tolist())
    rows = phases.where(F.col("pod_id").isin(chosen)).select(*INPUT_COLUMNS).toPandas()
    frames = [g.sort_values("step").reset_index(drop=True) for _, g in rows.groupby("pod_id", sort=True)]
    steps = sum(len(f) for f in frames)

    def replay_all():
        return [replay_container_grid(f, model.params, stats, flat, {}, None, model.forecasters) for f in frames]

    replay_all()  # first pass: imports and the forecasters' flattened trees
    t = time.perf_counter()
    out = replay_all()
    seconds = time.perf_counter() - t
    per = seconds / len(frames)
    print(f"[bench] {len(frames)} containers ({steps:,} steps, {sum(len(o) for o in out):,} frontier rows) from "
          f"{work}, policy model {model.model_id}: {seconds:.2f} s, {per * 1000:.1f} ms per container, "
          f"{seconds / max(steps, 1) * 1e6:.1f} us per step")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        replay_all()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.profile)
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))
    print("BENCH_JSON " + json.dumps({"containers": len(frames), "steps": steps, "seconds": round(seconds, 3),
                                      "ms_per_container": round(per * 1000, 2), "policy_model": model.model_id,
                                      "workdir": str(work)}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
