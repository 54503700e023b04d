"""Phase quality on the frozen fleet: how well the phases recover the behaviours that generated the traces.

    .venv/bin/python bench/phase_quality.py                       # ../shared/data/fleet/fleet-2026, default config
    .venv/bin/python bench/phase_quality.py --set train.k=6 --set train.epochs=100

Ingests the frozen fleet (never regenerated or edited), windows it, trains on the training containers of the
configured split, labels everything, and scores the *held-out* containers only against their ``behaviour``
column: adjusted Rand index, normalised mutual information, and per behaviour its purity (the share of its
steps in its most common phase) and that phase. Prints a table and one ``QUALITY_JSON`` line. A figure, not a
test: the scoring is :func:`ai4dl.method.quality.phase_quality`, tested on hand-made labels.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from types import SimpleNamespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bench_config(work: Path, overrides: list[str]):
    """The frozen-fleet benchmarks' configuration: local[2], tables, models and report under ``work``."""
    from ai4dl.config import load_config

    return load_config(None, [
        "spark.master=local[2]", "spark.shuffle_partitions=4", "spark.driver_memory=6g",
        f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}", f"lake.root={work / 'lake'}", f"lake.models={work / 'models'}",
        f"report.dir={work / 'report'}", *overrides,
    ])


def label_fleet(cfg, spark, source: str, fmt: str):
    """Ingest, window, train and label ``source`` as the pipeline does; the trained stage result and the
    training seconds."""
    from ai4dl import stages

    stages.ingest(cfg, spark, input=source, fmt=fmt)
    stages.window(cfg, spark)
    t0 = time.time()
    trained = stages.train(cfg, spark)
    train_seconds = time.time() - t0
    stages.label(cfg, spark, model=trained.details["path"])
    return trained, train_seconds


FORWARD_PENALTIES = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0)


