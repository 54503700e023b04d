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
from ai4dl.method.split import ContainerSplit

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
    df = generate_fleet(lake.spark, g.containers, g.steps, g.seed, g.services, g.start, g.interval_seconds, g.partitions,
                        profile=g.profile)
    write_fleet(df, out, fmt)
    rows = g.containers * g.steps
    print(f"generate: {g.containers} containers x {g.steps} steps = {rows} rows ({fmt}, profile {g.profile}) -> {out}")
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
    from pyspark.sql import functions as F

    from ai4dl.lake.tables import Tally
    from ai4dl.method.model import load
    from ai4dl.method.windowing import build_windows, fit_scaler, silver_properties, window_inputs

    w = cfg.window
    source = scaler_from_model or w.scaler_from_model
    scaler = load(source).scaler if source else None
    raw = window_inputs(lake.read("bronze"))
    if scaler is None:
        scaler = fit_scaler(ContainerSplit.of(w).training(raw), w.features, w.max_gap_seconds)
    read = Tally(raw, rows=F.count(F.lit(1)))
    silver = Tally(build_windows(read.frame, scaler, w.n_history, w.max_gap_seconds),
                   windows=F.count(F.lit(1)), full=F.count_if(F.col("has_full_history")))
    written = lake.overwrite("silver", silver.frame, properties=silver_properties(scaler, w.n_history))
    taken, built = read.values(), silver.values()
    if built is None:  # counted again only when the write did not report them
        counts = {r["has_full_history"]: r["count"] for r in lake.read("silver").groupBy("has_full_history").count().collect()}
        built = {"windows": sum(counts.values()), "full": counts.get(True, 0)}
    total, full = int(built["windows"]), int(built["full"])
    print(f"silver: {total} windows ({full} with full history, {total - full} without)")
    rows_in = int(taken["rows"]) if taken is not None else lake.count("bronze")
    return _Output({"silver": total}, {"silver": written.version}, rows_in=rows_in)


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
    estimator = PhaseEstimator(cfg.train, ContainerSplit.of(cfg.window))
    model = estimator.fit(silver, scaler, n_history)
    model = model.with_info(training_data={**model.info["training_data"], "silver": lake.path("silver")})
    held_out = ContainerSplit.of(cfg.window).held_out(silver.where("has_full_history"))
    quality = score(model, held_out, cfg.label.engine, cfg.label.smoothing, cfg.label.penalty)
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
    refined = refine_phase(base, ContainerSplit.of(cfg.window).training(silver.where("has_full_history")), phase, k, cfg.train.seed)
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
    from pyspark.sql import functions as F

    from ai4dl.behaviour.naming import names_of
    from ai4dl.lake.tables import Tally
    from ai4dl.method.labelling import DECODING_LATENCY, check_compatible, label_windows, resolve_decoding

    phase_model, path = resolve_model(cfg, model)
    print(f"label: model {phase_model.model_id} from {path}")
    silver, scaler, n_history = _silver(lake)
    check_compatible(phase_model, scaler.features, n_history, scaler.digest)
    decoding, penalty = resolve_decoding(phase_model, cfg.label.smoothing, cfg.label.penalty)
    unit = "one nat of the phase classifier's -log p" if phase_model.classifier is not None else "the switch gap"
    print(f"label: decoding {decoding} (latency {DECODING_LATENCY[decoding]})"
          + (f", switch penalty {penalty:g} x {unit}" if penalty else "")
          + ("" if decoding == cfg.label.smoothing else " (the model's own; label.smoothing is not applied)"))
    read = Tally(silver, rows=F.count(F.lit(1)))
    phases = label_windows(read.frame, phase_model, engine=cfg.label.engine, decoding=decoding, switch_penalty=penalty)
    # Per phase as the write goes: the model's phase ids and the unlabelled steps (no history yet).
    per_phase = {f"p{p}": F.count_if(F.col("phase") == p) for p in phase_model.phase_ids}
    labelled = Tally(phases, rows=F.count(F.lit(1)), none=F.count_if(F.col("phase").isNull()), **per_phase)
    properties = {"ai4dl.model_id": phase_model.model_id, "ai4dl.decoding": decoding,
                  "ai4dl.decoding_latency": DECODING_LATENCY[decoding],
                  "ai4dl.switch_penalty": "" if penalty is None else repr(float(penalty))}
    written = lake.overwrite("phases", labelled.frame, properties=properties)
    taken, got = read.values(), labelled.values()
    counts: list[tuple[Any, int]] = []
    if got is not None:
        counts = [(None, int(got["none"]))] if got["none"] else []
        counts += [(p, int(got[f"p{p}"])) for p in phase_model.phase_ids if got[f"p{p}"]]
    if got is None or sum(n for _, n in counts) != got["rows"]:  # not reported, or a phase outside the model's ids
        counts = [(r["phase"], r["count"]) for r in lake.read("phases").groupBy("phase").count().orderBy("phase").collect()]
    total = sum(n for _, n in counts)
    names = names_of(phase_model.info)

    def shown_phase(p: Any) -> str:
        return "none" if p is None else f"{p} ({names[p]})" if p in names else str(p)

    shown = ", ".join(f"{shown_phase(p)}: {n}" for p, n in counts)
    print(f"phases: {total} steps labelled ({shown})")
    rows_in = int(taken["rows"]) if taken is not None else lake.count("silver")
    return _Output({"phases": total}, {"phases": written.version}, details={"model": path}, rows_in=rows_in)


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
    views = create_bi_views(lake.spark, lake.table("phase_stats"), lake.table("sequences"), lake.table("transitions"),
                            lake.namespace)

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
    return _Output(rows, {name: w.version for name, w in written.items()}, details={"graph": graph, "tree": tree, "prototypes": top, "transitions": transitions, "dwell": dwell,
                                "views": views})


