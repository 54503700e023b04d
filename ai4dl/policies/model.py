"""The policy half of the method as a fitted model: ``PolicyEstimator.fit(training phases, service level) ->
PolicyModel``, as the phase half is ``PhaseEstimator.fit -> PhaseModel``.

A policy model holds everything a policy decision needs, fitted on the training containers only:

* per phase, the statistics the phase policies allocate from (``phase.rule``'s quantile of usage, as a share of
  the limit or absolute) and ``phase.headroom``'s quantile tables of the usage jumps that follow the phase;
* the phase-transition probabilities (``phase.proactive``), each service's transition counts and the next-phase
  tables read from both (live recommendations; :mod:`ai4dl.policies.nextphase`);
* the forecasters of ``forecast`` and ``phase.forecast`` per resource (:mod:`ai4dl.policies.forecast`: trees as
  plain arrays), fitted on a hash-chosen share of the training containers;
* the calibrated knob of every policy family per resource, chosen on (a fixed subset of) the training
  containers as the cheapest value that reaches the service level, with what each reached there;
* the service level, the policy the stream deploys per resource (the best one at that level), the bounds a
  Kubernetes object may allocate within, the phase model it was fitted on and the data version (the phases
  table's commit).

Every consumer reads the same numbers from it: ``ai4dl policies`` scores it on held-out containers and writes the
gold tables from it, the stream and ``ai4dl recommendations`` allocate with it, the report and ``bench/`` read it.
A model is a versioned, checksummed directory (:mod:`ai4dl.versioned`) of one JSON file, no pickle; its id is a
digest of its content.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pandas as pd

from ai4dl import __version__, versioned
from ai4dl.config import LIVE_POLICIES, POLICIES, PoliciesConfig, from_dict
from ai4dl.errors import ConfigError, ModelError
from ai4dl.policies.calibration import ServiceLevel, best_live, choose_knob
from ai4dl.policies.forecast import FORECASTS, HISTORY, MIN_TRAINING_INTERVALS, SUMMARY, Forecaster
from ai4dl.policies.nextphase import fleet_transitions, next_phase_table, normalise_service_transitions, normalise_transitions
from ai4dl.policies.rules import HEADROOM_LEVELS, KNOBS, RESOURCES, finite_value, knob_of, vpa_params

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

    from ai4dl.method.split import ContainerSplit

FORMAT = "ai4dl-policy-model/3"  # 3: each service's transition counts; 2: the forecasters' knob is a miss cost
# formats this version still reads: a format-2 model has no service counts (every container is told the fleet's
# next phase). A new format, so an earlier ai4dl refuses a model it would misread, in one line, not by its id.
READABLE_FORMATS = (FORMAT, "ai4dl-policy-model/2")
# formats this version reads no more: a model saved in one is refitted, not reinterpreted
RETIRED_FORMATS = {"ai4dl-policy-model/1": "saved by an earlier ai4dl (its forecasters' knob was a spread, not a "
                                           "miss cost): refit it with `ai4dl policies`"}
POLICY_FILE = "policy.json"
# choose_knob's columns a model keeps of each (policy, resource) on the training containers.
_TRAINING_COLUMNS = ("policy", "resource", "knob", "reached", "containers", "hours", "steps", "fulfilment",
                     "oom_kills_per_100h", "allocated", "static_allocated")


@dataclass(frozen=True, eq=False)
class PolicyModel:
    params: PoliciesConfig  # the policies section it was fitted with (knobs at their configured values)
    level: ServiceLevel
    phase_stats: dict[int, dict[str, Any]]
    transitions: dict[int, dict[int, float]]
    knobs: dict[str, dict[str, float | None]]  # policy -> resource -> calibrated knob (None: no knob)
    training: tuple[dict[str, Any], ...]  # each (policy, resource) at its knob on the training containers
    best: dict[str, str]  # resource -> the policy deployed by default
    phase_model_id: str | None
    data_version: dict[str, Any] = field(default_factory=dict)  # the phases table it was fitted on
    info: dict[str, Any] = field(default_factory=dict)
    forecasters: dict[str, dict[str, Forecaster]] = field(default_factory=dict)  # policy -> resource -> trees
    service_transitions: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)  # service -> src -> dst -> n

    def __post_init__(self) -> None:
        for policy, per_resource in self.knobs.items():
            if policy not in POLICIES or set(per_resource) - set(RESOURCES):
                raise ModelError(f"policy model: unknown policy or resource in knobs: {policy} {sorted(per_resource)}")
        for resource, policy in self.best.items():
            if resource not in RESOURCES or policy not in LIVE_POLICIES:
                raise ModelError(f"policy model: best policy {policy!r} for {resource!r} cannot run live")

    # ---- what a decision reads ----
    def params_for(self, policy: str, resource: str) -> PoliciesConfig:
        """The policies section with ``policy``'s calibrated knob for ``resource``: the parameters its replay and
        its live decisions run with."""
        if policy not in POLICIES:
            raise ConfigError(f"unknown policy '{policy}' (known: {', '.join(POLICIES)})")
        name = knob_of(policy)
        value = self.knobs.get(policy, {}).get(resource)
        if name is None or value is None:
            return self.params
        return dataclasses.replace(self.params, **{name: float(value)})

    def deployment(self, choice: str = "best") -> dict[str, str]:
        """Resource -> the policy deployed: the model's best at its service level (``best``), or one live policy
        for both resources."""
        if choice == "best":
            missing = [r for r in RESOURCES if r not in self.best]
            if missing:
                raise ModelError(f"policy model {self.model_id} ranks no live policy for {', '.join(missing)}")
            return {r: self.best[r] for r in RESOURCES}
        if choice not in LIVE_POLICIES:
            raise ConfigError(f"stream.policy: {choice!r} cannot allocate live (allowed: best, {', '.join(LIVE_POLICIES)})")
        return {r: choice for r in RESOURCES}

    def knob_table(self) -> dict[tuple[str, str], float | None]:
        """(policy, resource) -> calibrated knob, for every policy and resource calibrated."""
        return {(p, r): v for p, per in self.knobs.items() for r, v in per.items()}

    def training_frame(self) -> pd.DataFrame:
        """:func:`~ai4dl.policies.calibration.choose_knob`'s rows as fitted (what
        :func:`~ai4dl.policies.calibration.calibrate` scores held out)."""
        frame = pd.DataFrame(list(self.training), columns=list(_TRAINING_COLUMNS))
        frame.insert(2, "knob_name", [knob_of(p) for p in frame["policy"]])
        frame["knob"] = pd.to_numeric(frame["knob"], errors="coerce")
        frame["reached"] = frame["reached"].astype(bool)
        return frame

    @property
    def next_phase(self) -> dict[int, tuple[int, float]]:
        """The fleet's next-phase table: what a container of a service never seen in training is told."""
        return next_phase_table(self.transitions)

    @property
    def service_next_phase(self) -> dict[str, dict[int, tuple[int, float]]]:
        """Per service seen in training, its containers' next-phase table (its own counts beside the fleet's)."""
        return {svc: next_phase_table(self.transitions, counts) for svc, counts in self.service_transitions.items()}

    @property
    def bounds(self) -> dict[str, dict[str, float]]:
        """What a Kubernetes object may allocate: at least VPA's pod minimum (25 millicores, 250 MiB: the floor
        of the ``vpa`` policy, below which a container is not worth sizing), at most the container's limit (every
        policy is capped there): ``{"cpu": {"min": cores, "max_share_of_limit": 1.0}, "mem": {...}}``."""
        vp = vpa_params(self.params, True)
        return {"cpu": {"min": vp.pod_min_cpu_millicores / 1000.0, "max_share_of_limit": 1.0},
                "mem": {"min": vp.pod_min_memory_mb * 1024 * 1024, "max_share_of_limit": 1.0}}

    # ---- identity and storage ----
    def as_dict(self) -> dict[str, Any]:
        """Everything the model holds, as JSON values (what ``policy.json`` stores; NaN as null). The services'
        transition counts only when there are any, so a format-2 model (which has none) keeps its id."""
        return _plain({
            **({"service_transitions": self.service_transitions} if self.service_transitions else {}),
            "params": dataclasses.asdict(self.params),
            "service_level": self.level.as_dict(),
            "phase_stats": {str(p): v for p, v in sorted(self.phase_stats.items())},
            "transitions": {str(s): {str(d): p for d, p in sorted(ds.items())} for s, ds in sorted(self.transitions.items())},
            "knobs": self.knobs,
            "training": list(self.training),
            "best": self.best,
            "phase_model_id": self.phase_model_id,
            "data_version": self.data_version,
            "forecasters": {p: {r: fc.as_dict() for r, fc in sorted(per.items())} for p, per in sorted(self.forecasters.items())},
        })

    @functools.cached_property
    def model_id(self) -> str:
        """Content digest: two models with the same numbers have the same id, wherever they are stored."""
        blob = json.dumps(self.as_dict(), sort_keys=True, allow_nan=False).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = POLICY_FILE) -> "PolicyModel":
        try:
            params = from_dict({"policies": data["params"]}).policies
            level = ServiceLevel(**data["service_level"])
            stats = {int(p): dict(v) for p, v in data["phase_stats"].items()}
            transitions = normalise_transitions({(s, d): p for s, ds in data["transitions"].items() for d, p in ds.items()})
            knobs = {str(p): {str(r): (None if v is None else float(v)) for r, v in per.items()} for p, per in data["knobs"].items()}
            training = tuple(dict(row) for row in data["training"])
            forecasters = {str(p): {str(r): Forecaster.from_dict(fc) for r, fc in per.items()}
                           for p, per in (data.get("forecasters") or {}).items()}
            services = normalise_service_transitions(data.get("service_transitions") or {})
            return cls(params, level, stats, transitions, knobs, training, dict(data["best"]),
                       data.get("phase_model_id"), dict(data.get("data_version") or {}), forecasters=forecasters,
                       service_transitions=services)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelError(f"{where}: not a policy model ({type(exc).__name__}: {exc})") from None
        except ConfigError as exc:
            raise ModelError(f"{where}: {exc}") from None


