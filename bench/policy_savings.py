"""Policy savings at a matched service level on the frozen fleet (issue 10's goal), and on the DLaaS sample.

    .venv/bin/python bench/policy_savings.py                                   # ../shared/data/fleet/fleet-2026
    .venv/bin/python bench/policy_savings.py --input ../shared/data/reference/dlaas_sample.csv --format csv
    .venv/bin/python bench/policy_savings.py --reuse                           # policies only, on the kept lake

Ingests the input (never regenerated or edited), windows it, trains on the training containers of the
configured split, labels, builds the behaviour tables and runs the ``policies`` stage: each policy's knob is
chosen on the *training* containers for ``policies.target_fulfilment`` and scored on the *held-out* ones. Then
prints, per resource, the best phase policy against ``prev.step.rules`` and ``vpa`` (the goal: >= 25 % and
>= 10 % less allocated, at most a fifth of the reactive rule's OOM kills), the clairvoyant
``current.step.max`` (every step of every interval met: a reference point, not a bound at 95 %), and an
ablation: ``phase.headroom`` with every phase merged into one (the same policy without
phases), so what the phases add is a number. One ``POLICY_JSON`` line at the end. A figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from phase_quality import bench_config, label_fleet  # noqa: E402  (the frozen-fleet benchmarks' shared set-up)

PHASE_POLICIES = ("phase.rule", "phase.proactive", "phase.headroom")


def _goal_lines(table, resource: str) -> dict:
    rows = table[(table["resource"] == resource)].set_index("policy")
    phase = rows.loc[[p for p in PHASE_POLICIES if p in rows.index]]
    reached = phase[phase["reached"]]
    best = (reached if len(reached) else phase).sort_values("allocated").iloc[0]
    rules, vpa = rows.loc["prev.step.rules"], rows.loc["vpa"]
    out = {
        "best_phase_policy": best.name, "knob": None if best["knob"] is None or math.isnan(best["knob"]) else float(best["knob"]),
        "fulfilment": float(best["fulfilment"]), "savings_vs_static": float(best["savings_vs_static"]),
        "less_than_prev_rules": float(1.0 - best["allocated"] / rules["allocated"]),
        "less_than_vpa": float(1.0 - best["allocated"] / vpa["allocated"]),
        "prev_rules_savings_vs_static": float(rules["savings_vs_static"]),
        "vpa_savings_vs_static": float(vpa["savings_vs_static"]),
        "prev_rules_fulfilment": float(rules["fulfilment"]), "vpa_fulfilment": float(vpa["fulfilment"]),
    }
    if resource == "mem":
        out.update(oom_kills_per_100h=float(best["oom_kills_per_100h"]),
                   prev_rules_oom_kills_per_100h=float(rules["oom_kills_per_100h"]),
                   vpa_oom_kills_per_100h=float(vpa["oom_kills_per_100h"]))
    return out


def _without_phases(cfg, lake, model) -> dict:
    """phase.headroom calibrated and scored as the stage does, with every labelled step in one phase."""
    from pyspark.sql import functions as F

    from ai4dl.method.split import ContainerSplit
    from ai4dl.policies.calibration import calibrate
    from ai4dl.policies.fleet import frontier_totals, phase_headroom_stats, replay_fleet_grid

    params = model.params
    one = lake.read("phases").withColumn("phase", F.when(F.col("phase").isNotNull(), F.lit(0)))
    split = ContainerSplit.of(cfg.window)
    train, held = split.training(one), split.held_out(one)
    stats = phase_headroom_stats(train, params)
    totals = [frontier_totals(replay_fleet_grid(part, params, stats, policies=["phase.headroom"])) for part in (train, held)]
    table = calibrate(totals[0], totals[1], model.level)
    rows = table[table["policy"] == "phase.headroom"].set_index("resource")
    return {r: {"savings_vs_static": float(rows.loc[r, "savings_vs_static"]), "fulfilment": float(rows.loc[r, "fulfilment"]),
                "knob": float(rows.loc[r, "knob"])} for r in rows.index}


def _rung_totals(cfg, phases, log_name: str):
    """A rung's (training, held-out) calibration totals: the policy model fitted on ``phases``' training
    containers, as the stage fits it, and replayed on its held-out ones."""
    from ai4dl.method.split import ContainerSplit
    from ai4dl.policies.calibration import ServiceLevel
    from ai4dl.policies.fleet import frontier_totals, replay_fleet_grid
    from ai4dl.policies.model import PolicyEstimator

    t0 = time.time()
    split = ContainerSplit.of(cfg.window)
    estimator = PolicyEstimator(cfg.policies, split, cfg.behaviour.min_run_steps)
    lenient = ServiceLevel(0.0, mem_fulfilment=0.0)  # every level is chosen afterwards, from the totals
    model, train = estimator.fit_with_totals(split.training(phases), level=lenient, log=None)
    held = frontier_totals(replay_fleet_grid(split.held_out(phases), cfg.policies, model.phase_stats, model.transitions,
                                             forecasters=model.forecasters))
    print(f"[ladder] rung {log_name}: fitted and replayed in {time.time() - t0:.0f}s", flush=True)
    return train, held


def _next_phase_ceiling(cfg, phases, learned_f1) -> dict:
    """Next-phase F1 on held-out run ends, by the rule the learned phases are scored with (each service's counts
    beside the fleet's transitions, ai4dl.policies.nextphase), from the true behaviours (the ceiling any phase
    model could reach on this fleet) beside the learned phases'."""
    from ai4dl.behaviour.sequences import run_lengths, service_transition_counts
    from ai4dl.method.split import ContainerSplit
    from ai4dl.policies.ladder import rung_phases
    from ai4dl.policies.nextphase import fleet_next_phase_f1, fleet_transitions, normalise_service_transitions

    split = ContainerSplit.of(cfg.window)
    runs = run_lengths(rung_phases(phases, "c", cfg.policies.interval_steps), cfg.behaviour.min_run_steps).cache()
    try:
        by_service = service_transition_counts(split.training(runs)).toPandas()
        true = fleet_next_phase_f1(split.held_out(runs).select("pod_id", "service", "run", "phase").toPandas(),
                                   fleet_transitions(by_service), normalise_service_transitions(by_service))
    finally:
        runs.unpersist()
    return {"true_behaviour_f1": true.get("f1"), "learned_f1": (learned_f1 or {}).get("f1"),
            "gap": None if true.get("f1") is None or not learned_f1 else true["f1"] - learned_f1["f1"]}


