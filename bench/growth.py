"""How each stage's time grows with the input: bench/pipeline.py at several sizes, and the fitted exponent.

    .venv/bin/python bench/growth.py                              # 500, 1500 and 5000 containers x 2000 steps
    .venv/bin/python bench/growth.py --containers 100,300,1000 --steps 1000

Runs ``bench/pipeline.py`` once per size, each in a fresh process (one JVM per size, so no size warms the next),
reads its ``BENCH_JSON`` line and fits, per stage, ``seconds = a * rows ** b`` by least squares on the logs: ``b``
near 1 is linear growth, above 1 a stage that slows per row as the input grows, below 1 a fixed cost still
dominating. Prints the seconds per size, the exponent per stage and one ``GROWTH_JSON`` line; the pipeline's own
output goes to ``WORKDIR/pipeline-ROWS.log``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def exponent(rows: list[float], seconds: list[float]) -> float:
    """The least-squares slope of log(seconds) on log(rows).

    >>> round(exponent([1e6, 3e6, 1e7], [10.0, 30.0, 100.0]), 3)
    1.0
    """
    xs, ys = [math.log(r) for r in rows], [math.log(max(s, 1e-9)) for s in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--containers", default="500,1500,5000", help="comma-separated container counts, one run each")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--workdir", default="/tmp/ai4dl-growth")
    p.add_argument("pipeline_args", nargs="*", help="passed to bench/pipeline.py after --")
    args = p.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    print(f"[growth] load {os.getloadavg()[0]:.2f} (1 min) at the start", flush=True)
    for containers in (int(c) for c in args.containers.split(",")):
        rows = containers * args.steps
        log = work / f"pipeline-{rows}.log"
        cmd = [sys.executable, str(ROOT / "bench" / "pipeline.py"), "--containers", str(containers), "--steps",
               str(args.steps), "--workdir", str(work / "run"), *args.pipeline_args]
        with open(log, "w") as out:
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, cwd=ROOT)
        line = next(l for l in log.read_text().splitlines() if l.startswith("BENCH_JSON "))
        result = json.loads(line[len("BENCH_JSON "):])
        runs.append(result)
        print(f"[growth] {rows:,} rows: {result['total_seconds']:.0f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    names = [s["stage"] for s in runs[0]["stages"]]
    sizes = [r["rows"] for r in runs]
    fitted = {}
    print(f"\n{'stage':<10} " + " ".join(f"{s:>12,}" for s in sizes) + f" {'exponent':>9}")
    for name in names:
        secs = [next(s["seconds"] for s in r["stages"] if s["stage"] == name) for r in runs]
        fitted[name] = round(exponent(sizes, secs), 3)
        print(f"{name:<10} " + " ".join(f"{s:>12.1f}" for s in secs) + f" {fitted[name]:>9.2f}")
    totals = [r["total_seconds"] for r in runs]
    fitted["total"] = round(exponent(sizes, totals), 3)
    print(f"{'total':<10} " + " ".join(f"{s:>12.1f}" for s in totals) + f" {fitted['total']:>9.2f}")
    print("GROWTH_JSON " + json.dumps({"rows": sizes, "exponents": fitted,
                                       "seconds": {n: [next(s["seconds"] for s in r["stages"] if s["stage"] == n) for r in runs] for n in names},
                                       "total_seconds": totals}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