def _plain(value: Any) -> Any:
    """JSON values: NaN and infinities as null, numpy scalars and arrays as Python numbers and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    return value


def save(model: PolicyModel, directory: str | Path) -> Path:
    """Write the model to ``directory`` (which must not exist yet), atomically."""

    def write_files(tmp: Path) -> list[str]:
        (tmp / POLICY_FILE).write_text(json.dumps(model.as_dict(), indent=1, sort_keys=True, allow_nan=False))
        return [POLICY_FILE]

    return versioned.write(directory, write_files, {
        "format": FORMAT, "model_id": model.model_id, "phase_model_id": model.phase_model_id,
        "data_version": model.data_version, "service_level": model.level.as_dict(), "best": model.best,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "ai4dl_version": __version__,
        "info": _plain(model.info),
    })


def load(directory: str | Path) -> PolicyModel:
    """Read and verify a policy model directory; every problem is one :class:`~ai4dl.errors.ModelError` line
    naming the file."""
    d = Path(directory)
    manifest = versioned.read_manifest(d, READABLE_FORMATS, (POLICY_FILE,), RETIRED_FORMATS)
    path = d / POLICY_FILE
    model = PolicyModel.from_dict(versioned.read_json(path), str(path))
    if manifest.get("model_id") != model.model_id:
        raise ModelError(f"{d / versioned.MANIFEST}: model_id does not match the stored numbers")
    return dataclasses.replace(model, info=dict(manifest.get("info") or {}))


def save_version(model: PolicyModel, root: str | Path, name: str) -> Path:
    """Save as the next version ``vNNNN`` of ``name``; an identical model already saved is not duplicated."""
    return versioned.save_version(root, name, model.model_id, lambda d: load(d).model_id, lambda d: save(model, d))


def latest_version(root: str | Path, name: str) -> Path:
    return versioned.latest_version(root, name, "policy model", "run `ai4dl policies` first")


def resolve(params: PoliciesConfig, models_root: str | Path) -> tuple[PolicyModel, str]:
    """The policy model a consumer uses: ``policies.model``, or the latest version under
    ``<lake.models>/<policies.model_name>``."""
    path = params.model or str(latest_version(models_root, params.model_name))
    return load(path), str(path)


def check_phase_model(model: PolicyModel, where: str, phase_model_id: str) -> None:
    """Refuse, in one line naming both ids, a policy model fitted on another phase model's phases."""
    if model.phase_model_id != phase_model_id:
        raise ModelError(f"policy model {where} was fitted on the phases of phase model {model.phase_model_id}, "
                         f"but phases here come from phase model {phase_model_id}: run `ai4dl policies` on them "
                         "(or set policies.model)")


