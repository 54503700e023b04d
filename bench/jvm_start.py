"""What a local command pays before its first row: session start, a first Delta write, a read and an overwrite.

    .venv/bin/python bench/jvm_start.py                 # 3 runs with the class archive, 3 without, alternating
    .venv/bin/python bench/jvm_start.py --runs 5 --set 'spark.conf={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}'

Each run is a fresh Python process (a fresh JVM), as every ``ai4dl <command>`` is. ``spark.class_archive``
(``ai4dl/lake/session.py``) must have written its archive first (``make install`` does); a run with
``spark.class_archive=false`` starts the JVM without it. Look at ``uptime`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
t0 = time.time()
from ai4dl.config import load_config
from ai4dl.lake.session import get_spark
cfg = load_config(None, json.loads(sys.argv[1]))
spark = get_spark(cfg)
t1 = time.time()
path = cfg.lake.root + "/t"
spark.range(0, int(sys.argv[2])).selectExpr("id", "id % 7 AS k", "rand(1) AS x").write.format("delta").save(path)
t2 = time.time()
spark.read.format("delta").load(path).groupBy("k").count().collect()
spark.read.format("delta").load(path).write.format("delta").mode("overwrite").save(path)
t3 = time.time()
print("FIGURES " + json.dumps({"start": t1 - t0, "first_write": t2 - t1, "read_overwrite": t3 - t2, "total": t3 - t0}))
"""


SESSION = ["spark.master=local[2]", "spark.shuffle_partitions=2", f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}"]


def run_once(overrides: list[str], rows: int = 50000) -> dict[str, float]:
    """A fresh process: session start, a first Delta write of ``rows`` rows, a read and an overwrite (two
    commits); the seconds of each part and of the whole process. With a few rows this is the floor of any
    command that commits (``bench/versus_original.py`` measures it so, with its commands' config).
    ``overrides``: the whole job config of the process, over the built-in defaults."""
    with tempfile.TemporaryDirectory(prefix="ai4dl-jvm-start-") as tmp:
        over = [f"lake.root={tmp}/lake", *overrides]
        t = time.time()
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(over), str(int(rows))], capture_output=True, text=True, cwd=ROOT)
        wall = time.time() - t
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("FIGURES ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr[-2000:]}")
    return {**json.loads(line[len("FIGURES "):]), "process": wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    print(f"[jvm-start] load {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    results: dict[str, list[dict[str, float]]] = {"archive": [], "no archive": []}
    for _ in range(args.runs):
        for name, flag in (("archive", "true"), ("no archive", "false")):
            r = run_once([*SESSION, f"spark.class_archive={flag}", *args.overrides])
            results[name].append(r)
            print(f"  {name:10s} " + "  ".join(f"{k} {v:5.1f}s" for k, v in r.items()), flush=True)
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"[jvm-start] {name:10s} median of {len(rs)}: " + "  ".join(f"{k} {v:.1f}s" for k, v in med.items()))
    print(f"[jvm-start] load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