# --------------------------------------------------------------------------------------------------- policies


# What the sequences table was built from (behaviour records it with the data): the phases commit and smoothing.
PROP_SEQUENCES_PHASES = "ai4dl.phases_commit"
PROP_SEQUENCES_MIN_RUN = "ai4dl.min_run_steps"


def _commit_text(commit: tuple[int, str] | None) -> str | None:
    return None if commit is None else f"{commit[0]}@{commit[1]}"


def _sequences_of(cfg: Config, lake: Any, commit: tuple[int, str] | None) -> Any:
    """The sequences table when behaviour built it from the phases ``commit`` with the configured smoothing (run
    lengths are per container, so its training containers' rows are theirs), else None: recompute then."""
    if commit is None or not lake.exists("sequences"):
        return None
    version = lake.version("sequences")
    props = lake.properties("sequences")
    fresh = (props.get(PROP_SEQUENCES_PHASES) == _commit_text(commit)
             and props.get(PROP_SEQUENCES_MIN_RUN) == str(int(cfg.behaviour.min_run_steps)))
    if not fresh or lake.version("sequences") != version:  # rewritten while we looked: do not mix the two
        return None
    return lake.read("sequences", version=version)


def resolve_policy_model(cfg: Config) -> tuple[Any, str]:
    """The policy model a consumer uses: ``policies.model``, or the latest one ``ai4dl policies`` saved."""
    from ai4dl.policies.model import resolve

    return resolve(cfg.policies, cfg.lake.models)


def report_policy_model(cfg: Config) -> tuple[Any, str | None]:
    """The policy model the report draws its curves with, and a line saying why there is none: before the first
    `ai4dl policies` there is nothing to say (the curves use the configured knobs), but a model that is
    configured or saved and cannot be used (an older format, a damaged file) is named, not passed over."""
    from ai4dl.errors import ModelError
    from ai4dl.versioned import versions

    if cfg.policies.model is None and not versions(cfg.lake.models, cfg.policies.model_name):
        return None, None
    try:
        return resolve_policy_model(cfg)[0], None
    except ModelError as e:
        return None, f"the policy model is not used, the curves show the configured knobs: {e}"