# -------------------------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class PolicyEstimator:
    """Fits a :class:`PolicyModel` on the training containers' phases (Spark: statistics by aggregation, the knob
    grid replayed in the executors; only small tables reach the driver)."""

    params: PoliciesConfig = field(default_factory=PoliciesConfig)
    split: "ContainerSplit | None" = None  # the hash split, whose training subset calibrates on a large fleet
    min_run_steps: int = 3  # the run smoothing of the transitions (behaviour.min_run_steps)

    def fit(self, phases: "DataFrame", level: ServiceLevel | None = None, runs: "DataFrame | None" = None,
            phase_model_id: str | None = None, data_version: Mapping[str, Any] | None = None,
            log: Any = print) -> PolicyModel:
        """See :meth:`fit_with_totals`: the model alone."""
        return self.fit_with_totals(phases, level, runs, phase_model_id, data_version, log)[0]

    def fit_with_totals(self, phases: "DataFrame", level: ServiceLevel | None = None, runs: "DataFrame | None" = None,
                        phase_model_id: str | None = None, data_version: Mapping[str, Any] | None = None,
                        log: Any = print) -> "tuple[PolicyModel, pd.DataFrame]":
        """Fit on ``phases`` (the training containers' ``PHASES`` rows) for ``level`` (default: the params'
        service level). ``runs``: their phase runs (``gold/phase_sequences`` rows), when already built with
        the same smoothing; else they are computed. Also returns the calibration totals the knobs were chosen
        from (:meth:`calibration_totals`), from which a knob can be chosen at any other service level."""
        from ai4dl.behaviour.sequences import run_lengths, service_transition_counts

        p = self.params
        level = level or ServiceLevel.from_config(p)
        stats = phase_statistics(phases, p)
        runs = runs if runs is not None else run_lengths(phases, self.min_run_steps)
        by_service = service_transition_counts(runs).toPandas()
        transitions, services = fleet_transitions(by_service), normalise_service_transitions(by_service)
        forecasters, fitted_on = self.fit_forecasters(phases, stats, log)
        totals, total = self.calibration_totals(phases, stats, transitions, forecasters, fitted_on)
        if totals.empty:
            raise ModelError("policy model: no training containers with phases to calibrate on")
        chosen = choose_knob(totals, level)
        _check_reached(chosen, level, p)
        if total is not None and log is not None:
            log(f"policies: knobs chosen on {int(totals['containers'].max())} of {total} training containers "
                f"(policies.calibration_containers={p.calibration_containers})")
        if forecasters and fitted_on is not None and log is not None:  # none left: the forecast policies vanish
            fc = totals[totals["policy"].isin(FORECASTS)]
            log(f"policies: forecast margins calibrated on {int(fc['containers'].max()) if len(fc) else 0} "
                "training containers the forecasters were not fitted on")
        knobs: dict[str, dict[str, float | None]] = {}
        for row in chosen.itertuples(index=False):
            value = None if row.policy not in KNOBS or pd.isna(row.knob) else float(row.knob)
            knobs.setdefault(row.policy, {})[row.resource] = value
        training = tuple(_plain({c: getattr(row, c, None) for c in _TRAINING_COLUMNS}) for row in chosen.itertuples(index=False))
        return PolicyModel(
            params=p, level=level, phase_stats=stats, transitions=transitions, knobs=knobs, training=training,
            best=best_live(chosen, level), phase_model_id=phase_model_id, data_version=dict(data_version or {}),
            info={"calibration_containers": int(totals["containers"].max()), "training_containers": total},
            forecasters=forecasters, service_transitions=services,
        ), totals

    def calibration_totals(self, train: "DataFrame", stats: Mapping[int, Any], transitions: Any,
                           forecasters: Mapping[str, Mapping[str, Forecaster]], fitted_on: Any
                           ) -> "tuple[pd.DataFrame, int | None]":
        """Every policy and knob value replayed on the calibration containers, summed per (policy, resource,
        knob) (what a knob is chosen from, at any service level), and how many training containers there are
        when only a subset calibrates. ``fitted_on``: the column of the containers the forecasters learned from,
        whose forecast rows are left out (a forecaster's margin is calibrated on containers its trees never
        saw)."""
        from pyspark.sql import functions as F

        from ai4dl.policies.fleet import frontier_totals, replay_fleet_grid

        calibrating, total = self.calibration_containers(train)
        frontier = replay_fleet_grid(calibrating, self.params, stats, transitions, forecasters=forecasters)
        if fitted_on is not None:
            frontier = frontier.where(~F.col("policy").isin(*FORECASTS) | ~fitted_on)
        return frontier_totals(frontier), total

    def fit_forecasters(self, train: "DataFrame", stats: Mapping[int, Any], log: Any = print
                        ) -> "tuple[dict[str, dict[str, Forecaster]], Any]":
        """The forecasters of ``forecast`` (no phase inputs) and ``phase.forecast`` (with the phases of
        ``stats``) per resource, fitted in the driver on a bounded sample of the intervals of a hash-chosen
        ``forecast_fit_share`` of the training containers; and the column telling those containers apart (None
        when there are too few containers to keep the two sides apart: then both learn from all of them, and
        the log says so)."""
        from pyspark.sql import functions as F

        from ai4dl.method.split import ContainerSplit
        from ai4dl.policies.fleet import forecast_training_rows

        p = self.params
        sampler = self.split or ContainerSplit(1.0, 42)
        fitted_on = sampler.in_training_sample(F.col("pod_id"), float(p.forecast_fit_share))
        sides = {bool(r[0]): int(r[1]) for r in train.select(fitted_on.alias("f"), "pod_id").distinct()
                 .groupBy("f").count().collect()}
        if min(sides.get(True, 0), sides.get(False, 0)) < 2:
            fit_set, fitted_on = train, None
            if log is not None:
                log(f"policies: forecasters fitted and calibrated on the same {sum(sides.values())} training containers "
                    "(too few to keep apart)")
        else:
            fit_set = train.where(fitted_on)
        phase_list = sorted(int(k) for k in stats)
        rows = forecast_training_rows(fit_set, p, phase_list, int(p.forecast_max_rows))
        n_history = HISTORY * len(SUMMARY)
        out: dict[str, dict[str, Forecaster]] = {}
        for resource in RESOURCES:
            part = rows[rows["resource"] == resource]
            if len(part) < MIN_TRAINING_INTERVALS:
                if log is not None:
                    log(f"policies: no forecaster for {resource}: {len(part)} training intervals to learn from "
                        f"({MIN_TRAINING_INTERVALS} needed); forecast and phase.forecast allocate its limit")
                continue
            x, y = np.vstack(part["x"].to_numpy()), part["y"].to_numpy(dtype=float)
            out.setdefault("forecast", {})[resource] = Forecaster.fit(x[:, :n_history], y, p.forecast_quantile)
            if phase_list:
                out.setdefault("phase.forecast", {})[resource] = Forecaster.fit(x, y, p.forecast_quantile, phase_list)
        if log is not None and out:
            log(f"policies: forecasters fitted on {len(rows) // max(len(RESOURCES), 1)} intervals per resource "
                f"(at quantile {p.forecast_quantile:g}; policies.forecast_max_rows={p.forecast_max_rows})")
        return out, fitted_on

    def calibration_containers(self, train: "DataFrame") -> tuple["DataFrame", int | None]:
        """The training containers the knob grid is replayed on: all of them, or, on a fleet with more than
        ``policies.calibration_containers``, a fixed hash-chosen subset of about that many (then also how many
        training containers there are). A knob is one number per policy chosen from fleet totals: a thousand
        containers settle it, and calibration then costs the same at 10 million rows as at one. The subset is
        drawn from the other end of the training range than the forecasters' fit sample
        (:meth:`fit_forecasters`): a forecaster's margin is calibrated only on containers its trees never saw,
        and from the same end every calibrating container would be one they saw, leaving the forecast
        policies without a single row to calibrate on."""
        cap = self.params.calibration_containers
        if cap is None or self.split is None:
            return train, None
        n = train.select("pod_id").distinct().count()
        if n <= cap:
            return train, None
        return self.split.training_sample(train, cap / n, from_end=True), n