def _ladder(cfg, lake, model, report, work: Path, learned):
    """The value-of-information ladder (ai4dl.policies.ladder), printed and drawn; ``learned``: the policies
    stage's (training, held-out) totals, rungs a and b."""
    from ai4dl.policies.ladder import default_levels, ladder, phase_worth, rung_phases, verdict
    from ai4dl.reporting.plots import plot_ladder

    phases = lake.read("phases")
    truth = "behaviour" in phases.columns and phases.where("behaviour IS NOT NULL").limit(1).count() > 0
    totals = {"a": learned, "b": learned}
    for rung in (("c", "d") if truth else ("d'",)):
        totals[rung] = _rung_totals(cfg, rung_phases(phases, rung, cfg.policies.interval_steps), rung)
    table = ladder(totals, default_levels(model.params.oom_budget_per_100h))
    worth = phase_worth(table)
    print("\nWhat knowing the phase is worth (held-out containers; gap closed = (S - S_baseline) / "
          "(S_clairvoyant - S_baseline)):")
    for (resource, level), part in table.groupby(["resource", "level"], sort=False):
        print(f"  {resource} at {level}:")
        for r in part.itertuples(index=False):
            extra = f", {r.oom_kills_per_100h:.1f} OOM kills/100 h" if resource == "mem" and r.oom_kills_per_100h == r.oom_kills_per_100h else ""
            flag = "" if r.reached or r.rung in ("clairvoyant", "baseline") else "  (level not reached in training)"
            print(f"    {r.rung:<11} {r.policy:<17} saves {r.savings:6.1%}  gap closed {r.gap_closed:6.1%}  "
                  f"({r.fulfilment:.1%} met{extra}) {r.knows}{flag}")
    ceiling = _next_phase_ceiling(cfg, phases, report.get("next_phase")) if truth else {}
    if ceiling:
        print(f"  next-phase F1 on held-out run ends: learned phases {ceiling['learned_f1']:.3f}, true behaviours "
              f"(the ceiling) {ceiling['true_behaviour_f1']:.3f}")
    for line in verdict(worth):
        print("  " + line)
    table.to_csv(work / "ladder.csv", index=False)
    plot = plot_ladder(table, work / "ladder.png", title=f"What knowing the phase is worth: {Path(report['input']).name}")
    print(f"ladder plot: {plot}")
    json_rows = {}
    for resource, part in table.groupby("resource", sort=False):
        per_level = {}
        for level, rows in part.groupby("level", sort=False):
            by = rows.set_index("rung")
            best = by.loc["best"] if "best" in by.index else None
            per_level[level] = {
                "best_policy": None if best is None else best["policy"],
                "gap_closed": None if best is None else float(best["gap_closed"]),
                "rungs": {k: {"policy": v["policy"], "savings": float(v["savings"]), "gap_closed": float(v["gap_closed"]),
                              "reached": bool(v["reached"])} for k, v in by.iterrows()},
            }
        json_rows[resource] = per_level
    return json_rows, worth.to_dict(orient="records"), ceiling


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", default=str(ROOT.parent / "shared" / "data" / "fleet" / "fleet-2026"))
    p.add_argument("--format", default="parquet", choices=("parquet", "csv"))
    p.add_argument("--workdir", default="/tmp/ai4dl-policies")
    p.add_argument("--reuse", action="store_true", help="keep the lake of an earlier run and rerun behaviour + policies only")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    from ai4dl import stages
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake

    work = Path(args.workdir)
    if not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
    cfg = bench_config(work, args.overrides)
    print(f"[policies] load {os.getloadavg()[0]:.2f} (1 min); input {args.input}", flush=True)
    spark = get_spark(cfg)
    t0 = time.time()
    if not args.reuse:
        label_fleet(cfg, spark, args.input, args.format)
    stages.behaviour(cfg, spark)
    result = stages.policies(cfg, spark)
    table = result.details["calibration"]
    model = result.details["model"]
    lake = Lake.for_config(spark, cfg)
    level = model.level
    report = {"input": args.input, "overrides": args.overrides, "target": {r: level.describe(r) for r in ("cpu", "mem")},
              "held_out_containers": int(table["containers"].max()), "next_phase": result.details["next_phase"]}
    print(f"\nGoal at cpu {level.describe('cpu')}, mem {level.describe('mem')}, on {report['held_out_containers']} held-out containers:")
    for resource in ("cpu", "mem"):
        g = _goal_lines(table, resource)
        report[resource] = g
        oom = (f"; OOM kills per 100 container-hours {g['oom_kills_per_100h']:.1f} vs prev.step.rules "
               f"{g['prev_rules_oom_kills_per_100h']:.1f}, vpa {g['vpa_oom_kills_per_100h']:.1f}") if resource == "mem" else ""
        print(f"  {resource}: best phase policy {g['best_phase_policy']} ({g['fulfilment']:.1%} met) saves "
              f"{g['savings_vs_static']:.1%} vs static; {g['less_than_prev_rules']:+.1%} less than prev.step.rules "
              f"(goal 25 %; it saves {g['prev_rules_savings_vs_static']:.1%}), {g['less_than_vpa']:+.1%} less than vpa "
              f"(goal 10 %; it saves {g['vpa_savings_vs_static']:.1%}){oom}")
    oracle = table[table["policy"] == "current.step.max"].set_index("resource")
    report["oracle_current_step_max"] = {r: float(oracle.loc[r, "savings_vs_static"]) for r in oracle.index}
    print("  clairvoyant current.step.max (every step met): saves " +
          ", ".join(f"{r} {v:.1%}" for r, v in report["oracle_current_step_max"].items()))
    ablation = _without_phases(cfg, lake, model)
    report["phase_headroom_without_phases"] = ablation
    print("  phase.headroom with all phases merged (no phases): saves " +
          ", ".join(f"{r} {v['savings_vs_static']:.1%} ({v['fulfilment']:.1%} met)" for r, v in ablation.items()))
    learned = (result.details["train_totals"], result.details["frontier"])  # rungs a and b: the stage's own fit
    report["ladder"], report["phase_worth"], report["next_phase_ceiling"] = _ladder(cfg, lake, model, report, work, learned)
    from ai4dl.reporting.plots import plot_frontier

    targets = {r: (None if math.isnan(level.fulfilment(r)) else level.fulfilment(r)) for r in ("cpu", "mem")}
    plot = plot_frontier(result.details["frontier"], table, work / "frontier.png", targets)
    report["seconds"] = round(time.time() - t0, 1)
    print(f"frontier plot: {plot}; {report['seconds']}s")
    print("POLICY_JSON " + json.dumps(report), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