@stage("policies", writes=("models",))
def policies(cfg: Config, lake: Any) -> _Output:
    """Fit the policy model on the training containers, score it on the held-out ones, write the gold tables.

    The model (:class:`ai4dl.policies.model.PolicyModel`: phase statistics, transitions, every family's knob
    calibrated for the service level, the policy deployed per resource) is saved as a new version under
    ``<lake.models>/<policies.model_name>``. Then ``policy_frontier`` (the held-out replay over every knob value),
    ``policy_replay`` (each policy at its calibrated knob), ``policy_calibration`` (the comparison, printed: what
    the stream will deploy marked) and ``policy_ladder`` (what the learned phases add, :mod:`ai4dl.policies.ladder`).
    """
    from ai4dl.policies.calibration import calibrate
    from ai4dl.policies.fleet import frontier_totals, replay_at_knobs, replay_fleet_grid
    from ai4dl.policies.formatting import format_comparison, format_next_phase
    from ai4dl.policies.ladder import default_levels, ladder, phase_worth, verdict
    from ai4dl.policies.model import PolicyEstimator, save_version

    p = cfg.policies
    commit = lake.commit("phases")
    phases = lake.read("phases", version=commit[0] if commit else None)
    phase_model_id = lake.properties("phases").get("ai4dl.model_id")
    split = ContainerSplit.of(cfg.window)
    train, test = split.training(phases), split.held_out(phases)
    if test.limit(1).count() == 0:  # a tiny fleet may have no held-out container: score on all of it
        print("policies: no held-out containers; scoring on the whole fleet")
        test = phases
    sequences = _sequences_of(cfg, lake, commit)
    estimator = PolicyEstimator(p, split, cfg.behaviour.min_run_steps)
    model, train_totals = estimator.fit_with_totals(train, runs=None if sequences is None else split.training(sequences),
                          phase_model_id=phase_model_id,
                          data_version={"phases": lake.path("phases"), "version": commit[0] if commit else None,
                                        "timestamp": commit[1] if commit else None})
    path = str(save_version(model, cfg.lake.models, p.model_name))
    frontier = lake.overwrite("policy_frontier", replay_fleet_grid(test, p, model.phase_stats, model.transitions,
                                                                     forecasters=model.forecasters))
    frontier_df = lake.read("policy_frontier")
    written = {"policy_replay": lake.overwrite("policy_replay", replay_at_knobs(frontier_df, model.knob_table())),
               "policy_frontier": frontier}
    held_totals = frontier_totals(frontier_df)
    table = calibrate(model.training_frame(), held_totals, model.level, deployed=model.best, chosen=model.training_frame())
    written["policy_calibration"] = lake.overwrite("policy_calibration", lake.spark.createDataFrame(table, _schema("policy_calibration")))
    print(format_comparison(table, header=f"policy model {model.model_id} -> {path} (phase model {phase_model_id})"))
    rungs = ladder({"a": (train_totals, held_totals), "b": (train_totals, held_totals)}, default_levels(p.oom_budget_per_100h))
    written["policy_ladder"] = lake.overwrite("policy_ladder", lake.spark.createDataFrame(rungs, _schema("policy_ladder")))
    for line in verdict(phase_worth(rungs)):
        print(f"policies: {line}")
    scores = {}
    if sequences is not None:
        from ai4dl.policies.nextphase import fleet_next_phase_f1

        runs = split.held_out(sequences).select("pod_id", "service", "run", "phase").toPandas()
        scores = fleet_next_phase_f1(runs, model.transitions, model.service_transitions)
        print(f"policies: {format_next_phase(scores)}")
    details: dict[str, Any] = {"model": model, "path": path, "calibration": table, "frontier": held_totals, "next_phase": scores,
                               "ladder": rungs, "train_totals": train_totals}
    if cfg.mlflow.enabled:
        from ai4dl.tracking import log_policies

        logged = log_policies(cfg, model, path, table)
        print(f"policies: logged to MLflow run {logged['run_id']} ({logged['tracking_uri']})")
        details["mlflow"] = logged
    rows = {name: _rows(lake, name, w) for name, w in written.items()}
    return _Output({path: None, **rows}, {name: w.version for name, w in written.items()}, details=details)


def _rows(lake: Any, name: str, written: Any) -> int:
    """The rows an overwrite left in a table: its commit's own count, else (another commit came after) a count."""
    return written.rows if written.rows is not None else lake.count(name)


def _schema(name: str) -> Any:
    from ai4dl.lake.tables import spec

    return spec(name).schema


# --------------------------------------------------------------------------------------------------- live