def service_level_key(params: PoliciesConfig, resource: str) -> str:
    """The config key that sets ``resource``'s service level (what a user changes when it cannot be met)."""
    if resource == "cpu":
        return "policies.target_fulfilment_cpu" if params.target_fulfilment_cpu is not None else "policies.target_fulfilment"
    if params.target_fulfilment_mem is not None:
        return "policies.target_fulfilment_mem"
    return "policies.oom_budget_per_100h" if params.oom_budget_per_100h is not None else "policies.target_fulfilment"


def _check_reached(chosen: pd.DataFrame, level: ServiceLevel, params: PoliciesConfig) -> None:
    """A service level that no live policy reaches with any knob on the training containers cannot be deployed:
    one line naming the key, before anything is written."""
    live = chosen[chosen["policy"].isin([q for q in LIVE_POLICIES if q != "static"])]
    for resource, rows in live.groupby("resource", sort=True):
        if rows["reached"].any():
            continue
        if level.by_oom(str(resource)):
            best = rows.sort_values("oom_kills_per_100h", kind="stable").iloc[0]
            got = f"{best['policy']} at {best['oom_kills_per_100h']:.1f} OOM kills per 100 container-hours"
        else:
            best = rows.sort_values("fulfilment", ascending=False, kind="stable").iloc[0]
            got = f"{best['policy']} at {best['fulfilment']:.1%} of steps met"
        key = service_level_key(params, str(resource))
        raise ConfigError(f"{key}: {level.describe(str(resource))} is reached by no policy's knob on the training "
                          f"containers (closest: {got}); relax it")


