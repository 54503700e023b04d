"""The stages a job runs, wired to the lake: what ``ai4dl <command>`` and ``jobs/*.py`` call.

Each stage reads its input tables, calls the library, replaces its output tables atomically, and records
what it wrote in the run log. ``run_demo`` chains them on the embedded default: generated traces (or the
DLaaS sample when it is beside the project), local Spark, Delta tables under ``data/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ai4dl import behaviour, lake, phase_stats, policies
from ai4dl.config import config_hash
from ai4dl.model import PhaseModel, latest_version, load
from ai4dl.schema import PHASE_SEQUENCES, POD_ID
from ai4dl.windowing import is_training_container


def resolve_model(cfg: dict[str, Any], explicit: str | None = None) -> tuple[PhaseModel, str]:
    """The model a labelling stage uses: an explicit directory, ``label.model``, or the latest trained version."""
    path = explicit or cfg["label"]["model"] or str(latest_version(cfg["lake"]["models"], cfg["train"]["model_name"]))
    return load(path), path


def run_behaviour(spark: SparkSession, cfg: dict[str, Any], out_dir: str | None = None) -> dict[str, Any]:
    """Phases -> gold sequences, transitions and phase statistics; graphs as GraphML/JSON/PNG."""
    b = cfg["behaviour"]
    phases = lake.read(spark, cfg, "phases")
    seq_path = lake.table_path(cfg, "sequences")
    lake.overwrite(behaviour.run_lengths(phases, int(b["min_run_steps"])), seq_path, PHASE_SEQUENCES, partition_by=("service",))
    sequences = spark.read.format("delta").load(seq_path)
    tr_path = lake.table_path(cfg, "transitions")
    lake.overwrite(behaviour.transition_counts(sequences), tr_path, behaviour.TRANSITIONS)
    stats_path = lake.table_path(cfg, "phase_stats")
    lake.overwrite(phase_stats.phase_statistics(phases, sequences), stats_path, phase_stats.PHASE_STATS)
    views = phase_stats.create_bi_views(spark, stats_path, seq_path, tr_path)

    transitions = spark.read.format("delta").load(tr_path).toPandas()
    dwell = behaviour.dwell_stats(sequences).toPandas()
    graph = behaviour.transition_graph(transitions, dwell)
    # Prototypes: the first prototype_depth runs of each life (whole lives of many runs rarely repeat exactly).
    paths = behaviour.collect_path_counts(sequences, int(b["prototype_depth"]))
    tree = behaviour.prototype_tree(paths)
    top = behaviour.top_prototypes(paths, int(b["top_prototypes"]))
    out = Path(out_dir or cfg["report"]["dir"])
    out.mkdir(parents=True, exist_ok=True)
    behaviour.write_graph(graph, out / "transition_graph")
    behaviour.write_graph(tree, out / "prototype_tree")
    behaviour.draw_graph(graph, out / "transition_graph.png", title="Phase transitions")
    behaviour.draw_graph(tree, out / "prototype_tree.png", title="Prototypical executions")
    print(f"behaviour: {sequences.count()} runs, {len(transitions)} transitions; views {', '.join(views)}")
    for p in top:
        print(f"  prototype {'-'.join(map(str, p.path))}: {p.count} containers ({p.share:.1%})")
    print(f"  top {len(top)} prototypes cover {behaviour.coverage(top):.1%} of the fleet")
    return {"graph": graph, "tree": tree, "prototypes": top, "transitions": transitions, "dwell": dwell}


def policy_phase_stats(spark: SparkSession, cfg: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Per-phase demand statistics from training containers only: the phase rule must not see the test fleet.

    ``policies.phase_statistic``: ``fraction`` (default) allocates the phase's quantile of usage as a share of
    each container's own limit; ``absolute`` its quantile in cores and bytes (the gold phase_stats numbers).
    """
    w, p = cfg["window"], cfg["policies"]
    phases = lake.read(spark, cfg, "phases").where(is_training_container(F.col(POD_ID), w["train_fraction"], w["split_seed"]))
    quantile = float(p["phase_quantile"])
    if p["phase_statistic"] == "fraction":
        return policies.phase_fraction_stats(phases, quantile)
    if p["phase_statistic"] != "absolute":
        raise ValueError(f"policies.phase_statistic must be 'fraction' or 'absolute', got {p['phase_statistic']!r}")
    column = {0.5: "p50", 0.95: "p95", 0.99: "p99"}.get(quantile)
    if column is None:
        raise ValueError(f"policies.phase_quantile must be 0.5, 0.95 or 0.99 with phase_statistic 'absolute', got {quantile}")
    sequences = behaviour.run_lengths(phases)
    stats = phase_stats.phase_statistics(phases, sequences).where(F.col("service") == phase_stats.ALL_SERVICES)
    return policies.phase_stats_for_policy(stats.toPandas(), (f"cpu_{column}", f"mem_{column}"))