def live_inputs(cfg: Config, model: Any, model_id: str, policy_model: Any, policy_path: str) -> Any:
    """What the live stream needs besides its data (:class:`ai4dl.stream.online.Live`): the phase model and the
    deployed policies of the policy model (``stream.policy``: its best per resource, or one policy), refused in
    one line when the policy model was fitted on another phase model's phases."""
    from ai4dl.behaviour.naming import names_of
    from ai4dl.errors import ModelError
    from ai4dl.lake.columns import DERIVED_FEATURES, METRICS
    from ai4dl.method.labelling import CAUSAL_DECODINGS, resolve_decoding, switch_cost
    from ai4dl.policies.live import Deployment
    from ai4dl.policies.model import check_phase_model
    from ai4dl.stream.online import Live

    if model.n_history != cfg.window.n_history:
        raise ModelError(f"model has n_history {model.n_history}, window.n_history is {cfg.window.n_history}")
    unknown = [f for f in model.features if f not in METRICS and f not in DERIVED_FEATURES]
    if unknown:
        raise ModelError(f"model features {unknown} are neither bronze metric columns nor derived features")
    check_phase_model(policy_model, policy_path, model_id)
    decoding, multiplier = resolve_decoding(model, cfg.label.smoothing, cfg.label.penalty)
    if decoding not in CAUSAL_DECODINGS:
        decoding = "none"  # viterbi needs the steps after: the stream says so at start
    penalty = switch_cost(model, decoding, multiplier)
    return Live(
        model=model, model_id=model_id, n_history=cfg.window.n_history,
        deployment=Deployment.of(policy_model, cfg.stream.policy), max_gap_seconds=cfg.window.max_gap_seconds,
        next_phase=policy_model.next_phase, service_next_phase=policy_model.service_next_phase,
        phase_names=names_of(model.info), decoding=decoding, switch_penalty=penalty,
    )


def stream_checkpoint(cfg: Config) -> str:
    from ai4dl.lake.tables import join_path

    return cfg.stream.checkpoint or join_path(cfg.lake.root, "_checkpoints", "stream")