def phase_statistics(phases: "DataFrame", params: PoliciesConfig) -> dict[int, dict[str, Any]]:
    """Per phase, what the phase policies allocate from: ``policies.phase_statistic`` ``fraction`` (the phase's
    ``phase_quantile`` of usage as a share of each container's own limit) or ``absolute`` (in cores and bytes),
    and ``phase.headroom``'s quantile tables of the usage jumps that follow the phase. Give it the training
    containers only."""
    from pyspark.sql import functions as F

    from ai4dl.behaviour.phase_stats import ALL_SERVICES
    from ai4dl.behaviour.phase_stats import phase_statistics as gold_statistics
    from ai4dl.behaviour.sequences import run_lengths
    from ai4dl.policies.fleet import phase_fraction_stats, phase_headroom_stats

    if params.phase_statistic == "fraction":
        stats = phase_fraction_stats(phases, params.phase_quantile)
    else:
        column = {0.5: "p50", 0.95: "p95", 0.99: "p99"}[params.phase_quantile]  # checked by PoliciesConfig
        table = gold_statistics(phases, run_lengths(phases)).where(F.col("service") == ALL_SERVICES)
        stats = absolute_statistics(table.toPandas(), (f"cpu_{column}", f"mem_{column}"))
    for phase, tables in phase_headroom_stats(phases, params).items():
        stats.setdefault(phase, {}).update(tables)
    return stats