def run_policies(spark: SparkSession, cfg: dict[str, Any]) -> pd.DataFrame:
    """Replay the test containers (those not used for training) under every policy; gold table + printed summary."""
    w = cfg["window"]
    params = policies.PolicyParams.from_config(cfg)
    stats = policy_phase_stats(spark, cfg)
    phases = lake.read(spark, cfg, "phases")
    test = phases.where(~is_training_container(F.col(POD_ID), w["train_fraction"], w["split_seed"]))
    if test.limit(1).count() == 0:  # a tiny fleet may have no held-out container: replay all of it
        print("policies: no held-out containers; replaying the whole fleet")
        test = phases
    path = lake.table_path(cfg, "policy_replay")
    lake.overwrite(policies.replay_fleet(test, params, stats), path, policies.POLICY_REPLAY)
    summary = policies.summarise(spark.read.format("delta").load(path)).toPandas()
    print(policies.format_summary(summary))
    return summary


def log(
    spark: SparkSession,
    cfg: dict[str, Any],
    job: str,
    written: dict[str, int],
    versions: dict[str, int | None] | None = None,
) -> None:
    """Record in ``_meta/run_log`` what a job wrote: table, Delta version, rows, and the config's hash."""
    lake.log_run(spark, cfg, job, written, config_hash(cfg), versions)


def table_counts(spark: SparkSession, cfg: dict[str, Any], names: tuple[str, ...]) -> dict[str, int]:
    """Row counts of lake tables (those that exist), for the run log."""
    out = {}
    for name in names:
        path = lake.table_path(cfg, name)
        if lake.exists(spark, path):
            out[name] = spark.read.format("delta").load(path).count()
    return out


def timed(label: str, fn, *args, **kwargs):
    t0 = time.time()
    out = fn(*args, **kwargs)
    print(f"[{label}] {time.time() - t0:.1f}s")
    return out


def save_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def run_report(spark: SparkSession, cfg: dict[str, Any], out_dir: str | None = None) -> Path:
    """One HTML page of a run: a trace by phase, phase distributions, the graphs, the policy savings."""
    from ai4dl import plots
    from ai4dl.report import Section, write_report

    out = Path(out_dir or cfg["report"]["dir"])
    out.mkdir(parents=True, exist_ok=True)
    phases = lake.read(spark, cfg, "phases")
    pod = phases.groupBy(POD_ID).count().orderBy(F.desc("count"), POD_ID).first()[POD_ID]
    one = phases.where(F.col(POD_ID) == pod).drop("activations").toPandas()
    sample = phases.where(F.col("phase").isNotNull()).select("phase", "cpu_usage_cores", "mem_current")
    total = sample.count()
    sample_pdf = sample.sample(fraction=min(1.0, 200_000 / max(total, 1)), seed=1).toPandas()
    params = policies.PolicyParams.from_config(cfg)
    stats = policy_phase_stats(spark, cfg)
    images = {
        "trace": plots.plot_trace_phases(one, out / "trace_phases.png", title=f"Container {pod} by phase"),
        "box": plots.plot_phase_boxplots(sample_pdf, out / "phase_boxplots.png"),
        "curves": plots.plot_policy_curves(one, out / "policy_curves.png", params, phase_stats=stats),
    }
    sections = [Section("A container's life by phase", f"Container {pod}: CPU and memory, coloured by phase.", images=[images["trace"]])]
    sections.append(Section("What each phase uses", "CPU cores and memory per phase, and how common each phase is.", images=[images["box"]]))
    stats_path = lake.table_path(cfg, "phase_stats")
    if lake.exists(spark, stats_path):
        table = spark.read.format("delta").load(stats_path).where(F.col("service") == phase_stats.ALL_SERVICES).orderBy("phase").toPandas()
        graphs = [p for p in (out / "transition_graph.png", out / "prototype_tree.png") if p.exists()]
        sections.append(Section("Phase statistics (fleet)", "From the gold table phase_stats.", table=table.round(3), images=graphs))
    replay_path = lake.table_path(cfg, "policy_replay")
    meta: dict[str, Any] = {"lake": cfg["lake"]["root"], "labelled steps": total}
    if lake.exists(spark, replay_path):
        summary = policies.summarise(spark.read.format("delta").load(replay_path)).toPandas()
        savings = plots.plot_savings(summary, out / "savings.png")
        sections.append(Section("Policies", "Allocated vs used over the test containers.", table=summary.round(4), images=[savings, images["curves"]]))
    train_report = out / "train_report.json"
    if train_report.exists():
        meta.update({k: v for k, v in json.loads(train_report.read_text()).items() if not isinstance(v, (list, dict))})
    return write_report(out, title="ai4dl run report", metadata=meta, sections=sections)
