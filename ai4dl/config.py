"""Job configuration: one frozen dataclass per section, checked when loaded, before any JVM starts.

Built-in defaults, overlaid by a YAML file under ``conf/``, overlaid by ``--set section.key=value`` (values
parsed as YAML). Every key has a declared type and, where it matters, a range or a set of choices; an unknown
key, a value of the wrong type or out of range is a :class:`ConfigError` naming the key, the value and what
is allowed, so ``--set train.k=abc`` fails in a second rather than deep inside training.

>>> cfg = load_config(overrides=["train.k=7", "window.n_history=2"])
>>> cfg.train.k, cfg.window.n_history, cfg.window.train_fraction
(7, 2, 0.8)
>>> load_config(overrides=["train.k=abc"])
Traceback (most recent call last):
...
ai4dl.errors.ConfigError: train.k: 'abc' is not allowed: an integer >= 1
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import functools
import hashlib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

import yaml

from ai4dl.durations import parse_duration, parse_time
from ai4dl.errors import ConfigError, InputError
from ai4dl.lake.columns import BEHAVIOUR_FEATURES, DERIVED_FEATURES, METRICS, lake_name


def _key(default: Any = dataclasses.MISSING, *, lo: float | None = None, hi: float | None = None,
         lo_open: bool = False, choices: tuple[Any, ...] | None = None, factory: Any = None) -> Any:
    """A config field with its constraints (inclusive bounds unless ``lo_open``)."""
    meta = {"lo": lo, "hi": hi, "lo_open": lo_open, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


class _Section:
    """A config section: every field is coerced to its declared type and checked against its declared range or
    choices when the section is built, from YAML or from code alike (``PoliciesConfig(k_std=-1)`` fails as
    ``--set policies.k_std=-1`` does). A section that checks more (several fields together) extends
    ``__post_init__`` and calls this one first."""

    section: ClassVar[str]

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            coerced = _coerce(self.section, f, hints[f.name], value)
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@dataclass(frozen=True)
class SparkConfig(_Section):
    section: ClassVar[str] = "spark"
    master: str = "local[*]"
    app_name: str = "ai4dl"
    shuffle_partitions: int = _key(8, lo=1)
    arrow: bool = True
    # Rows per Arrow batch handed to the encoding UDF: one matrix product per batch.
    arrow_max_records_per_batch: int = _key(20000, lo=1)
    driver_memory: str = "4g"
    # Ivy cache for the Delta JARs; relative paths are under the working directory.
    ivy_cache: str | None = ".cache/ivy"
    # A JVM class-data archive of Spark's and Delta's classes, written into the Ivy cache by the first run and
    # mapped by every later one: the driver starts and runs its first Delta commands in about half the time.
    class_archive: bool = True
    conf: Mapping[str, Any] = _key(factory=dict)


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_folder(key: str, value: str) -> None:
    """A folder ai4dl writes into must be named: not empty, not the current directory, not a filesystem root
    (tables and models would be scattered among whatever else is there)."""
    text = str(value).strip()
    stripped = text.rstrip("/")
    if not text or stripped in ("", ".", "..") or (":" in stripped and stripped.endswith(":")):
        raise ConfigError(f"{key}: {value!r} is not allowed: a folder of its own (e.g. data/lake or s3a://bucket/lake)")


@dataclass(frozen=True)
class LakeConfig(_Section):
    section: ClassVar[str] = "lake"
    root: str = "data/lake"
    models: str = "data/models"
    # Named tables: with ``schema`` set, every table is also registered in the session's catalog as an external
    # Delta table at its path (``<catalog>.<schema>.gold_phase_stats``), and the BI views are persisted there.
    # ``catalog``: Unity Catalog's on Databricks; unset, the session's current one (locally Spark's own, kept in
    # an embedded metastore under ``<root>/_metastore``). Unset ``schema``: tables are paths only, as before.
    catalog: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_folder("lake.root", self.root)
        _check_folder("lake.models", self.models)
        for key in ("catalog", "schema"):
            value = getattr(self, key)
            if value is not None and not _IDENTIFIER.match(str(value)):
                raise ConfigError(f"lake.{key}: {value!r} is not allowed: a SQL identifier (letters, digits, _)")
        if self.catalog is not None and self.schema is None:
            raise ConfigError("lake.catalog is set without lake.schema: name the schema the tables go into")

    @property
    def namespace(self) -> str | None:
        """```catalog`.`schema``` (or ```schema```) the tables are registered in; None: paths only."""
        if self.schema is None:
            return None
        return ".".join(f"`{part}`" for part in (self.catalog, self.schema) if part is not None)


@dataclass(frozen=True)
class IngestConfig(_Section):
    section: ClassVar[str] = "ingest"
    input: str | None = None
    format: str = _key("csv", choices=("csv", "parquet", "delta", "prometheus"))  # prometheus: see that section
    # "auto": each file's own delimiter, detected from its header (",", ";", tab or "|"); or one character.
    delimiter: str = "auto"
    columns: Mapping[str, str] = _key(factory=dict)  # source column -> lake column, for exports with other names
    # A usage above limit x this factor is a broken sample, not a burst.
    max_usage_factor: float = _key(10.0, lo=0, lo_open=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        # A tab is hard to type in YAML or a shell: "\\t" and "tab" mean it too.
        delimiter = {"\\t": "\t", "tab": "\t"}.get(self.delimiter, self.delimiter)
        if delimiter != "auto" and (len(delimiter) != 1 or delimiter in ('"', "\n", "\r")):
            raise ConfigError(
                f"ingest.delimiter: {self.delimiter!r} is not allowed: 'auto' or one character (e.g. ',', ';', '\\t', '|')"
            )
        object.__setattr__(self, "delimiter", delimiter)


@dataclass(frozen=True)
class PrometheusConfig(_Section):
    """Ingest from a Prometheus server's cAdvisor series (``ai4dl ingest --from prometheus URL``); see
    :mod:`ai4dl.traces.prometheus` for the mapping to the export's columns."""

    section: ClassVar[str] = "prometheus"
    url: str | None = None
    start: str | None = None  # epoch seconds, ISO-8601 or now-6h
    end: str = "now"
    step: str = "10s"  # one bronze row per container and step
    selector: str = 'container!="",container!="POD",image!=""'  # PromQL label matchers of the cAdvisor series
    service_label: str = "namespace"  # the label that becomes ``service``
    rate_range: str = "5m"  # irate's range: must hold two scrapes
    # Points per series in one range query: Prometheus refuses more than 11,000, longer ranges are split.
    max_points: int = _key(11_000, lo=1, hi=11_000)
    retries: int = _key(3, lo=0)  # on 5xx answers and connection errors
    backoff_seconds: float = _key(1.0, lo=0)  # doubled after each retry
    timeout_seconds: float = _key(30.0, lo=0, lo_open=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("step", "rate_range"):
            try:
                parse_duration(getattr(self, key), positive=True)
            except InputError:
                raise ConfigError(f"prometheus.{key}: {getattr(self, key)!r} is not allowed: a duration such as 10s, 1m, 500ms") from None
        for key in ("start", "end"):
            value = getattr(self, key)
            if value is not None:
                try:
                    parse_time(value)
                except InputError:
                    raise ConfigError(f"prometheus.{key}: {value!r} is not allowed: epoch seconds, ISO-8601 or now-6h") from None


# Profiles of the synthetic fleet (ai4dl.traces.synthetic): the five AI4DL behaviours in a Markov chain, or jobs that
# run a regular training loop (warm-up, then epochs of training, evaluation and periodic checkpoints).
GENERATOR_PROFILES: tuple[str, ...] = ("ai4dl", "training-loop")


@dataclass(frozen=True)
class GenerateConfig(_Section):
    section: ClassVar[str] = "generate"
    containers: int = _key(120, lo=1)
    steps: int = _key(400, lo=1)
    seed: int = 7
    services: int = _key(4, lo=1)
    start: int = _key(1_700_000_000, lo=0)  # epoch seconds of the first sample
    interval_seconds: int = _key(30, lo=1)
    partitions: int = _key(0, lo=0)  # 0: two per core
    profile: str = _key("ai4dl", choices=GENERATOR_PROFILES)


@dataclass(frozen=True)
class WindowConfig(_Section):
    section: ClassVar[str] = "window"
    # The behaviour features (ai4dl.method.features): shares of the limits and rolling spread/change, which
    # phases follow far better than the 8 DLaaS metrics (DEFAULT_FEATURES, still accepted). README "Method notes".
    features: tuple[str, ...] = BEHAVIOUR_FEATURES
    n_history: int = _key(3, lo=1)
    train_fraction: float = _key(0.8, lo=0, hi=1, lo_open=True)
    split_seed: int = 42
    # A gap between two samples longer than this starts a new segment whose first steps lack history.
    max_gap_seconds: float | None = _key(None, lo=0, lo_open=True)
    # Use this model's scaler instead of fitting one (e.g. an imported reference model).
    scaler_from_model: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # Source (dotted, as in the export) and lake (snake_case) names are both accepted; the lake's are kept.
        DERIVED = DERIVED_FEATURES
        names = tuple(f if f in DERIVED else lake_name(f) for f in self.features)
        unknown = [f for f, n in zip(self.features, names) if n not in METRICS and n not in DERIVED]
        if unknown or not names:
            raise ConfigError(
                f"window.features: {unknown[0] if unknown else list(self.features)!r} is not allowed: "
                f"metric columns, e.g. {', '.join(METRICS)} (or their dotted export names), or derived "
                f"features: {', '.join(DERIVED)}"
            )
        if len(set(names)) != len(names):
            raise ConfigError(f"window.features: {list(self.features)!r} names a feature twice")
        object.__setattr__(self, "features", names)


@dataclass(frozen=True)
class TrainConfig(_Section):
    section: ClassVar[str] = "train"
    n_hidden: int = _key(32, lo=1)
    k: int = _key(5, lo=1)
    cd_k: int = _key(1, lo=1)
    epochs: int = _key(60, lo=1)
    batch_size: int = _key(128, lo=1)
    learning_rate: float = _key(0.01, lo=0, lo_open=True)
    patience: int = _key(5, lo=1)
    min_delta: float = _key(1e-4, lo=0)
    sample_size: int = _key(100_000, lo=1)
    max_per_container: int = _key(2_000, lo=1)
    seed: int = 1234
    # k-means starts (Spark ML: seeds seed, seed+1, ...): the lowest-cost fit is kept (phases stable across seeds).
    kmeans_restarts: int = _key(10, lo=1)
    # Where k-means is fitted on the CRBM's sample: "driver" (scikit-learn on the sample the CRBM already holds
    # in the driver; well under a second) or "spark" (Spark ML, some 60 Spark jobs per start: 20-30 s on the
    # demo for the same fit). Assignment of every window is distributed either way (label).
    kmeans_engine: str = _key("driver", choices=("driver", "spark"))
    device: str = _key("auto", choices=("auto", "cpu", "cuda"))
    # > 1: train the CRBM data-parallel with Spark's TorchDistributor on this many processes.
    distributor_processes: int = _key(0, lo=0)
    k_range: tuple[int, int] | None = None  # e.g. [3, 8]: print silhouette and inertia for each k
    # The phase classifier the decoders read (ai4dl.method.classifier): trained on the phases Viterbi gives whole
    # training containers (classifier_steps steps of them at most), so a causal decoder says what the offline one
    # would; hidden units (0: none, decode raw distances to the centres) and epochs, chosen on development fleets.
    classifier_units: int = _key(64, lo=0)
    classifier_epochs: int = _key(30, lo=1)
    classifier_steps: int = _key(100_000, lo=1)
    # Teach the classifier, at each step, the offline phase this many steps later: the offline phases of windows
    # that summarise the past change after the behaviour did, and a classifier taught them early calls a change
    # when the windows first show it (0: the offline phase of the same step). 8 chosen on a development fleet's
    # training containers (delay p95 9 -> 5 steps, ARI 0.907 -> 0.927), confirmed on another's (bench/README.md).
    classifier_lead: int = _key(8, lo=0)
    model_name: str = "ai4dl"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k_range is not None and not (2 <= self.k_range[0] <= self.k_range[1]):
            raise ConfigError(f"train.k_range: {list(self.k_range)!r} is not allowed: [lo, hi] with 2 <= lo <= hi")


DEFAULT_SWITCH_PENALTY = {
    "forward": {"nats": 0.25, "distances": 1.0},
    "viterbi": {"nats": 10.0, "distances": 10.0},
}
"""The switching price per decoding (ai4dl.method.labelling.DECODINGS) and unit of the model's costs: ``nats`` of
its phase classifier's -log p (the default model), ``distances`` for a model without one (in units of its
switch gap). Over distances, chosen on the *training* containers of ``fleet-2026`` by ``bench/phase_quality.py``
(forward: the best of 0.5-10 on their ARI; viterbi: the earlier sessions' choice on the same containers). Over a
classifier's -log p, forward 0.25 nats is the largest of 0.25 / 0.5 / 1 / 2 whose change delay p95 is at most 4
steps on the training containers of all three development fleets (``bench/feature_ablation.py
--forward-penalties``; issue 30's goal is 5: one step of margin), for about 1.8x the false changes of 1 nat
(13-18 per 1,000 steps; the issue's bar is 41.2); see bench/README.md."""


@dataclass(frozen=True)
class LabelConfig(_Section):
    section: ClassVar[str] = "label"
    model: str | None = None  # model directory; default: latest version under lake.models/<train.model_name>
    engine: str = _key("arrow", choices=("arrow", "pandas"))  # see ai4dl.method.labelling
    # How a container's phases are read from its steps (ai4dl.method.labelling.DECODINGS): forward (default) is
    # causal, a latency of 0 steps (each step's phase decided at that step, never revised), the same in the label
    # stage and the live stream; viterbi decodes whole traces (offline only); none takes each step's cheapest
    # phase (latency 0). The costs are the model's phase classifier's -log p (ai4dl.method.classifier)
    # or, without one, the squared distances to the centres. A phase change is priced at switch_penalty x one nat
    # for a classifier, x the model's typical margin of squared distances (ai4dl.method.labelling.switch_gap)
    # otherwise; unset, the default for the decoding and the model's costs (DEFAULT_SWITCH_PENALTY above: forward
    # 0.25 nats or 1 switch gap, viterbi 10).
    smoothing: str = _key("forward", choices=("none", "forward", "viterbi"))
    switch_penalty: float | None = _key(None, lo=0)

    @property
    def penalty(self) -> float | None:
        """The configured switching penalty (units of the model's costs: one nat of its classifier, else its
        switch gap); None for none, or when unset: the default depends on the model's costs
        (ai4dl.method.labelling.resolve_decoding)."""
        if self.smoothing == "none" or self.switch_penalty is None:
            return None
        return float(self.switch_penalty)


@dataclass(frozen=True)
class BehaviourConfig(_Section):
    section: ClassVar[str] = "behaviour"
    # Runs shorter than this are absorbed by a neighbour: single-step flickers are noise, not phases.
    min_run_steps: int = _key(3, lo=1)
    top_prototypes: int = _key(5, lo=1)
    # Prototypes and the prefix tree use the first runs of each life (whole lives rarely repeat exactly).
    prototype_depth: int = _key(4, lo=1)


# Allocation policies (ai4dl.policies): the replay compares them all, the stream deploys one per resource.
POLICIES: tuple[str, ...] = (
    "static", "current.step.max", "current.step.rules", "prev.step.max", "prev.step.rules", "phase.rule",
    "phase.proactive", "phase.headroom", "forecast", "phase.forecast", "vpa",
)
# The oracles read the interval they allocate for: they bound what a policy could do, and cannot run live.
ORACLES: tuple[str, ...] = ("current.step.max", "current.step.rules")
LIVE_POLICIES: tuple[str, ...] = tuple(p for p in POLICIES if p not in ORACLES)


@dataclass(frozen=True)
class PoliciesConfig(_Section):
    """Every parameter of the policy replay, its calibration and the fitted policy model, declared once: the
    ``policies`` section is what :mod:`ai4dl.policies` reads (rules in ``ai4dl/policies/rules.py``)."""

    section: ClassVar[str] = "policies"
    interval_steps: int = _key(10, lo=1)
    k_std: float = _key(2.0, lo=0)  # prev.step.rules' knob
    margin: float = _key(0.15, lo=0)  # phase.rule's and phase.proactive's knob
    prev_max_margin: float = _key(0.0, lo=0)  # prev.step.max's knob: headroom over the previous interval's max
    # phase.rule: a phase's quantile of usage, as a share of the container's limit (fraction) or absolute.
    phase_statistic: str = _key("fraction", choices=("fraction", "absolute"))
    phase_quantile: float = _key(0.95, lo=0, hi=1)
    # phase.proactive also provisions for every phase the current one is followed by with this probability.
    proactive_threshold: float = _key(0.2, lo=0, hi=1)
    # phase.headroom's knob: the quantile of the usage jumps seen after a phase (training containers) added,
    # as a share of the limit, to the previous interval's max.
    headroom_quantile: float = _key(0.9, lo=0, hi=1)
    # forecast / phase.forecast (ai4dl/policies/forecast.py): gradient-boosted trees forecast the coming
    # interval's peak, its median and its forecast_quantile, from the last intervals (and the phase); their knob,
    # forecast_miss_cost, is the price of a missed interval in shares of the limit: the allocation rises above
    # the median forecast while the misses it avoids are worth more than it costs. They are
    # fitted on at most forecast_max_rows intervals of forecast_fit_share of the training containers and
    # calibrated on the other training containers.
    forecast_quantile: float = _key(0.9, lo=0.5, hi=0.999, lo_open=True)  # < 1: the upper forecast sets a width
    forecast_miss_cost: float = _key(1.0, lo=0, hi=1e9, lo_open=True)
    forecast_max_rows: int = _key(200_000, lo=100)
    forecast_fit_share: float = _key(0.5, lo=0, hi=1, lo_open=True)
    # The service level policies are compared at and the policy model is calibrated for: each policy's knob is
    # chosen on the training containers so that it is reached, then scored on the held-out containers. CPU:
    # the share of steps whose usage is met (target_fulfilment, or target_fulfilment_cpu). Memory: an OOM
    # budget, kills per 100 container-hours (an OOM kill is an event: the container dies once and the policy
    # reacts); or, when target_fulfilment_mem is set (or the budget is null), a share of steps met.
    target_fulfilment: float = _key(0.95, lo=0, hi=1)
    target_fulfilment_cpu: float | None = _key(None, lo=0, hi=1)
    target_fulfilment_mem: float | None = _key(None, lo=0, hi=1)
    oom_budget_per_100h: float | None = _key(10.0, lo=0)
    # The knob grid is replayed on at most this many training containers (a fixed, hash-chosen subset of them;
    # None: all), so calibration costs the same on any fleet size; the held-out ones are always all replayed.
    calibration_containers: int | None = _key(1000, lo=1)
    # vpa: the real recommender's knobs; the defaults are the "matched" conformance flags (20 min memory).
    vpa_percentile: float = _key(0.9, lo=0, hi=1)  # vpa's knob: target percentile of CPU and memory
    vpa_margin: float = _key(0.15, lo=0)  # VPA's own safety margin
    vpa_cpu_half_life_s: float = _key(1200.0, lo=0, lo_open=True)
    vpa_mem_half_life_s: float = _key(1200.0, lo=0, lo_open=True)
    vpa_mem_interval_s: float = _key(1200.0, lo=0, lo_open=True)  # one memory peak per window this long
    # Seconds per step when a trace has no timestamps (VPA's clock, throttled core-seconds, container-hours).
    vpa_step_seconds: float = _key(10.0, lo=0, lo_open=True)
    # The fitted policy model (ai4dl.policies.model): a directory, or the latest version under
    # <lake.models>/<model_name>, which `ai4dl policies` writes and the stream, recommendations and report read.
    model: str | None = None
    model_name: str = "policies"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.phase_statistic == "absolute" and self.phase_quantile not in (0.5, 0.95, 0.99):
            raise ConfigError(
                f"policies.phase_quantile: {self.phase_quantile!r} is not allowed with phase_statistic 'absolute': "
                "one of 0.5, 0.95, 0.99 (the quantiles the gold phase_stats table holds)"
            )


@dataclass(frozen=True)
class StreamConfig(_Section):
    """``ai4dl stream``: live phases and recommendations (see :mod:`ai4dl.stream`)."""

    section: ClassVar[str] = "stream"
    # The policy the stream deploys, with the policy model's calibrated knob: "best", per resource the policy the
    # model ranks best at its service level (the least allocated among those reaching it on the training
    # containers), or one live policy for both resources.
    policy: str = _key("best", choices=("best", *LIVE_POLICIES))
    # availableNow: process what bronze holds, then stop; continuous: a micro-batch every interval_seconds.
    trigger: str = _key("availableNow", choices=("availableNow", "continuous"))
    interval_seconds: float = _key(10.0, lo=0, lo_open=True)
    # Continuous trigger: stop after this long (None: run until stopped). For benchmarks and smoke runs.
    max_seconds: float | None = _key(None, lo=0, lo_open=True)
    # Offsets and state of the query; default <lake.root>/_checkpoints/stream. One checkpoint per query.
    checkpoint: str | None = None
    # Files admitted per micro-batch. Large on purpose: one commit's files interleave the timestamps of
    # its containers, so a commit split across batches would make its later files' older samples late.
    max_files_per_trigger: int = _key(1_000_000, lo=1)
    # A folder watched for new trace files (ingest.format, read and validated as `ingest` does: same columns,
    # same quarantine); each micro-batch's new files are ingested into bronze, which the stream then labels.
    # Files must appear whole (written elsewhere, then moved in). None: bronze is fed by `ingest` runs.
    input: str | None = None
    # A container without a new sample for this long is finished: its state (window, trace) is dropped at a
    # batch boundary. If it ever sends again, it starts a new trace (steps from 0, no history); its phases
    # stay, its recommendation row is replaced by the newer one. None: state is kept forever.
    state_ttl_hours: float | None = _key(24.0, lo=0, lo_open=True)


@dataclass(frozen=True)
class ReportConfig(_Section):
    section: ClassVar[str] = "report"
    dir: str = "data/report"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_folder("report.dir", self.dir)


@dataclass(frozen=True)
class MlflowConfig(_Section):
    """MLflow tracking of ``train`` (see :mod:`ai4dl.tracking`); needs ``pip install 'ai4dl[mlflow]'``."""

    section: ClassVar[str] = "mlflow"
    enabled: bool = False
    tracking_uri: str | None = None  # default: the local folder <lake.root>/_mlflow
    experiment: str = "ai4dl"


@dataclass(frozen=True)
class Config:
    spark: SparkConfig = field(default_factory=SparkConfig)
    lake: LakeConfig = field(default_factory=LakeConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    window: WindowConfig = field(default_factory=WindowConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    label: LabelConfig = field(default_factory=LabelConfig)
    behaviour: BehaviourConfig = field(default_factory=BehaviourConfig)
    policies: PoliciesConfig = field(default_factory=PoliciesConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML/JSON-ready): what :func:`from_dict` reads back."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=dict))

    def replace(self, **sections: Any) -> "Config":
        """A copy with whole sections, or ``section={key: value}`` updates, replaced (and re-validated)."""
        data = self.to_dict()
        for name, value in sections.items():
            if dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            data = _merge(data, {name: value})
        return from_dict(data)

    @property
    def digest(self) -> str:
        """Short stable digest of the configuration, recorded with what a job wrote."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]

# Sections whose mapping-valued keys take free-form entries (Spark properties, column renames).
_FREE_FORM = {("spark", "conf"), ("ingest", "columns")}


def _describe(f: dataclasses.Field, kind: Any) -> str:
    meta = f.metadata
    if meta.get("choices"):
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    base = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, str(kind))
    if kind is tuple or typing.get_origin(kind) is tuple:
        base = "a list"
    if kind in (dict, collections.abc.Mapping):
        base = "a mapping"
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and hi is not None:
        base += f" in {'(' if meta.get('lo_open') else '['}{lo}, {hi}]"
    elif lo is not None:
        base += f" {'>' if meta.get('lo_open') else '>='} {lo}"
    return base


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _coerce(section: str, f: dataclasses.Field, hint: Any, value: Any) -> Any:
    key = f"{section}.{f.name}"
    kind, optional = _unwrap_optional(hint)
    allowed = _describe(f, typing.get_origin(kind) or kind) + (" or null" if optional else "")

    def bad() -> ConfigError:
        shown = "an empty value" if value is None else repr(value)
        return ConfigError(f"{key}: {shown} is not allowed: {allowed}")

    if value is None:
        if optional:
            return None
        raise bad()
    origin = typing.get_origin(kind)
    if kind is bool:
        if not isinstance(value, bool):
            raise bad()
        out: Any = value
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        out = value
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        out = float(value)
    elif kind is str and isinstance(value, datetime.date):  # YAML reads an unquoted ISO time as a datetime
        out = value.isoformat()
    elif kind is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise bad()
        out = str(value)
    elif origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise bad()
        args = typing.get_args(kind)
        item = args[0]
        if len(args) > 1 and args[1] is not Ellipsis and len(value) != len(args):
            raise bad()
        if any(not isinstance(v, item) or isinstance(v, bool) for v in value):
            raise bad()
        out = tuple(value)
    elif origin in (dict, collections.abc.Mapping) or kind in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise bad()
        out = dict(value)
    else:  # pragma: no cover - a field type this loader does not know is a programming error
        raise TypeError(f"{key}: unsupported config type {kind}")
    meta = f.metadata
    if meta.get("choices") and out not in meta["choices"]:
        raise bad()
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (out < lo or (meta.get("lo_open") and out == lo)):
        raise bad()
    if hi is not None and out > hi:
        raise bad()
    return out


def _section(name: str, data: Mapping[str, Any]) -> Any:
    cls = SECTIONS[name]
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"unknown config key '{name}.{unknown[0]}' (known in '{name}': {', '.join(known)})")
    return cls(**data)


def from_dict(data: Mapping[str, Any]) -> Config:
    """A validated :class:`Config` from a nested mapping (missing keys take their defaults)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a configuration must be a mapping of sections, got {type(data).__name__}")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown config section '{unknown[0]}' (known: {', '.join(SECTIONS)})")
    sections = {}
    for name, section in data.items():
        if not isinstance(section, Mapping):
            raise ConfigError(f"config section '{name}' must be a mapping, got {section!r}")
        sections[name] = _section(name, section)
    return Config(**sections)


def _merge(base: dict, extra: Mapping, path: str = "") -> dict:
    out = dict(base)
    for key, value in extra.items():
        where = f"{path}{key}"
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and tuple(where.split(".")) not in _FREE_FORM:
            out[key] = _merge(out[key], value, where + ".")
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _parse_override(item: str) -> dict[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not of the form section.key=value")
    key, raw = item.split("=", 1)
    keys = key.strip().split(".")
    if len(keys) < 2 or not all(keys):
        raise ConfigError(f"override '{item}': the key must be section.key (e.g. train.k=6)")
    try:
        value: Any = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    for k in reversed(keys):
        value = {k: value}
    return value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the YAML file at ``path``, then each ``section.key=value`` override; validated."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at top level")
        data = _merge(data, loaded)
    for item in overrides or []:
        data = _merge(data, _parse_override(item))
    return from_dict(data)


__all__ = [
    "BehaviourConfig", "Config", "ConfigError", "GenerateConfig", "IngestConfig", "LabelConfig", "LakeConfig", "MlflowConfig",
    "PoliciesConfig", "PrometheusConfig", "ReportConfig", "SparkConfig", "TrainConfig", "WindowConfig", "from_dict", "load_config",
]
