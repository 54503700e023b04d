"""The estimator: ``PhaseEstimator(train, split).fit(silver) -> PhaseModel``, like ``pyspark.ml``'s fit -> model.

Fitting draws a stratified sample of training windows (``train.sample_size`` windows, at most
``train.max_per_container`` from one container, so long traces do not dominate), trains the CRBM on the driver
(or data-parallel with TorchDistributor), encodes every training window in the executors with the trained CRBM
(:func:`ai4dl.method.labelling.encode_windows`) and clusters the encodings with Spark ML k-means. Then the
phase classifier the decoders read (:mod:`ai4dl.method.classifier`) learns, from whole training containers,
the phases Viterbi gives them offline (:func:`distill_classifier`). The model records its whole training
section and the split, so :meth:`PhaseEstimator.from_model` retrains it as it was.
Held-out containers (the complement of the split) score the result (:func:`score`).
"""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ai4dl import __version__
from ai4dl.config import TrainConfig, WindowConfig
from ai4dl.errors import InputError, ModelError
from ai4dl.lake.columns import POD_ID
from ai4dl.method.classifier import TARGET_PENALTY, PhaseClassifier, fit_classifier
from ai4dl.method.clustering import adjusted_rand_index, contingency, fit_centers, fit_centers_local, k_report
from ai4dl.method.crbm import encode, train_crbm
from ai4dl.method.labelling import encode_windows, label_windows, squared_distances, stack_rows, switch_gap, viterbi
from ai4dl.method.model import PhaseModel
from ai4dl.method.scaler import Scaler
from ai4dl.method.split import ContainerSplit


def stratified_sample(windows: DataFrame, size: int, per_container: int, seed: int) -> DataFrame:
    """At most ``per_container`` random windows of each container, then at most ``size`` overall.

    The windows are chosen by their keys alone (the random order is drawn over the same rows, in the same scan
    order, so the same windows are chosen), then read again with their arrays for those keys only: the shuffle
    and sort that pick the sample move keys, not every training window's features and history."""
    order = Window.partitionBy(POD_ID).orderBy(F.rand(seed), "ts")
    keys = windows.select(POD_ID, "ts")
    capped = keys.withColumn("_r", F.row_number().over(order)).where(F.col("_r") <= per_container).drop("_r")
    by_hash = F.xxhash64(POD_ID, "ts", F.lit(seed))
    chosen = capped.orderBy(by_hash).limit(size)
    return windows.join(F.broadcast(chosen), [POD_ID, "ts"]).orderBy(by_hash)


def _matrices(df: DataFrame, n_vis: int, n_cond: int) -> tuple[np.ndarray, np.ndarray]:
    pdf = df.select("features", "history").toPandas()
    if pdf.empty:
        raise InputError("no training windows with full history; ingest and window more data first")
    x = stack_rows(pdf["features"], n_vis)
    cond = stack_rows(pdf["history"], n_cond)
    return x, cond


