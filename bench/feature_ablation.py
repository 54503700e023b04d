"""Which window features carry the phases: each feature set trained and scored on the *training* containers.

With the phase classifier (``train.classifier_units`` > 0, the default) the scores leave out the training
containers it learnt its targets from (Viterbi's offline phases, never the behaviours; the rest of the training
containers are scored); set ``--set train.classifier_units=0`` to compare feature sets on the distances alone.

    .venv/bin/python bench/unseen_fleet.py --profile ai4dl --seed 1111 --out /tmp/fleets/ai4dl-1111
    .venv/bin/python bench/feature_ablation.py --fleet /tmp/fleets/ai4dl-1111 --workdir /tmp/fa-1111
    .venv/bin/python bench/feature_ablation.py --fleet /tmp/fleets/ai4dl-3131 --sets default,chosen

Ingests a fleet once, then per feature set (``--sets``: names of :data:`SETS`, or ``name=f1+f2+...``) windows,
trains and labels it as the pipeline does and scores the phases of the split's *training* containers against
their ``behaviour`` (ARI for each step's nearest phase, the causal forward decoder at the default penalty and
Viterbi over the whole trace; the forward decoder's change delay and false changes): features are chosen here,
where nothing held out is seen. The stages' own output (which includes the train stage's held-out score) goes to
``WORKDIR/stages.log``, not to the screen. Then the cost of each derived feature per million rows
(:func:`ai4dl.method.features.derive` alone, one core). Prints a table and one ``ABLATION_JSON`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ai4dl.lake.columns import BEHAVIOUR_FEATURES  # noqa: E402

_WITHOUT = {f"-{f}": tuple(x for x in BEHAVIOUR_FEATURES if x != f) for f in BEHAVIOUR_FEATURES}
SETS: dict[str, tuple[str, ...]] = {
    "default": BEHAVIOUR_FEATURES,
    **_WITHOUT,  # leave one out
    "levels": ("cpu_frac", "mem_frac"),
    **{f"+{f}": (*BEHAVIOUR_FEATURES, f) for f in (
        "cpu_frac_median10", "cpu_frac_max10", "mem_frac_slope10", "mem_frac_range20", "ln_absd_mem_frac_mean5",
        "ln_cpu_frac_std10",
    )},
}


def parse_sets(text: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for item in text.split(","):
        name, _, spec = item.partition("=")
        out[name] = tuple(spec.split("+")) if spec else SETS[name]
    return out


def score_training(cfg, lake, model, penalties: tuple[float, ...] = ()) -> dict:
    """ARI and change timing of the training containers' phases, three decodings of the same activations."""
    import numpy as np

    from pyspark.sql import functions as F

    from ai4dl.method.labelling import forward_decode, step_costs, switch_cost, viterbi
    from ai4dl.method.training import classifier_containers
    from ai4dl.method.quality import change_timing, fleet_change_timing, phase_quality
    from ai4dl.method.split import ContainerSplit

    split = ContainerSplit.of(cfg.window)
    train = split.training(lake.read("phases")).where("phase IS NOT NULL AND behaviour IS NOT NULL")
    seen: list[str] = []
    if model.classifier is not None:  # it learnt these containers' offline phases: score the others
        seen = classifier_containers(split.training(lake.read("silver").where("has_full_history")), cfg.train)[0]
        train = train.where(~F.col("pod_id").isin(seen))
    pdf = train.select("pod_id", "ts", "behaviour", "activations").toPandas().sort_values(["pod_id", "ts"], kind="stable")
    centers = np.asarray(model.centers, dtype=np.float64)
    forward, offline = switch_cost(model, "forward"), switch_cost(model, "viterbi")
    decoders = {"none": lambda costs: np.argmin(costs, axis=1), "forward": lambda costs: forward_decode(costs, forward)[0],
                "viterbi": lambda costs: viterbi(costs, offline)}
    for m in penalties:  # the forward decoder at other penalties (multiples of the model's unit), as label.switch_penalty
        decoders[f"forward@{m:g}"] = lambda costs, c=switch_cost(model, "forward", m): forward_decode(costs, c)[0]
    truth, labels, timing = [], {n: [] for n in decoders}, {n: [] for n in decoders}
    kinds: list[str] = []
    for _, part in pdf.groupby("pod_id", sort=True):
        h = np.stack([np.asarray(a, dtype=np.float64) for a in part["activations"]])
        costs = step_costs(centers, model.classifier, h)[1]  # what the label stage decodes
        behaviour = part["behaviour"].tolist()
        truth += behaviour
        for name, decode in decoders.items():
            path = decode(costs).tolist()
            labels[name] += path
            timing[name].append(change_timing(behaviour, path))
            if name == "forward":
                kinds += transitions(behaviour)
    out = {f"ari_{n}": round(phase_quality(truth, labels[n])["ari"], 4) for n in decoders}
    t = fleet_change_timing(timing["forward"])
    for m in penalties:
        at = fleet_change_timing(timing[f"forward@{m:g}"])
        out[f"forward@{m:g}"] = {"delay_p95": at["delay_p95"], "false_per_1000": round(at["false_per_1000_steps"], 2)}
    out.update(containers=int(pdf["pod_id"].nunique()), classifier_containers=len(seen), delay_p95=t["delay_p95"],
               false_per_1000=t["false_per_1000_steps"], delay_by_change=delay_by_change(timing["forward"], kinds))
    return out


