"""Freeze one fleet of the ``training-loop`` profile as Parquet, without Spark (a positive control fleet).

    .venv/bin/python bench/freeze_training_loop.py            # writes tests/data/fleet-training-loop/ once
    .venv/bin/python bench/freeze_training_loop.py --check    # regenerates in memory, compares with the frozen file

The fleet is ``pandas.concat`` of :func:`ai4dl.traces.synthetic.generate_container` over the container ids, in
id order: the rows ``generate_fleet(..., profile="training-loop")`` gives for the same arguments. It is written
as one snappy Parquet file with the generator's schema (``GENERATED_SOURCE``: the export's dotted names, not
null), the schema of the frozen ``fleet-2026``, plus a ``_README.md`` saying how (Spark skips files starting with ``_``). Once written it is never rewritten:
the script refuses an existing file (``--check`` only reads it).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEED, CONTAINERS, STEPS, SERVICES, INTERVAL, START, PROFILE = 2027, 160, 600, 8, 30, 1_700_000_000, "training-loop"
OUT = ROOT / "tests" / "data" / "fleet-training-loop"
FLEET_2026 = ROOT.parent / "shared" / "data" / "fleet" / "fleet-2026"


def fleet():
    import pandas as pd

    from ai4dl.traces.synthetic import generate_container

    return pd.concat([generate_container(i, STEPS, SEED, SERVICES, START, INTERVAL, profile=PROFILE)
                      for i in range(CONTAINERS)], ignore_index=True)


def arrow_schema():
    """``GENERATED_SOURCE`` as Arrow: bigint -> int64, string -> string, double -> float64, nullability kept."""
    import pyarrow as pa

    from ai4dl.lake.schema import GENERATED_SOURCE

    types = {"bigint": pa.int64(), "string": pa.string(), "double": pa.float64()}
    return pa.schema([pa.field(f.name, types[f.dataType.simpleString()], f.nullable) for f in GENERATED_SOURCE.fields])


def plain(schema):
    """Names, types and nullability only (no Spark or pandas metadata)."""
    return [(f.name, str(f.type), f.nullable) for f in schema]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--check", action="store_true", help="compare a fresh generation with the frozen file")
    args = p.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(args.out)
    part = out / "part-00000.parquet"
    df = fleet()
    if args.check:
        frozen = pq.read_table(part).to_pandas()
        same = frozen.equals(df)
        print(f"{part}: {len(frozen)} rows, {'identical to' if same else 'DIFFERENT from'} a fresh generation")
        return 0 if same else 1
    if part.exists():
        print(f"{part} exists: a frozen fleet is never regenerated (use --out elsewhere, or --check)")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(df, schema=arrow_schema(), preserve_index=False).replace_schema_metadata(None)
    pq.write_table(table, part, compression="snappy")

    back = pq.read_table(part)
    assert back.num_rows == len(df) and plain(back.schema) == plain(arrow_schema())
    if FLEET_2026.is_dir():
        ref = pq.read_schema(min(FLEET_2026.glob("*.parquet")))
        assert plain(back.schema) == plain(ref), (plain(back.schema), plain(ref))
        print(f"schema: same names, types and nullability as {FLEET_2026}")
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--", "ai4dl/traces")
    sources = {name: hashlib.sha256((ROOT / "ai4dl" / "traces" / name).read_bytes()).hexdigest()
               for name in ("synthetic.py", "training_loop.py")}
    counts = df["behaviour"].value_counts()
    size = part.stat().st_size
    digest = hashlib.sha256(part.read_bytes()).hexdigest()
    note = (" The profile's code was not committed yet when this was frozen (the working tree on top of that "
            "commit); the source digests below identify it." if dirty else "")
    # "_": Spark skips the README when it reads the folder as Parquet
    (out / "_README.md").write_text(f"""# A frozen training-loop fleet

`part-00000.parquet`: {CONTAINERS} generated containers x {STEPS} steps = {len(df):,} rows ({size:,} bytes, snappy),
the generator's export schema (`GENERATED_SOURCE`, dotted names, the same columns and types as `fleet-2026`)
with the ground-truth `behaviour` column: {", ".join(f"{b} {n:,}" for b, n in counts.items())}.

Generated without Spark by

```bash
.venv/bin/python bench/freeze_training_loop.py
```

i.e. `pandas.concat(generate_container(i, steps={STEPS}, seed={SEED}, n_services={SERVICES}, start={START},
interval_seconds={INTERVAL}, profile="{PROFILE}") for i in range({CONTAINERS}))`, the rows of
`ai4dl generate --containers {CONTAINERS} --steps {STEPS} --seed {SEED} --set generate.services={SERVICES}
--set generate.interval_seconds={INTERVAL} --profile {PROFILE}`: seed {SEED}, {CONTAINERS} containers,
{STEPS} steps, {SERVICES} services (job templates), interval {INTERVAL} s, start {START}, profile `{PROFILE}`.

Generator: commit `{commit}`.{note}

- `ai4dl/traces/synthetic.py` sha256 `{sources["synthetic.py"]}`
- `ai4dl/traces/training_loop.py` sha256 `{sources["training_loop.py"]}`
- `part-00000.parquet` sha256 `{digest}`

`bench/freeze_training_loop.py --check` regenerates it in memory and compares.

It is frozen on purpose, a positive control for phase-aware policies (its phases do predict what comes next):
never regenerate or edit it; score only held-out containers.
""")
    print(f"{part}: {len(df)} rows, {size / 1e6:.2f} MB, sha256 {digest[:16]}...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
