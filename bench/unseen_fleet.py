"""Write a generated fleet that nobody tuned on, as Parquet without Spark: the goals of the policy and phase
benchmarks are checked again on fleets of other seeds (never frozen, never looked at before the check).

    .venv/bin/python bench/unseen_fleet.py --profile ai4dl --seed 4242 --out /tmp/fleets/ai4dl-4242
    .venv/bin/python bench/unseen_fleet.py --profile training-loop --seed 5151 --out /tmp/fleets/loop-5151
    .venv/bin/python bench/policy_savings.py --input /tmp/fleets/loop-5151 --workdir /tmp/ps-loop-5151

The defaults have the frozen fleets' shapes: ``ai4dl`` as ``fleet-2026`` (300 containers x 600 steps, 4
services), ``training-loop`` as ``tests/data/fleet-training-loop`` (160 x 600, 8 job templates); 30 s apart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHAPES = {"ai4dl": (300, 600, 4), "training-loop": (160, 600, 8)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="ai4dl", choices=tuple(SHAPES))
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--containers", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--services", type=int)
    args = p.parse_args(argv)
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ai4dl.traces.synthetic import generate_container
    from freeze_training_loop import arrow_schema

    containers, steps, services = SHAPES[args.profile]
    containers, steps, services = args.containers or containers, args.steps or steps, args.services or services
    df = pd.concat([generate_container(i, steps, args.seed, services, 1_700_000_000, 30, profile=args.profile)
                    for i in range(containers)], ignore_index=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(df, schema=arrow_schema(), preserve_index=False).replace_schema_metadata(None)
    pq.write_table(table, out / "part-00000.parquet", compression="snappy")
    print(f"{out}: {args.profile}, seed {args.seed}, {containers} containers x {steps} steps, {services} services")
    return 0


if __name__ == "__main__":
    sys.exit(main())