def _decodings(cfg, held, model, train) -> dict:
    """The held-out containers' phases decoded from the same activations and the model's costs (its phase
    classifier's ``-log p``, or the squared distances to the centres without one): each step's cheapest phase
    (``none``), the causal forward decoder (what a stream can say the moment a sample arrives) at its penalty
    (``forward``: ``label.switch_penalty`` when ``label.smoothing`` is ``forward``, else the default, the
    ``label`` stage's) and at the penalty of :data:`FORWARD_PENALTIES` scoring best on the *training* containers
    (``forward*``), and Viterbi over the whole trace at its penalty (``viterbi``); with a classifier also the
    distances' own decodings (``d2:none``, ``d2:forward``, ``d2:viterbi``: the model without it, Viterbi over the
    distances being what the classifier learnt from, the offline ceiling). Per decoding ARI, and when a phase
    changes against when the true behaviour does (delay p50/p95 in steps, false changes per 1,000 steps)."""
    import numpy as np

    from ai4dl.config import DEFAULT_SWITCH_PENALTY
    from ai4dl.method.labelling import forward_decode, step_costs, switch_cost, viterbi
    from ai4dl.method.quality import change_timing, fleet_change_timing, phase_quality

    gap = model.info.get("switch_gap")
    if model.refinements or gap is None:
        print("decodings: the model is refined or has no switch_gap; only its own labels are scored")
        return {}
    from ai4dl.method.labelling import default_penalty

    def multiplier(decoding: str) -> float:  # the configured penalty applies to the configured decoding
        configured = cfg.label.switch_penalty if cfg.label.smoothing == decoding else None
        return float(default_penalty(model, decoding) if configured is None else configured)

    forward, offline = multiplier("forward"), multiplier("viterbi")
    unit = switch_cost(model, "forward", 1.0)  # the switch gap, or one nat for a classifier's costs
    centers = np.asarray(model.centers, dtype=np.float64)

    def containers(df):
        pdf = df.select("pod_id", "ts", "behaviour", "activations").toPandas().sort_values(["pod_id", "ts"], kind="stable")
        out = []
        for _, part in pdf.groupby("pod_id", sort=True):
            h = np.stack([np.asarray(a, dtype=np.float64) for a in part["activations"]])
            d2, costs = step_costs(centers, model.classifier, h)
            out.append((part["behaviour"].tolist(), {"costs": costs, "d2": d2}))
        return out

    def score(items, decode, on="costs"):
        truth, labels, timing = [], [], []
        for behaviour, c in items:
            path = decode(c[on])
            truth += behaviour
            labels += path.tolist()
            timing.append(change_timing(behaviour, path.tolist()))
        return {"ari": round(phase_quality(truth, labels)["ari"], 4), **fleet_change_timing(timing)}

    trained_on = containers(train)
    by_penalty = {m: score(trained_on, lambda c, m=m: forward_decode(c, m * unit)[0])["ari"] for m in FORWARD_PENALTIES}
    chosen = max(by_penalty, key=lambda m: (by_penalty[m], -m))
    print(f"forward decoder, training containers' ARI by penalty (x {'one nat' if model.classifier is not None else 'switch gap'}): "
          + ", ".join(f"{m:g}: {a:.3f}" for m, a in by_penalty.items()) + f" -> {chosen:g}")
    decoders = {"none": lambda c: np.argmin(c, axis=1), "forward": lambda c: forward_decode(c, forward * unit)[0],
                "forward*": lambda c: forward_decode(c, chosen * unit)[0],
                "viterbi": lambda c: viterbi(c, offline * unit)}
    items = containers(held)
    out = {name: score(items, decode) for name, decode in decoders.items()}
    if model.classifier is not None:
        g = float(gap)  # the model without its classifier, at the distances' own default prices (x switch gap)
        d2_forward, d2_offline = (DEFAULT_SWITCH_PENALTY[d]["distances"] for d in ("forward", "viterbi"))
        out["d2:none"] = score(items, lambda d2: np.argmin(d2, axis=1), "d2")
        out["d2:forward"] = score(items, lambda d2: forward_decode(d2, d2_forward * g)[0], "d2")
        out["d2:viterbi"] = score(items, lambda d2: viterbi(d2, d2_offline * g), "d2")
    out["forward_penalty_chosen_on_training"] = chosen
    nearest, ceiling = ("d2:none", "d2:viterbi") if model.classifier is not None else ("none", "viterbi")
    base = out[nearest]["false_per_1000_steps"]
    print(f"decodings of the held-out activations (penalties x {'one nat' if model.classifier is not None else 'switch gap'}: "
          f"forward {forward:g}, viterbi {offline:g}; {out['none']['true_changes']} true behaviour changes"
          + (f"; d2: the centres' squared distances, forward {d2_forward:g} and viterbi {d2_offline:g} x switch gap"
             if model.classifier is not None else "") + "):")
    print(f"  {'decoding':<10} {'ARI':>6} {'delay p50':>9} {'p95':>5} {'missed':>7} {'false/1000 steps':>17}")
    for name, r in ((n, r) for n, r in out.items() if isinstance(r, dict)):
        print(f"  {name:<10} {r['ari']:6.3f} {r['delay_p50']:9.1f} {r['delay_p95']:5.1f} {r['missed_share']:7.1%} "
              f"{r['false_per_1000_steps']:17.1f}")
    if out[ceiling]["ari"] > out[nearest]["ari"]:
        share = (out["forward"]["ari"] - out[nearest]["ari"]) / (out[ceiling]["ari"] - out[nearest]["ari"])
        out["forward_share_of_viterbi_gain"] = round(share, 3)
        print(f"  forward (the default) closes {share:.0%} of the ARI gap between nearest-phase ({nearest}) and offline "
              f"Viterbi ({ceiling}) decoding (false changes {out['forward']['false_per_1000_steps']:.1f} vs {base:.1f} "
              "per 1,000 steps)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fleet", default=str(ROOT.parent / "shared" / "data" / "fleet" / "fleet-2026"))
    p.add_argument("--workdir", default="/tmp/ai4dl-quality")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--reuse", action="store_true", help="score the lake and model of an earlier run in --workdir")
    p.add_argument("--stability-seed", type=int, help="also train with this train.seed and report how far the two "
                   "models' held-out phases agree up to renaming (adjusted Rand index between them)")
    args = p.parse_args(argv)

    from pyspark.sql import functions as F

    from ai4dl import stages
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake
    from ai4dl.method.labelling import label_windows
    from ai4dl.method.quality import phase_quality
    from ai4dl.method.split import ContainerSplit

    work = Path(args.workdir)
    if not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
    cfg = bench_config(work, args.overrides)
    print(f"[quality] load {os.getloadavg()[0]:.2f} (1 min); fleet {args.fleet}", flush=True)
    spark = get_spark(cfg)
    if args.reuse:  # the lake and model of an earlier run: score again without relabelling
        from ai4dl.method.model import latest_version, load

        path = str(latest_version(cfg.lake.models, cfg.train.model_name))
        trained, train_seconds = SimpleNamespace(details={"path": path, "model": load(path)}), float("nan")
    else:
        trained, train_seconds = label_fleet(cfg, spark, args.fleet, "parquet")
    lake = Lake.for_config(spark, cfg)
    held = ContainerSplit.of(cfg.window).held_out(lake.read("phases")).where("phase IS NOT NULL AND behaviour IS NOT NULL")
    pdf = held.select("behaviour", "phase").toPandas()
    result = phase_quality(pdf["behaviour"].tolist(), pdf["phase"].tolist())
    result.update(train_seconds=round(train_seconds, 1), model=trained.details["path"],
                  held_out_containers=int(held.select("pod_id").distinct().count()), overrides=args.overrides)

    print(f"\nheld-out containers {result['held_out_containers']}, steps {result['steps']}: "
          f"ARI {result['ari']:.3f}, NMI {result['nmi']:.3f}; training {train_seconds:.0f}s")
    from ai4dl.behaviour.naming import phase_name
    from ai4dl.method.split import ContainerSplit

    info = trained.details["model"].info
    result["phase_names"] = info.get("phase_names", {})
    print(f"{'behaviour':<26} {'steps':>8} {'main phase':>10} {'purity':>7}  name of the main phase")
    for name, b in sorted(result["behaviours"].items()):
        print(f"{name:<26} {b['steps']:>8} {b['phase']:>10} {b['purity']:>7.1%}  {phase_name(info, b['phase'])}")
    train_side = ContainerSplit.of(cfg.window).training(lake.read("phases")).where("phase IS NOT NULL AND behaviour IS NOT NULL")
    result["decodings"] = _decodings(cfg, held, trained.details["model"], train_side)
    if args.stability_seed is not None:
        other = stages.train(cfg.replace(train={"seed": args.stability_seed}), spark).details["model"]
        windows = ContainerSplit.of(cfg.window).held_out(lake.read("silver").where("has_full_history"))
        theirs = label_windows(windows, other, engine=cfg.label.engine, decoding=cfg.label.smoothing, switch_penalty=cfg.label.penalty).select("pod_id", "ts", F.col("phase").alias("b"))
        pair = held.select("pod_id", "ts", F.col("phase").alias("a")).join(theirs, ["pod_id", "ts"]).toPandas()
        agreement = phase_quality(pair["a"].tolist(), pair["b"].tolist())["ari"]
        result.update(stability_seed=args.stability_seed, stability_ari=round(agreement, 4))
        print(f"stability: seed {cfg.train.seed} vs seed {args.stability_seed}: held-out phases agree up to renaming "
              f"with ARI {agreement:.3f} ({len(pair)} steps)")
    print("QUALITY_JSON " + json.dumps(result), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