@dataclasses.dataclass(frozen=True)
class PhaseEstimator:
    """CRBM + k-means over silver windows; every parameter is validated by :class:`~ai4dl.config.TrainConfig`."""

    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    split: ContainerSplit = dataclasses.field(default_factory=lambda: ContainerSplit.of(WindowConfig()))

    def get_params(self) -> dict[str, Any]:
        """Every parameter (the training section and the split), as stored in a fitted model."""
        return {"train": dataclasses.asdict(self.train), "split": self.split.as_dict()}

    @classmethod
    def from_model(cls, model: PhaseModel) -> "PhaseEstimator":
        """The estimator a model was fitted with: refit it on new windows to retrain it as it was."""
        params = model.info.get("params")
        if not params:
            raise ModelError("this model records no training parameters (imported or trained by an older ai4dl)")
        from ai4dl.config import from_dict

        # a model trained before the phase classifier existed had none, one trained before its lead learnt the
        # offline phases of the same step: retrained as it was, it is the same again
        train = from_dict({"train": {"classifier_units": 0, "classifier_lead": 0, **params["train"]}}).train
        return cls(train, ContainerSplit(**params["split"]))

    def fit(self, silver: DataFrame, scaler: Scaler, n_history: int, log: Callable[[str], Any] | None = print) -> PhaseModel:
        """Fit on the training side of ``silver`` (windows built with ``scaler`` and ``n_history``)."""
        log = log or (lambda *_: None)
        t = self.train
        windows = self.split.training(silver.where(F.col("has_full_history")))
        # the sample feeds the CRBM and k-means: training costs the same whatever the fleet size (every window
        # is assigned later, distributed, by label); cached so the sampling query runs once
        sample = stratified_sample(windows, t.sample_size, t.max_per_container, t.seed).cache()
        x, cond = _matrices(sample, len(scaler.features), len(scaler.features) * n_history)
        log(f"train: CRBM on {len(x)} sampled windows ({len(scaler.features)} features, history {n_history})")
        t0 = time.time()
        if t.distributor_processes > 1:
            result = train_distributed(x, cond, _crbm_params(t), t.distributor_processes, log=log)
        else:
            result = train_crbm(x, cond, **_crbm_params(t), log=log)
        crbm_seconds = time.time() - t0
        encoded = encode_windows(sample, result.weights, n_history)
        k_scores = None
        if t.k_range:
            lo, hi = t.k_range
            k_scores = k_report(encoded, range(lo, hi + 1), t.seed)
            for k, sil, inertia in k_scores:
                log(f"train: k={k:2d} silhouette={sil:.3f} inertia={inertia:.1f}")
        h = encode(result.weights, x, cond)
        if t.kmeans_engine == "driver":  # the sample is here already: its activations are one matrix product
            centers = fit_centers_local(h, t.k, t.seed, restarts=t.kmeans_restarts)
        else:
            centers = fit_centers(encoded, t.k, t.seed, restarts=t.kmeans_restarts)
        sample.unpersist()
        span = windows.agg(F.min("ts").alias("lo"), F.max("ts").alias("hi"), F.countDistinct(POD_ID).alias("n")).first()
        info = {
            "trained_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "training_data": {
                "containers": int(span["n"]),
                "from": str(span["lo"]),
                "to": str(span["hi"]),
                "sampled_windows": len(x),
            },
            "crbm": {
                "epochs_run": result.epochs_run, "reconstruction_error": result.best_error,
                "epoch_errors": result.epoch_errors, "seconds": round(crbm_seconds, 2),
            },
            "params": self.get_params(),
            "versions": _versions(),
        }
        if k_scores is not None:
            info["k_report"] = [list(r) for r in k_scores]
        info["switch_gap"] = switch_gap(centers, h)  # the unit of label.switch_penalty over distances
        classifier = None
        if t.classifier_units > 0 and len(centers) > 1:
            classifier, info["classifier"] = distill_classifier(windows, result.weights, centers, info["switch_gap"], t)
            c = info["classifier"]
            log(f"train: phase classifier ({t.classifier_units} units) on {c['steps']} steps of {c['containers']} "
                f"training containers, agreeing with their offline phases at {c['agreement']:.1%} ({c['seconds']} s)")
        # names describe the sampled windows as the model labels them (by the classifier when it has one)
        info.update(describe_sampled_phases(scaler, result.weights, centers, x, cond, classifier))
        for p, text in info["phase_descriptions"].items():
            log(f"train: phase {p}: {text}")
        return PhaseModel(scaler, result.weights, centers, info=info, classifier=classifier)


def classifier_containers(windows: DataFrame, t: TrainConfig) -> tuple[list[str], bool]:
    """The training containers the phase classifier learns from, and whether it takes them whole: in hash order
    (the same on every run), those whose windows fit together in ``train.classifier_steps``; when none does, the
    first one alone, of which it takes the first windows. Benches that score phases on training containers leave
    these out, as the classifier has seen their offline phases."""
    sizes = (windows.groupBy(POD_ID).count().withColumn("_h", F.xxhash64(POD_ID, F.lit(int(t.seed))))
             .orderBy("_h", POD_ID).collect())
    chosen, steps = [], 0
    for r in sizes:
        if steps + int(r["count"]) <= t.classifier_steps:
            chosen.append(r[POD_ID])
            steps += int(r["count"])
    if not chosen and sizes:
        return [sizes[0][POD_ID]], False
    return chosen, True