def transitions(behaviour: list) -> list[str]:
    """``from>to`` of each true change of one container, in order (what change_timing's delays follow)."""
    return [f"{a}>{b}" for a, b in zip(behaviour[:-1], behaviour[1:]) if a != b]


def delay_by_change(timing: list[dict], kinds: list[str]) -> dict[str, dict]:
    """Forward-decoded delay p50, p95 and count per kind of true change (missed ones counted apart), largest p95
    first: which changes the features see late."""
    import numpy as np

    delays: dict[str, list[int]] = {}
    missed: dict[str, int] = {}
    per_change = [d for c in timing for d in c["per_change"]]
    for kind, d in zip(kinds, per_change, strict=True):
        if d is None:
            missed[kind] = missed.get(kind, 0) + 1
        else:
            delays.setdefault(kind, []).append(d)
    out = {k: {"n": len(v), "p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
               "missed": missed.get(k, 0)} for k, v in delays.items()}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["p95"]))


def derive_cost(features, rows: int = 1000, containers: int = 200) -> dict[str, float]:
    """Seconds per million rows of each derived feature alone (plus the shares it starts from), one core."""
    import numpy as np
    import pandas as pd

    from ai4dl.method.features import derive, derived_of

    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"cpu_usage_cores": rng.uniform(0, 4, rows), "cpu_num_cores": 4.0,
                        "mem_current": rng.uniform(1e9, 7e9, rows), "mem_limit": 8e9})
    out = {}
    for f in derived_of(features):
        t = time.perf_counter()
        for _ in range(containers):
            derive(pdf, (f,))
        out[f] = round((time.perf_counter() - t) / (rows * containers) * 1e6, 3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fleet", required=True, help="a generated fleet's Parquet folder (bench/unseen_fleet.py)")
    p.add_argument("--workdir", default="/tmp/ai4dl-ablation")
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated names of SETS or name=f1+f2")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--forward-penalties", default="", help="comma-separated: also score the forward decoder at these "
                   "penalties (label.switch_penalty, in units of the model's costs)")
    args = p.parse_args(argv)
    penalties = tuple(float(x) for x in args.forward_penalties.split(",") if x)

    from phase_quality import bench_config

    from ai4dl import stages
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cfg = bench_config(work, args.overrides)
    sets = parse_sets(args.sets)
    print(f"[ablation] load {os.getloadavg()[0]:.2f} (1 min); fleet {args.fleet}; {len(sets)} feature sets", flush=True)
    spark = get_spark(cfg)
    log = open(work / "stages.log", "w")
    with contextlib.redirect_stdout(log):
        stages.ingest(cfg, spark, input=args.fleet, fmt="parquet")
    lake = Lake.for_config(spark, cfg)
    results = []
    print(f"{'set':<28} {'n':>2} {'nearest':>7} {'forward':>7} {'viterbi':>7} {'p95':>5} {'false/1000':>10} {'seconds':>7}")
    for name, features in sets.items():
        c = cfg.replace(window={"features": list(features)})
        t0 = time.time()
        with contextlib.redirect_stdout(log):
            stages.window(c, spark)
            trained = stages.train(c, spark)
            stages.label(c, spark, model=trained.details["path"])
        seconds = time.time() - t0
        r = {"set": name, "features": list(features), "seconds": round(seconds, 1),
             **score_training(c, lake, trained.details["model"], penalties)}
        results.append(r)
        print(f"{name:<28} {len(features):>2} {r['ari_none']:7.3f} {r['ari_forward']:7.3f} {r['ari_viterbi']:7.3f} "
              f"{r['delay_p95']:5.1f} {r['false_per_1000']:10.1f} {seconds:7.0f}", flush=True)
        for m in penalties:
            f = r[f"forward@{m:g}"]
            print(f"{'':<31}forward at penalty {m:g}: ARI {r[f'ari_forward@{m:g}']:.3f}, delay p95 {f['delay_p95']:.1f}, "
                  f"false {f['false_per_1000']:.1f} / 1,000", flush=True)
        late = [f"{k} {v['p95']:.0f} (n {v['n']})" for k, v in r["delay_by_change"].items() if v["p95"] > 5]
        print(f"{'':<31}late changes (p95 > 5 steps): {', '.join(late) or 'none'}", flush=True)
    every = sorted({f for feats in sets.values() for f in feats})
    cost = derive_cost(every)
    print("derive, seconds per million rows (one core): " + ", ".join(f"{f} {s:.2f}" for f, s in cost.items()))
    print("ABLATION_JSON " + json.dumps({"fleet": args.fleet, "results": results, "derive_seconds_per_million": cost,
                                         "training_containers": results[0]["containers"] if results else 0}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