def absolute_statistics(phase_stats: pd.DataFrame, quantile_cols: tuple[str, str] = ("cpu_p95", "mem_p95")) -> dict[int, dict[str, float]]:
    """``{phase: {"cpu": v, "mem": v}}`` from a gold ``phase_stats`` table (pandas): its fleet-wide rows
    (``service == "__all__"`` when the table has a ``service`` column), ``quantile_cols`` naming the CPU and the
    memory statistic. Rows with a null phase are dropped; a null statistic stays NaN (``phase.rule`` then falls
    back to the limit)."""
    pdf = pd.DataFrame(phase_stats)
    cpu_col, mem_col = quantile_cols
    missing = [c for c in ("phase", cpu_col, mem_col) if c not in pdf.columns]
    if missing:
        raise ValueError(f"phase statistics lack column(s) {missing} (have: {list(pdf.columns)})")
    if "service" in pdf.columns:
        pdf = pdf[pdf["service"] == "__all__"]
    pdf = pdf[pdf["phase"].notna()]
    return {int(r["phase"]): {"cpu": finite_value(r[cpu_col]), "mem": finite_value(r[mem_col])} for _, r in pdf.iterrows()}


assert len(HEADROOM_LEVELS) == 201  # the tables a model stores; a change of levels is a new FORMAT

__all__ = [
    "FORMAT", "PolicyEstimator", "PolicyModel", "absolute_statistics", "check_phase_model", "latest_version", "load",
    "phase_statistics", "resolve", "save", "save_version",
]
