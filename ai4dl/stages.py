"""The stage layer: every verb of ai4dl is one function here, and nothing else wires the lake to the library.

A stage reads its input tables through the :class:`~ai4dl.lake.tables.Lake` handle, calls the library
(``ai4dl.method``, ``ai4dl.behaviour``, ``ai4dl.policies``, ``ai4dl.reporting``, ``ai4dl.traces``), replaces
its output tables atomically (one Delta commit each, properties included), records what it wrote in
``_meta/run_log`` and returns a :class:`StageResult`. Each table is one function of its inputs, as in a
declarative pipeline: rerunning a stage on the same inputs rewrites the same rows.

The CLI (``ai4dl <verb>``) is a table from verb to stage, ``jobs/*.py`` call :func:`run`, and the notebook and
``bench/`` call the stages directly::

    cfg = load_config("conf/local.yaml")
    spark = get_spark(cfg)
    ingest(cfg, spark)
    window(cfg, spark)
    train(cfg, spark)
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ai4dl.config import Config
from ai4dl.errors import ConfigError

STAGES: dict[str, Callable[..., "StageResult"]] = {}


@dataclass(frozen=True)
class StageResult:
    """What a stage did: the tables (or model directories) it wrote with their row counts, and its run id;
    the rows it read and quarantined where it knows them, and where each output is."""

    stage: str
    written: Mapping[str, int | None]
    run_id: str
    seconds: float
    details: Mapping[str, Any] = field(default_factory=dict)
    rows_in: int | None = None
    quarantined: int | None = None
    locations: Mapping[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """The one line every stage ends with: rows in and out, quarantined, time, where the output is.

        >>> StageResult("ingest", {"bronze": 204, "quarantine": 3}, "r1", 2.04, rows_in=207, quarantined=3,
        ...             locations={"bronze": "lake/bronze/traces", "quarantine": "lake/bronze/quarantine"}).summary()
        'ingest: 207 rows in, 204 out, 3 quarantined, 2.0s -> lake/bronze/traces (+ quarantine) [run r1]'
        >>> StageResult("report", {"out/index.html": None}, "r2", 0.5).summary()
        'report: 0.5s -> out/index.html [run r2]'
        """
        parts = []
        if self.rows_in is not None:
            parts.append(f"{self.rows_in} rows in")
        main = next(iter(self.written), None)
        if main is not None and self.written[main] is not None:
            parts.append(f"{self.written[main]} out")
        if self.quarantined is not None:
            parts.append(f"{self.quarantined} quarantined")
        parts.append(f"{self.seconds:.1f}s")
        where = "nothing written" if main is None else self.locations.get(main, main)
        others = [k for k in self.written if k != main]
        if others:
            where += f" (+ {', '.join(others)})"
        return f"{self.stage}: {', '.join(parts)} -> {where} [run {self.run_id}]"

    def __str__(self) -> str:
        return self.summary()


@dataclass
class _Output:
    """What a stage function returns: ``written`` (its main output first), Delta versions, details for
    callers, and for the summary line the rows it read and quarantined where it knows them."""

    written: dict[str, int | None]
    versions: dict[str, int | None] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    rows_in: int | None = None
    quarantined: int | None = None


# The folders a stage writes besides the lake (whose run log every stage writes).
_FOLDERS = {"models": ("lake.models", lambda cfg: cfg.lake.models), "report": ("report.dir", lambda cfg: cfg.report.dir)}


def stage(name: str, writes: tuple[str, ...] = ()) -> Callable[[Callable[..., _Output]], Callable[..., StageResult]]:
    """Register ``fn(cfg, lake, **options) -> _Output`` as the stage ``name``.

    Around it: the session and the lake handle; the lake root and the folders in ``writes`` (``models``,
    ``report``) checked writable before anything is written; a "started" run-log row before the first commit;
    every Delta commit tagged with the run id; then "finished" rows with what was written, or a "failed" row
    with the error (a killed run keeps only its "started" row).
    """

    def register(fn: Callable[..., _Output]) -> Callable[..., StageResult]:
        @functools.wraps(fn)
        def run_stage(cfg: Config, spark: Any = None, **options: Any) -> StageResult:
            from ai4dl.lake import tables

            if not isinstance(cfg, Config):
                raise TypeError(f"stage {name}: expected an ai4dl.config.Config, got {type(cfg).__name__}")
            tables.check_writable("lake.root", cfg.lake.root)
            for folder in writes:
                key, value = _FOLDERS[folder]
                tables.check_writable(key, value(cfg))
            from ai4dl.lake.session import get_spark

            spark = spark if spark is not None else get_spark(cfg)
            lake = tables.Lake.for_config(spark, cfg)
            run_id, started = tables.new_run_id(), tables.utc_now()
            t0 = time.time()
            tables.log_started(lake, run_id, name, cfg.digest, started)
            try:
                with tables.commits_tagged(spark, run_id):
                    out = fn(cfg, lake, **options)
            except BaseException as exc:
                if isinstance(exc, Exception):
                    tables.log_failed(lake, run_id, name, cfg.digest, started, f"{type(exc).__name__}: {exc}".splitlines()[0])
                raise
            lake.log_run(name, out.written, cfg.digest, out.versions, run_id, started)
            locations = {k: lake.path(k) for k in out.written if k in tables.TABLES}
            result = StageResult(name, dict(out.written), run_id, round(time.time() - t0, 3), out.details,
                                 out.rows_in, out.quarantined, locations)
            print(result.summary())
            return result

        STAGES[name] = run_stage
        return run_stage

    return register


def run(verb: str, cfg: Config, spark: Any = None, **options: Any) -> StageResult:
    """Run one stage by its verb (``jobs/*.py`` and the CLI call this)."""
    if verb not in STAGES:
        raise ConfigError(f"unknown stage '{verb}' (known: {', '.join(STAGES)})")
    return STAGES[verb](cfg, spark, **options)


def run_many(verbs: Sequence[str], cfg: Config, spark: Any = None,
             options: Mapping[str, Mapping[str, Any]] | None = None) -> list[StageResult]:
    """Run stages in order in one Spark session: the JVM, Delta's classes and the first table reads are paid
    once, not once per command. ``generate`` followed by ``ingest`` ingests what was generated. Each stage still logs its own run and commits on its own; the first failure
    stops the chain (the stages before it stay committed, as if run one by one)."""
    unknown = [v for v in verbs if v not in STAGES]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)} (known: {', '.join(STAGES)})")
    from ai4dl.lake.session import get_spark

    spark = spark if spark is not None else get_spark(cfg)
    results = []
    t0 = time.time()
    generated = None
    for verb in verbs:
        given = {k: v for k, v in (options or {}).get(verb, {}).items() if v is not None}
        if verb == "ingest" and generated and "input" not in given:
            given.update(input=generated, fmt="csv")  # what this chain just generated, as the demo does
        results.append(run(verb, cfg, spark, **given))
        if verb == "generate":
            generated = results[-1].details["path"]
    print(f"run: {' -> '.join(verbs)} in {time.time() - t0:.1f}s")
    return results


# --------------------------------------------------------------------------------------------------- traces


@stage("generate")
def generate(cfg: Config, lake: Any, out: str | None = None, fmt: str = "csv") -> _Output:
    """A synthetic fleet of container traces, written as an export would be (``generate`` section)."""
    from ai4dl.traces.synthetic import generate_fleet, write_fleet

    g = cfg.generate
    out = out or default_generated_path(cfg)
    df = generate_fleet(lake.spark, g.containers, g.steps, g.seed, g.services, g.start, g.interval_seconds, g.partitions)
    write_fleet(df, out, fmt)
    rows = g.containers * g.steps
    print(f"generate: {g.containers} containers x {g.steps} steps = {rows} rows ({fmt}) -> {out}")
    return _Output({out: rows}, details={"path": out})


def default_generated_path(cfg: Config) -> str:
    """Where the demo writes its generated traces: ``raw/generated`` beside the lake root."""
    from ai4dl.lake.tables import is_uri, join_path

    root = cfg.lake.root.rstrip("/")
    parent = root.rsplit("/", 1)[0] if is_uri(root) else str(Path(root).absolute().parent)
    return join_path(parent, "raw", "generated")


@stage("ingest")
def ingest(cfg: Config, lake: Any, input: str | None = None, fmt: str | None = None) -> _Output:
    """Traces (file, folder or glob, or a Prometheus server's range) -> bronze; bad rows -> quarantine with a
    reason. Reruns change nothing."""
    from ai4dl.traces.ingest import ingest as ingest_traces

    if (fmt or cfg.ingest.format) == "prometheus":
        from ai4dl.traces.prometheus import ingest_prometheus

        result = ingest_prometheus(lake, cfg.ingest, cfg.prometheus, input or cfg.ingest.input)
    else:
        result = ingest_traces(lake, cfg.ingest, input, fmt)
    print(f"ingest: {result.summary()}")
    return _Output(
        {"bronze": result.inserted, "quarantine": result.quarantined},
        {"bronze": result.bronze_version, "quarantine": result.quarantine_version},
        {"result": result},
        rows_in=result.read,
        quarantined=result.quarantined,
    )


# --------------------------------------------------------------------------------------------------- method


@stage("window")
def window(cfg: Config, lake: Any, scaler_from_model: str | None = None) -> _Output:
    """Bronze -> silver windows, scaled with statistics fitted on the training containers (or a model's)."""
    from ai4dl.method.features import with_derived
    from ai4dl.method.model import load
    from ai4dl.method.scaler import Scaler
    from ai4dl.method.windowing import build_windows, silver_properties, window_inputs

    w = cfg.window
    source = scaler_from_model or w.scaler_from_model
    given = load(source).scaler if source else None
    raw = window_inputs(lake.read("bronze"))
    bronze = with_derived(raw, given.features if given else w.features, w.max_gap_seconds)
    if bronze is not raw:
        bronze = bronze.cache()  # the derived features are computed once for the scaler's fit and the windows
    scaler = given or Scaler.fit(w.split.training(bronze), w.features)
    silver = build_windows(bronze, scaler, w.n_history, w.max_gap_seconds)
    written = lake.overwrite("silver", silver, properties=silver_properties(scaler, w.n_history))
    if bronze is not raw:
        bronze.unpersist()
    counts = {r["has_full_history"]: r["count"] for r in lake.read("silver").groupBy("has_full_history").count().collect()}
    total = sum(counts.values())
    print(f"silver: {total} windows ({counts.get(True, 0)} with full history, {counts.get(False, 0)} without)")
    return _Output({"silver": total}, {"silver": written.version}, rows_in=lake.count("bronze"))


def labelling_phase_names(cfg: Config, lake: Any) -> dict[int, str]:
    """The phase names of the model that labelled the phases table (found by its ``model_id`` under
    ``lake.models``); empty when it has none or is not there (then phases are "phase k")."""
    from ai4dl.behaviour.naming import names_of
    from ai4dl.method.model import info_of

    model_id = lake.properties("phases").get("ai4dl.model_id") if lake.exists("phases") else None
    return names_of(info_of(cfg.lake.models, model_id) if model_id else None)


def _silver(lake: Any) -> tuple[Any, Any, int]:
    from ai4dl.method.windowing import silver_scaler

    silver = lake.read("silver")
    scaler, n_history = silver_scaler(lake.properties("silver"), lake.path("silver"))
    return silver, scaler, n_history


def resolve_model(cfg: Config, explicit: str | None = None) -> tuple[Any, str]:
    """The model a stage uses: an explicit directory, ``label.model``, or the latest trained version."""
    from ai4dl.method.model import latest_version, load

    path = explicit or cfg.label.model or str(latest_version(cfg.lake.models, cfg.train.model_name))
    return load(path), str(path)


@stage("train", writes=("models", "report"))
def train(cfg: Config, lake: Any) -> _Output:
    """Silver -> a new model version (CRBM + k-means) under ``lake.models``, scored on held-out containers."""
    from ai4dl.method.model import save_version
    from ai4dl.method.training import PhaseEstimator, score
    from ai4dl.reporting.plots import plot_training

    if cfg.mlflow.enabled:  # before training: a missing MLflow is one line now, not after the CRBM
        from ai4dl.tracking import require_mlflow, tracking_uri

        require_mlflow()
        tracking_uri(cfg)
    silver, scaler, n_history = _silver(lake)
    estimator = PhaseEstimator(cfg.train, cfg.window.split)
    model = estimator.fit(silver, scaler, n_history)
    model = model.with_info(training_data={**model.info["training_data"], "silver": lake.path("silver")})
    held_out = cfg.window.split.held_out(silver.where("has_full_history"))
    quality = score(model, held_out, cfg.label.engine, cfg.label.penalty)
    path = str(save_version(model, cfg.lake.models, cfg.train.model_name))
    print(f"train: model {model.model_id}")
    if "holdout_ari" in quality:
        print(f"train: adjusted Rand index vs ground truth on held-out containers: {quality['holdout_ari']:.3f} ({quality['holdout_steps']} steps)")
    crbm = model.info["crbm"]
    report = {
        "model": path, "crbm_windows": model.info["training_data"]["sampled_windows"], "crbm_epochs": crbm["epochs_run"],
        "crbm_error": crbm["reconstruction_error"], "crbm_seconds": crbm["seconds"], **quality,
    }
    if "k_report" in model.info:
        report["k_report"] = model.info["k_report"]
    report_json = Path(cfg.report.dir) / "train_report.json"
    _save_json(report_json, report)
    curve = plot_training(crbm["epoch_errors"], model.info.get("k_report"), Path(cfg.report.dir) / "train_curve.png")
    details: dict[str, Any] = {"model": model, "path": path, "report": report}
    if cfg.mlflow.enabled:
        from ai4dl.tracking import log_training

        logged = log_training(cfg, model, path, report, [report_json, curve])
        print(f"train: logged to MLflow run {logged['run_id']} ({logged['tracking_uri']}), model {logged['model_uri']}")
        details["mlflow"] = logged
    # A model version is a directory, not a Delta table: logged by path, rows = the CRBM's sampled windows.
    return _Output({path: report["crbm_windows"]}, details=details, rows_in=lake.count("silver"))


@stage("refine", writes=("models",))
def refine(cfg: Config, lake: Any, phase: int, k: int = 2, model: str | None = None) -> _Output:
    """Split one phase of a model into ``k`` sub-phases; saves a new model version."""
    from ai4dl.method.model import save_version
    from ai4dl.method.training import refine as refine_phase

    base, _ = resolve_model(cfg, model)
    silver = lake.read("silver")
    refined = refine_phase(base, cfg.window.split.training(silver.where("has_full_history")), phase, k, cfg.train.seed)
    path = str(save_version(refined, cfg.lake.models, cfg.train.model_name))
    print(f"refined phase {phase} into {refined.refinements[phase][1]}: model {refined.model_id} -> {path}")
    return _Output({path: None}, details={"model": refined, "path": path})


@stage("import-reference-model", writes=("models",))
def import_reference_model(cfg: Config, lake: Any, path: str, name: str = "reference") -> _Output:
    """The original AI4DL model JSON -> a model version under ``lake.models/<name>``."""
    from ai4dl.method.model import save_version
    from ai4dl.method.reference import import_reference

    model = import_reference(path)
    saved = str(save_version(model, cfg.lake.models, name))
    print(f"imported reference model {model.model_id} -> {saved}")
    return _Output({saved: None}, details={"model": model, "path": saved})


@stage("label")
def label(cfg: Config, lake: Any, model: str | None = None) -> _Output:
    """Silver -> phases (replaced atomically), after checking the model fits the silver table."""
    from ai4dl.behaviour.naming import names_of
    from ai4dl.method.labelling import check_compatible

    phase_model, path = resolve_model(cfg, model)
    print(f"label: model {phase_model.model_id} from {path}")
    silver, scaler, n_history = _silver(lake)
    check_compatible(phase_model, scaler.features, n_history, scaler.digest)
    phases = phase_model.transform(silver, engine=cfg.label.engine, switch_penalty=cfg.label.penalty)
    written = lake.overwrite("phases", phases, properties={"ai4dl.model_id": phase_model.model_id})
    counts = lake.read("phases").groupBy("phase").count().orderBy("phase").collect()
    total = sum(r["count"] for r in counts)
    names = names_of(phase_model.info)

    def shown_phase(p: Any) -> str:
        return "none" if p is None else f"{p} ({names[p]})" if p in names else str(p)

    shown = ", ".join(f"{shown_phase(r['phase'])}: {r['count']}" for r in counts)
    print(f"phases: {total} steps labelled ({shown})")
    return _Output({"phases": total}, {"phases": written.version}, details={"model": path}, rows_in=lake.count("silver"))


# --------------------------------------------------------------------------------------------------- behaviour


@stage("behaviour", writes=("report",))
def behaviour(cfg: Config, lake: Any, out_dir: str | None = None) -> _Output:
    """Phases -> gold sequences, transitions and phase statistics; graphs as GraphML/JSON/PNG."""
    from ai4dl.behaviour import graph as G
    from ai4dl.behaviour import sequences as B
    from ai4dl.behaviour.phase_stats import create_bi_views, phase_statistics
    from ai4dl.reporting.plots import draw_graph

    b = cfg.behaviour
    source = lake.commit("phases")
    phases = lake.read("phases", version=source[0] if source else None)  # the commit the sequences record
    written = {"sequences": lake.overwrite("sequences", B.run_lengths(phases, b.min_run_steps), properties={
        PROP_SEQUENCES_PHASES: _commit_text(source), PROP_SEQUENCES_MIN_RUN: str(int(b.min_run_steps))})}
    sequences = lake.read("sequences")
    written["transitions"] = lake.overwrite("transitions", B.transition_counts(sequences))
    names = labelling_phase_names(cfg, lake)
    written["phase_stats"] = lake.overwrite("phase_stats", phase_statistics(phases, sequences, names=names))
    views = create_bi_views(lake.spark, lake.path("phase_stats"), lake.path("sequences"), lake.path("transitions"))

    transitions = lake.read("transitions").toPandas()
    dwell = B.dwell_stats(sequences).toPandas()
    graph = G.name_nodes(G.transition_graph(transitions, dwell), names)
    # Prototypes: the first prototype_depth runs of each life (whole lives of many runs rarely repeat exactly).
    paths = B.collect_path_counts(sequences, b.prototype_depth)
    tree = G.name_nodes(G.prototype_tree(paths), names)
    top = G.top_prototypes(paths, b.top_prototypes)
    out = Path(out_dir or cfg.report.dir)
    out.mkdir(parents=True, exist_ok=True)
    G.write_graph(graph, out / "transition_graph")
    G.write_graph(tree, out / "prototype_tree")
    draw_graph(graph, out / "transition_graph.png", title="Phase transitions")
    draw_graph(tree, out / "prototype_tree.png", title="Prototypical executions")
    rows = {name: _rows(lake, name, w) for name, w in written.items()}
    print(f"behaviour: {rows['sequences']} runs, {rows['transitions']} transitions; views {', '.join(views)}")
    for p in top:
        print(f"  prototype {'-'.join(map(str, p.path))}: {p.count} containers ({p.share:.1%})")
    print(f"  top {len(top)} prototypes cover {G.coverage(top):.1%} of the fleet")
    return _Output(rows, {name: w.version for name, w in written.items()}, details={"graph": graph, "tree": tree, "prototypes": top, "transitions": transitions, "dwell": dwell})


# --------------------------------------------------------------------------------------------------- policies


# The policy inputs of the newest phases, kept for the next stage of the same process (policies, then report).
_POLICY_INPUTS: dict[tuple, Any] = {}


def _per_phases_version(kind: str, cfg: Config, lake: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, or its value from an earlier call on the same phases commit and config.

    ``policies`` and ``report`` both derive the phase statistics and transitions of the training containers
    from the phases table (seconds of Spark jobs on the demo); in one process (``ai4dl demo``, ``ai4dl run``,
    a notebook) the second stage takes them from here. A commit is named by its version and timestamp, so a
    table rewritten or recreated since is recomputed. Returns a copy: callers may change what they get.
    """
    import copy

    commit = lake.commit("phases")
    if commit is None:
        return compute()  # which says the table is missing, as a stage reading it would
    path = lake.path("phases")
    key = (kind, path, *commit, cfg.digest)
    if key not in _POLICY_INPUTS:
        value = compute()
        for old in [k for k in _POLICY_INPUTS if k[:2] == key[:2]]:
            del _POLICY_INPUTS[old]
        _POLICY_INPUTS[key] = value
    return copy.deepcopy(_POLICY_INPUTS[key])


def policy_phase_stats(cfg: Config, lake: Any) -> dict[int, dict[str, Any]]:
    """Per-phase demand statistics from training containers only: the phase rule must not see the test fleet.

    ``policies.phase_statistic``: ``fraction`` (default) allocates the phase's quantile of usage as a share of
    each container's own limit; ``absolute`` its quantile in cores and bytes (the gold phase_stats numbers).
    Each phase's entry also holds ``phase.headroom``'s quantile tables of the usage jumps that follow it.
    """
    return _per_phases_version("phase_stats", cfg, lake, lambda: _policy_phase_stats(cfg, lake))


def _policy_phase_stats(cfg: Config, lake: Any) -> dict[int, dict[str, Any]]:
    from pyspark.sql import functions as F

    from ai4dl.behaviour.phase_stats import ALL_SERVICES, phase_statistics
    from ai4dl.behaviour.sequences import run_lengths
    from ai4dl.policies.fleet import phase_fraction_stats, phase_headroom_stats
    from ai4dl.policies.replay import PolicyParams, phase_stats_for_policy

    p = cfg.policies
    phases = cfg.window.split.training(lake.read("phases"))
    if p.phase_statistic == "fraction":
        stats = phase_fraction_stats(phases, p.phase_quantile)
    else:
        column = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[p.phase_quantile]  # checked by PoliciesConfig
        table = phase_statistics(phases, run_lengths(phases)).where(F.col("service") == ALL_SERVICES)
        stats = phase_stats_for_policy(table.toPandas(), (f"cpu_{column}", f"mem_{column}"))
    for phase, tables in phase_headroom_stats(phases, PolicyParams.from_config(p)).items():
        stats.setdefault(phase, {}).update(tables)
    return stats


def policy_transitions(cfg: Config, lake: Any) -> Any:
    """Phase-transition probabilities of the training containers only (``phase.proactive`` bets on them), as a
    small pandas ``src, dst, count, probability`` table."""
    from ai4dl.behaviour.sequences import run_lengths, transition_counts

    def compute() -> Any:
        runs = _sequences_of_current_phases(cfg, lake)
        if runs is None:
            runs = run_lengths(lake.read("phases"), cfg.behaviour.min_run_steps)
        return transition_counts(cfg.window.split.training(runs)).toPandas()

    return _per_phases_version("transitions", cfg, lake, compute)


# What the sequences table was built from (behaviour records it with the data): the phases commit and smoothing.
PROP_SEQUENCES_PHASES = "ai4dl.phases_commit"
PROP_SEQUENCES_MIN_RUN = "ai4dl.min_run_steps"


def _commit_text(commit: tuple[int, str] | None) -> str | None:
    return None if commit is None else f"{commit[0]}@{commit[1]}"


def _sequences_of_current_phases(cfg: Config, lake: Any) -> Any:
    """The sequences table when behaviour built it from the newest phases commit with the configured smoothing
    (run lengths are per container, so its training containers' rows are theirs), else None: recompute then."""
    if not lake.exists("sequences"):
        return None
    version = lake.version("sequences")
    props = lake.properties("sequences")
    fresh = (props.get(PROP_SEQUENCES_PHASES) == _commit_text(lake.commit("phases"))
             and props.get(PROP_SEQUENCES_MIN_RUN) == str(int(cfg.behaviour.min_run_steps)))
    if not fresh or lake.version("sequences") != version:  # rewritten while we looked: do not mix the two
        return None
    return lake.read("sequences", version=version)


def _next_phase_scores(cfg: Config, lake: Any, transitions: Any) -> dict[str, float]:
    """How often the training transitions predict a held-out container's next phase (micro F1 over run ends)."""
    from ai4dl.policies.replay import f1_scores, next_phase_f1

    if not lake.exists("sequences"):
        return {}
    runs = cfg.window.split.held_out(lake.read("sequences")).select("pod_id", "run", "phase").toPandas()
    counts = {"boundaries": 0, "predicted": 0, "correct": 0}
    for _, pod in runs.sort_values(["pod_id", "run"]).groupby("pod_id"):
        scores = next_phase_f1(pod["phase"].tolist(), transitions)
        for k in counts:
            counts[k] += int(scores[k])
    return {**counts, **f1_scores(**counts)}


def calibration_containers(cfg: Config, train: Any) -> tuple[Any, int | None]:
    """The training containers the knob grid is replayed on: all of them, or, on a fleet with more than
    ``policies.calibration_containers``, a fixed hash-chosen subset of about that many (then also how many
    training containers there are). A knob is one number per policy chosen from fleet totals: a thousand
    containers settle it, and calibration then costs the same at 10 million rows as at one."""
    cap = cfg.policies.calibration_containers
    if cap is None:
        return train, None
    n = train.select("pod_id").distinct().count()
    if n <= cap:
        return train, None
    return cfg.window.split.training_sample(train, cap / n), n


@stage("policies")
def policies(cfg: Config, lake: Any) -> _Output:
    """Replay the held-out containers under every policy, and compare them at one service level.

    Writes ``policy_replay`` (each policy at its configured parameters), ``policy_frontier`` (the held-out
    replay over every knob value) and ``policy_calibration`` (each policy's knob chosen on the training
    containers for ``policies.target_fulfilment``, scored held out); prints the calibrated table first.
    """
    from ai4dl.policies.calibration import calibrate, format_calibration
    from ai4dl.policies.fleet import frontier_totals, replay_at_params, replay_fleet, replay_fleet_grid, summarise
    from ai4dl.policies.replay import PolicyParams, ServiceLevel, format_summary

    params = PolicyParams.from_config(cfg.policies)
    stats = policy_phase_stats(cfg, lake)
    transitions = policy_transitions(cfg, lake)
    phases = lake.read("phases")
    split = cfg.window.split
    train, test = split.training(phases), split.held_out(phases)
    if test.limit(1).count() == 0:  # a tiny fleet may have no held-out container: replay all of it
        print("policies: no held-out containers; replaying the whole fleet")
        test = phases
    frontier = lake.overwrite("policy_frontier", replay_fleet_grid(test, params, stats, transitions))
    at_params = replay_at_params(lake.read("policy_frontier"), params)  # the frontier holds every policy at params
    written = {"policy_replay": lake.overwrite(
        "policy_replay", at_params if at_params is not None else replay_fleet(test, params, stats, transitions)),
        "policy_frontier": frontier}
    held_totals = frontier_totals(lake.read("policy_frontier"))
    calibrating, training_containers = calibration_containers(cfg, train)
    train_totals = frontier_totals(replay_fleet_grid(calibrating, params, stats, transitions))
    table = calibrate(train_totals, held_totals, ServiceLevel.from_config(cfg.policies))
    if training_containers is not None:
        print(f"policies: knobs chosen on {int(train_totals['containers'].max())} of {training_containers} training "
              f"containers (policies.calibration_containers={cfg.policies.calibration_containers})")
    written["policy_calibration"] = lake.overwrite("policy_calibration", lake.spark.createDataFrame(table, _schema("policy_calibration")))
    print(format_calibration(table))
    scores = _next_phase_scores(cfg, lake, transitions)
    if scores:
        print(f"phase.proactive: next phase predicted at {scores['correct']} of {scores['boundaries']} held-out run ends "
              f"(precision {scores['precision']:.2f}, recall {scores['recall']:.2f}, F1 {scores['f1']:.2f})")
    summary = summarise(lake.read("policy_replay")).toPandas()
    print(format_summary(summary))
    rows = {name: _rows(lake, name, w) for name, w in written.items()}
    return _Output(rows, {name: w.version for name, w in written.items()}, details={"summary": summary, "calibration": table, "frontier": held_totals, "next_phase": scores})


def _rows(lake: Any, name: str, written: Any) -> int:
    """The rows an overwrite left in a table: its commit's own count, else (another commit came after) a count."""
    return written.rows if written.rows is not None else lake.count(name)


def _schema(name: str) -> Any:
    from ai4dl.lake.tables import spec

    return spec(name).schema


# --------------------------------------------------------------------------------------------------- live


def live_inputs(cfg: Config, model: Any, model_id: str) -> Any:
    """What the live stream needs besides its data (:class:`ai4dl.stream.online.Live`): the model and the
    policy's inputs, computed as the policies stage computes them, from ``stream.statistics_lake`` (default this
    lake). The next-phase prediction reads that lake's gold transitions when they exist (all containers), else
    the policy's (training containers). A lake without phases yet gives no statistics: the phase policies then
    allocate the limit, as the replay does for a phase without a statistic."""
    from ai4dl.behaviour.naming import names_of
    from ai4dl.errors import ModelError
    from ai4dl.lake.columns import METRICS
    from ai4dl.lake.tables import Lake
    from ai4dl.method.features import DERIVED
    from ai4dl.policies.replay import PolicyParams, normalise_transitions
    from ai4dl.stream.online import Live

    if model.n_history != cfg.window.n_history:
        raise ModelError(f"model has n_history {model.n_history}, window.n_history is {cfg.window.n_history}")
    unknown = [f for f in model.features if f not in METRICS and f not in DERIVED]
    if unknown:
        raise ModelError(f"model features {unknown} are neither bronze metric columns nor derived features")
    from ai4dl.lake.session import get_spark

    stats_lake = Lake(get_spark(cfg), cfg.stream.statistics_lake or cfg.lake.root)
    stats: dict = {}
    transitions: dict = {}
    nxt: dict = {}
    if stats_lake.exists("phases"):
        stats = policy_phase_stats(cfg, stats_lake)
        transitions = normalise_transitions(policy_transitions(cfg, stats_lake))
        nxt = normalise_transitions(stats_lake.read("transitions")) if stats_lake.exists("transitions") else transitions
    names = names_of(model.info)
    return Live(
        model=model, model_id=model_id, n_history=cfg.window.n_history, max_gap_seconds=cfg.window.max_gap_seconds,
        policy=cfg.stream.policy, params=PolicyParams.from_config(cfg.policies), phase_stats=stats,
        transitions=transitions, next_phase=nxt, phase_names=names,
    )


def stream_checkpoint(cfg: Config) -> str:
    from ai4dl.lake.tables import join_path

    return cfg.stream.checkpoint or join_path(cfg.lake.root, "_checkpoints", "stream")


@stage("stream")
def stream(cfg: Config, lake: Any, model: str | None = None, measure_delays: bool = False) -> _Output:
    """Bronze, as it grows -> phases (appended) and gold recommendations, until bronze is drained
    (``stream.trigger: availableNow``) or stopped (``continuous``). See :mod:`ai4dl.stream.query`."""
    from ai4dl.lake import tables
    from ai4dl.method.model import latest_version, load
    from ai4dl.stream.query import run_stream

    s = cfg.stream
    spark = lake.spark
    run_id = tables.session_commit_info(spark).get(tables.RUN_ID_KEY, "-")
    started = tables.utc_now()

    def current_model() -> str:
        return str(model or cfg.label.model or latest_version(cfg.lake.models, cfg.train.model_name))

    def prepare(path: str) -> Any:
        phase_model = load(path)
        return live_inputs(cfg, phase_model, phase_model.model_id)

    def on_model(path: str, model_id: str) -> None:
        print(f"stream: model {model_id} from {path}")
        tables.log_event(lake, run_id, "stream", cfg.digest, started, "model", f"model {model_id} from {path}")

    if cfg.label.penalty is not None:
        print("stream: phases are labelled step by step as samples arrive; label.smoothing 'viterbi' decodes whole "
              "traces and applies to the batch label stage only")
    if s.input:
        lake.ensure("bronze")  # the folder feeds bronze: the table the stream reads exists from the start
    elif not lake.exists("bronze"):
        from ai4dl.errors import MissingTableError

        raise MissingTableError(f"table 'bronze' does not exist yet at {lake.path('bronze')}; run ingest first "
                                "(or set stream.input to a folder the stream ingests)")
    report = run_stream(
        lake, prepare, current_model, stream_checkpoint(cfg), s.trigger, s.interval_seconds, s.max_seconds,
        s.max_files_per_trigger, on_model, measure_delays, s.state_ttl_hours, s.input, cfg.ingest,
    )
    print(f"stream: {report.summary()} in {report.seconds:.1f}s")
    written = {"phases": report.phases, "recommendations": report.recommendations,
               "quarantine": report.late + report.quarantined}
    if s.input:
        written["bronze"] = report.ingested
    return _Output(written, details={"report": report})


# --------------------------------------------------------------------------------------------------- upkeep


@stage("optimize")
def optimize(cfg: Config, lake: Any, tables: tuple[str, ...] = ()) -> _Output:
    """Compact (and Z-order) the lake's Delta tables: all of them, or the logical names given."""
    from ai4dl.lake.tables import TABLES, spec

    names = list(tables) or [n for n in TABLES if n != "run_log"]
    for name in names:
        spec(name)  # an unknown name fails before any table is touched
    written: dict[str, int | None] = {}
    for name in names:
        metrics = lake.optimize(name)
        if metrics:
            print(f"optimize {name}: {metrics['files_removed']} files compacted into {metrics['files_added']}")
            written[name] = None
    return _Output(written)


# --------------------------------------------------------------------------------------------------- reporting


@stage("report", writes=("report",))
def report(cfg: Config, lake: Any, out: str | None = None) -> _Output:
    """One HTML page of a run: a trace by phase, phase distributions, the graphs, the policy savings."""
    from pyspark.sql import functions as F

    from ai4dl.behaviour.phase_stats import ALL_SERVICES
    from ai4dl.lake.columns import POD_ID
    from ai4dl.policies.fleet import summarise
    from ai4dl.policies.replay import PolicyParams
    from ai4dl.reporting import plots
    from ai4dl.reporting.html import Section, write_report

    out_dir = Path(out or cfg.report.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    phases = lake.read("phases")
    pod = phases.groupBy(POD_ID).count().orderBy(F.desc("count"), POD_ID).first()[POD_ID]
    one = phases.where(F.col(POD_ID) == pod).drop("activations").toPandas()
    sample = phases.where(F.col("phase").isNotNull()).select("phase", "cpu_usage_cores", "mem_current")
    total = sample.count()
    sample_pdf = sample.sample(fraction=min(1.0, 200_000 / max(total, 1)), seed=1).toPandas()
    params = PolicyParams.from_config(cfg.policies)
    stats = policy_phase_stats(cfg, lake)
    images = {
        "trace": plots.plot_trace_phases(one, out_dir / "trace_phases.png", title=f"Container {pod} by phase",
                                         names=labelling_phase_names(cfg, lake)),
        "box": plots.plot_phase_boxplots(sample_pdf, out_dir / "phase_boxplots.png"),
        "curves": plots.plot_policy_curves(one, out_dir / "policy_curves.png", params, phase_stats=stats,
                                           transitions=policy_transitions(cfg, lake)),
    }
    sections = [Section("A container's life by phase", f"Container {pod}: CPU and memory, coloured by phase.", images=[images["trace"]])]
    sections.append(Section("What each phase uses", "CPU cores and memory per phase, and how common each phase is.", images=[images["box"]]))
    if lake.exists("phase_stats"):
        table = lake.read("phase_stats").where(F.col("service") == ALL_SERVICES).orderBy("phase").toPandas()
        graphs = [p for p in (out_dir / "transition_graph.png", out_dir / "prototype_tree.png") if p.exists()]
        sections.append(Section("Phase statistics (fleet)", "From the gold table phase_stats.", table=table.round(3), images=graphs))
    meta: dict[str, Any] = {"lake": cfg.lake.root, "labelled steps": total}
    if lake.exists("policy_calibration") and lake.exists("policy_frontier"):
        from ai4dl.policies.fleet import frontier_totals

        calibration = lake.read("policy_calibration").toPandas()
        target = {r: (None if t != t else float(t)) for r, t in zip(calibration["resource"], calibration["target_fulfilment"])}
        frontier = plots.plot_frontier(frontier_totals(lake.read("policy_frontier")), calibration,
                                       out_dir / "frontier.png", target)
        sections.append(Section(
            "Policies at one service level",
            "Each policy's knob chosen on the training containers for the target fulfilment, then scored on the "
            "held-out containers; the frontier shows every knob value.",
            table=calibration.round(4), images=[frontier]))
    if lake.exists("policy_replay"):
        summary = summarise(lake.read("policy_replay")).toPandas()
        savings = plots.plot_savings(summary, out_dir / "savings.png")
        sections.append(Section("Policies at their configured parameters", "Allocated vs used over the test containers.", table=summary.round(4), images=[savings, images["curves"]]))
    train_report = out_dir / "train_report.json"
    if train_report.exists():
        meta.update({k: v for k, v in json.loads(train_report.read_text()).items() if not isinstance(v, (list, dict))})
    path = write_report(out_dir, title="ai4dl run report", metadata=meta, sections=sections)
    return _Output({str(path): None}, details={"path": path}, rows_in=total)


# --------------------------------------------------------------------------------------------------- demo


@stage("demo", writes=("models", "report"))
def demo(cfg: Config, lake: Any, input: str | None = None, fmt: str | None = None) -> _Output:
    """generate -> ingest -> window -> train -> label -> behaviour -> policies -> report, in one session.

    ``input`` replaces the generated fleet; its format is ``fmt``, else guessed from the path (a Delta table's
    ``_delta_log``, Parquet files), else ``ingest.format``. Each stage prints its own summary line.
    """
    from ai4dl.traces.ingest import guess_format

    spark = lake.spark
    steps: list[StageResult] = []

    def step(result: StageResult) -> StageResult:
        steps.append(result)
        return result

    if input is None:
        input, fmt = step(generate(cfg, spark)).details["path"], "csv"
    elif fmt is None:
        fmt = guess_format(spark, input, cfg.ingest.format)
    step(ingest(cfg, spark, input=input, fmt=fmt))
    step(window(cfg, spark))
    step(train(cfg, spark))
    step(label(cfg, spark))
    step(behaviour(cfg, spark))
    step(policies(cfg, spark))
    page = step(report(cfg, spark)).details["path"]
    print(f"demo: done in {sum(s.seconds for s in steps):.0f}s; open {page}")
    return _Output({str(page): None}, details={"report": page, "stages": steps})


def _save_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


__all__ = [
    "STAGES", "StageResult", "behaviour", "demo", "generate", "import_reference_model", "ingest", "label",
    "labelling_phase_names", "live_inputs", "optimize", "policies", "policy_phase_stats", "refine", "report", "resolve_model", "run",
    "run_many", "stream", "stream_checkpoint", "train", "window",
]