@stage("stream")
def stream(cfg: Config, lake: Any, model: str | None = None, measure_delays: bool = False) -> _Output:
    """Bronze, as it grows -> phases (appended) and gold recommendations, until bronze is drained
    (``stream.trigger: availableNow``) or stopped (``continuous``). See :mod:`ai4dl.stream.query`."""
    from ai4dl.lake import tables
    from ai4dl.method.labelling import CAUSAL_DECODINGS
    from ai4dl.method.model import latest_version, load
    from ai4dl.stream.query import run_stream

    s = cfg.stream
    spark = lake.spark
    run_id = tables.session_commit_info(spark).get(tables.RUN_ID_KEY, "-")
    started = tables.utc_now()

    def current_model() -> tuple[str, str]:
        """The phase model and the policy model to use now (asked at every micro-batch boundary: a new version
        of either restarts the query with it)."""
        from ai4dl.policies.model import latest_version as latest_policy

        phase = str(model or cfg.label.model or latest_version(cfg.lake.models, cfg.train.model_name))
        return phase, str(cfg.policies.model or latest_policy(cfg.lake.models, cfg.policies.model_name))

    def prepare(paths: tuple[str, str]) -> Any:
        from ai4dl.policies.model import load as load_policies

        phase_model = load(paths[0])
        return live_inputs(cfg, phase_model, phase_model.model_id, load_policies(paths[1]), paths[1])

    def on_model(paths: tuple[str, str], live: Any) -> None:
        d = live.deployment
        text = (f"model {live.model_id} from {paths[0]}; policy model {d.model_id} from {paths[1]} deploys "
                f"cpu {d.policies['cpu']}, mem {d.policies['mem']}")
        print(f"stream: {text}")
        tables.log_event(lake, run_id, "stream", cfg.digest, started, "model", text)

    if cfg.label.smoothing not in CAUSAL_DECODINGS:
        print(f"stream: phases are decoded as samples arrive; label.smoothing {cfg.label.smoothing!r} decodes whole "
              "traces and applies to the batch label stage only: the stream takes each step's cheapest phase")
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
    policy_model, unused = report_policy_model(cfg)
    if unused:
        print(f"report: {unused}")
    images = {
        "trace": plots.plot_trace_phases(one, out_dir / "trace_phases.png", title=f"Container {pod} by phase",
                                         names=labelling_phase_names(cfg, lake)),
        "box": plots.plot_phase_boxplots(sample_pdf, out_dir / "phase_boxplots.png"),
        "curves": plots.plot_policy_curves(one, out_dir / "policy_curves.png", policy_model),
    }
    sections = [Section("A container's life by phase", f"Container {pod}: CPU and memory, coloured by phase.", images=[images["trace"]])]
    sections.append(Section("What each phase uses", "CPU cores and memory per phase, and how common each phase is.", images=[images["box"]]))
    if lake.exists("phase_stats"):
        from ai4dl.behaviour.phase_stats import readable_phase_stats

        table = (readable_phase_stats(lake.spark, lake.path("phase_stats")).where(F.col("service") == ALL_SERVICES)
                 .drop("service").orderBy("phase").toPandas())
        graphs = [p for p in (out_dir / "transition_graph.png", out_dir / "prototype_tree.png") if p.exists()]
        sections.append(Section("Phase statistics (fleet)", "From the gold table phase_stats (the view ai4dl_phase_summary): "
                                "CPU in cores, memory in GiB, dwell in minutes.", table=table, images=graphs))
    meta: dict[str, Any] = {"lake": cfg.lake.root, "labelled steps": total}
    if lake.exists("policy_calibration") and lake.exists("policy_frontier"):
        from ai4dl.policies.fleet import frontier_totals
        from ai4dl.policies.formatting import format_comparison

        calibration = lake.read("policy_calibration").toPandas()
        target = {r: (None if t != t else float(t)) for r, t in zip(calibration["resource"], calibration["target_fulfilment"])}
        frontier = plots.plot_frontier(frontier_totals(lake.read("policy_frontier")), calibration,
                                       out_dir / "frontier.png", target)
        images_policies = [frontier, images["curves"]]
        if lake.exists("policy_replay"):
            images_policies.insert(1, plots.plot_savings(summarise(lake.read("policy_replay")).toPandas(), out_dir / "savings.png"))
        shown = calibration[["resource", "policy", "knob_name", "knob", "deployed", "reached", "fulfilment",
                             "savings_vs_static", "savings_vs_vpa", "savings_vs_prev_rules", "oom_kills_per_100h",
                             "throttled_core_seconds", "hours"]].rename(columns={
                                 "fulfilment": "steps met", "oom_kills_per_100h": "OOM kills per 100 container-h",
                                 "throttled_core_seconds": "throttled core-s", "hours": "container-h"})
        sections.append(Section(
            "Policies at one service level",
            "Each policy's knob chosen on the training containers for the service level, then scored on the held-out "
            "containers (" + format_comparison(calibration).splitlines()[0].split(";")[0] + "); 'deployed' is what "
            "`ai4dl stream` allocates with. Memory: an OOM kill is an event the policy reacts to. The frontier shows "
            "every knob value; the curves one container's allocations at the calibrated knobs.",
            table=shown.round(4), images=images_policies))
        if lake.exists("policy_ladder"):
            from ai4dl.policies.ladder import phase_worth, verdict

            rungs = lake.read("policy_ladder").toPandas()
            sections.append(Section(
                "What knowing the phase is worth",
                "Per resource and service level, savings on the held-out containers and the share of the gap closed "
                "between the best of prev.step.rules and vpa and the clairvoyant current.step.max: (a) a forecaster "
                "of recent usage, (b) the same given the learned phase (c, d: the true behaviour, and the true "
                "behaviour of the coming interval, where bench/policy_savings.py adds them). "
                + " ".join(f"{line}." for line in verdict(phase_worth(rungs))),
                images=[plots.plot_ladder(rungs, out_dir / "ladder.png")]))
        if policy_model is not None:
            meta["policy model"] = policy_model.model_id
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
    "labelling_phase_names", "live_inputs", "optimize", "policies", "refine", "report", "resolve_model", "resolve_policy_model", "run",
    "run_many", "stream", "stream_checkpoint", "train", "window",
]
