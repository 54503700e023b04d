"""Are two lakes' tables the same? Row by row (as multisets), every Delta table under the first root.

    .venv/bin/python bench/compare_lakes.py /tmp/before/data/lake data/lake

How "nothing changes in results" is checked after a speed change: run the demo (or the reference run) with the
old code into one folder and with the new code into another, then compare. Columns that record when or from
where a row was written (ingest and quarantine times, the source file's path, the run log) are left out; every
other column must match exactly, floats to the bit. Prints one line per table; exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WHEN_OR_WHERE = {"source_file", "ingested_at", "quarantined_at"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    args = p.parse_args(argv)

    from ai4dl.config import load_config
    from ai4dl.lake.session import get_spark

    spark = get_spark(load_config(None, ["spark.master=local[2]", f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}"]))
    before, after = os.path.abspath(args.before), os.path.abspath(args.after)
    tables = sorted({os.path.dirname(p)[len(before):] for p in glob.glob(f"{before}/**/_delta_log", recursive=True)})
    differ = 0
    for t in tables:
        if t.startswith("/_meta"):  # the run log: ids and times of runs
            continue
        a = spark.read.format("delta").load(before + t)
        if not os.path.isdir(after + t):
            print(f"{t:32s} missing in {after}")
            differ += 1
            continue
        b = spark.read.format("delta").load(after + t)
        cols = [c for c in a.columns if c not in WHEN_OR_WHERE]
        if [c for c in b.columns if c not in WHEN_OR_WHERE] != cols:
            print(f"{t:32s} columns differ: {a.columns} / {b.columns}")
            differ += 1
            continue
        a, b = a.select(*cols), b.select(*cols)
        only_a, only_b = a.exceptAll(b).count(), b.exceptAll(a).count()
        differ += bool(only_a or only_b)
        print(f"{t:32s} rows {a.count():>9} / {b.count():<9} only before {only_a:<6} only after {only_b:<6}"
              f"{'' if only_a or only_b else 'same'}")
    spark.stop()
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