def distill_classifier(windows: DataFrame, weights: Any, centers: np.ndarray, gap: float, t: TrainConfig
                       ) -> tuple[PhaseClassifier, dict[str, Any]]:
    """The phase classifier, fitted in the driver on whole training containers (in hash order, the same on every
    run, those that fit together in ``train.classifier_steps`` windows; when none does, the first one's first
    windows): their windows encoded in time order, each container decoded by Viterbi over the centres
    (:data:`~ai4dl.method.classifier.TARGET_PENALTY`: the offline phases, which know the steps after), and the
    classifier taught to give each step that phase from its activations alone (``gap``: the model's switch gap,
    :func:`~ai4dl.method.labelling.switch_gap`). Also what it learnt from."""
    t0 = time.time()
    chosen, whole = classifier_containers(windows, t)
    rows = windows.where(F.col(POD_ID).isin(chosen))
    if not whole:  # every container is longer than the cap: the first one's first windows
        rows = (windows.where(F.col(POD_ID) == chosen[0])
                .withColumn("_n", F.row_number().over(Window.partitionBy(POD_ID).orderBy("ts")))
                .where(F.col("_n") <= t.classifier_steps))
    n_vis, n_hist = weights.n_visible, weights.n_history
    pdf = rows.select(POD_ID, "ts", "features", "history").toPandas().sort_values([POD_ID, "ts"], kind="stable")
    if pdf.empty:
        raise InputError("no training windows with full history to fit the phase classifier on")
    h = encode(weights, stack_rows(pdf["features"], n_vis), stack_rows(pdf["history"], n_vis * n_hist))
    d2 = squared_distances(centers, h)
    penalty = TARGET_PENALTY * float(gap)
    pods = pdf[POD_ID].to_numpy()
    cuts = np.flatnonzero(pods[1:] != pods[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(pods)]
    targets = np.concatenate([led(viterbi(d2[a:b], penalty), t.classifier_lead)
                              for a, b in zip(bounds[:-1], bounds[1:])])
    classifier = fit_classifier(h, targets, len(centers), t.classifier_units, t.classifier_epochs, t.seed)
    agreement = float(np.mean(np.argmin(classifier.costs(h), axis=1) == targets))
    return classifier, {"units": t.classifier_units, "epochs": t.classifier_epochs, "containers": len(chosen),
                        "steps": len(targets), "targets": "viterbi", "target_penalty": penalty,
                        "target_lead": t.classifier_lead,
                        "agreement": round(agreement, 4), "seconds": round(time.time() - t0, 2)}


def led(phases: np.ndarray, lead: int) -> np.ndarray:
    """One container's phases moved ``lead`` steps earlier: step ``t`` gets the phase of step ``t + lead``, the
    last steps the last phase."""
    if lead <= 0 or not len(phases):
        return phases
    return np.concatenate([phases[lead:], np.repeat(phases[-1:], min(lead, len(phases)))])


def describe_sampled_phases(scaler: Scaler, weights: Any, centers: np.ndarray, x: np.ndarray,
                            cond: np.ndarray, classifier: PhaseClassifier | None = None) -> dict[str, Any]:
    """Names, descriptions and profile of the phases (:mod:`ai4dl.behaviour.naming`), from the CRBM's sampled
    training windows labelled by the fitted model: their raw features (the scaling undone) and, from the
    history's newest step, each window's previous step."""
    from ai4dl.behaviour.naming import name_phases
    from ai4dl.method.labelling import label_batch

    phases, _, _ = label_batch(weights, centers, {}, x, cond, classifier)
    mean, scale = np.asarray(scaler.mean), np.asarray(scaler.scale)
    n = len(scaler.features)
    raw = x * scale + mean
    before = cond[:, -n:] * scale + mean  # history is time-major, oldest first: its last block is t-1
    return name_phases(np.asarray(phases, dtype=float), raw, before, scaler.features)


def _crbm_params(t: TrainConfig) -> dict[str, Any]:
    return {
        "n_hidden": t.n_hidden, "cd_k": t.cd_k, "epochs": t.epochs, "batch_size": t.batch_size,
        "learning_rate": t.learning_rate, "patience": t.patience, "min_delta": t.min_delta, "seed": t.seed,
        "device": t.device,
    }


def _distributed_worker(x: np.ndarray, cond: np.ndarray, params: dict[str, Any]) -> dict[str, Any]:
    """One rank of data-parallel CD: its shard of the sample, parameters averaged after every epoch."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def average(model: Any, epoch_error: float) -> float:
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.data, op=dist.ReduceOp.SUM)
                p.data /= world
        err = torch.tensor([epoch_error], dtype=torch.float64)
        dist.all_reduce(err, op=dist.ReduceOp.SUM)
        return float(err.item() / world)

    result = train_crbm(x[rank::world], cond[rank::world], **params, log=None, epoch_sync=average)
    dist.destroy_process_group()
    return {"weights": result.weights.as_dict(), "errors": result.epoch_errors, "stopped": result.stopped_early, "device": result.device}


def train_distributed(x: np.ndarray, cond: np.ndarray, params: dict[str, Any], processes: int, log=print):
    """The CRBM trained with Spark's TorchDistributor (``train.distributor_processes`` > 1): data-parallel
    CD with parameter averaging each epoch, on the driver's cores in local mode, on executors otherwise."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from ai4dl.method.crbm import CRBMWeights, TrainResult

    t0 = time.time()
    spark = SparkSession.getActiveSession()
    local = spark is None or spark.sparkContext.master.startswith("local")
    out = TorchDistributor(num_processes=processes, local_mode=local, use_gpu=params["device"] == "cuda").run(
        _distributed_worker, x, cond, params
    )
    log(f"train: TorchDistributor, {processes} processes, {len(out['errors'])} epochs, rec_error {min(out['errors']):.6f}")
    return TrainResult(
        weights=CRBMWeights.from_dict(out["weights"]), epoch_errors=out["errors"], epochs_run=len(out["errors"]),
        stopped_early=out["stopped"], seconds=time.time() - t0, device=out["device"],
    )


def score(model: PhaseModel, held_out: DataFrame, engine: str = "arrow", decoding: str = "none",
          switch_penalty: float | None = None) -> dict[str, Any]:
    """Adjusted Rand index of the model's phases (decoded as ``label`` decodes them) vs ground truth on
    held-out windows (when the data has it)."""
    labelled = label_windows(held_out, model, engine=engine, decoding=decoding, switch_penalty=switch_penalty).where(F.col("behaviour").isNotNull())
    table, _, _ = contingency(labelled)
    if table.size == 0:
        return {}
    return {"holdout_ari": round(adjusted_rand_index(table), 4), "holdout_steps": int(table.sum())}


def refine(model: PhaseModel, training_windows: DataFrame, phase: int, k_sub: int, seed: int) -> PhaseModel:
    """Split one phase into ``k_sub`` sub-phases by a k-means on that phase's activations only.

    Sub-phase 0 keeps the parent's id, the others get new ids after the highest existing one; every other
    phase keeps its id and the steps nearest its centre (see :func:`ai4dl.method.labelling.assign`). A refined
    model labels each step by its nearest (sub-)centre: it has no phase classifier, whose phases it would split.
    """
    if phase not in range(model.k):
        raise ModelError(f"phase {phase} is not one of the model's top-level phases 0..{model.k - 1}")
    if phase in model.refinements:
        raise ModelError(f"phase {phase} is already refined")
    if k_sub < 2:
        raise ModelError("a refinement needs at least 2 sub-phases")
    # the parent's steps as assign() splits them later: nearest centre, not the classifier a refined model drops
    encoded = label_windows(training_windows, dataclasses.replace(model, classifier=None)).where(F.col("phase") == phase)
    sub = fit_centers(encoded, k_sub, seed)
    start = max(model.phase_ids) + 1
    ids = (phase, *range(start, start + k_sub - 1))
    refinements = {**model.refinements, phase: (sub, ids)}
    # sub-phases are assigned step by step (nearest sub-centre of the parent): no transition cost prices them
    info = {k: v for k, v in model.info.items() if k != "classifier"}  # a refined model has no classifier
    info.update(refined={str(phase): list(ids)}, decoding="none")
    return PhaseModel(model.scaler, model.crbm, model.centers, refinements, info)


def _versions() -> dict[str, str]:
    import pyspark
    import sklearn

    out = {"ai4dl": __version__, "pyspark": pyspark.__version__, "numpy": np.__version__, "scikit-learn": sklearn.__version__}
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


__all__ = ["PhaseEstimator", "classifier_containers", "distill_classifier", "refine", "score", "stratified_sample", "train_distributed"]
