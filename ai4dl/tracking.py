"""MLflow tracking of ``ai4dl train`` (``mlflow.enabled``): parameters, metrics, the report's plots, the model.

Databricks users and most ML teams keep their runs in MLflow; a training run logged there can be compared,
reproduced and served without ai4dl's own folders. One MLflow run per ``train`` stage run:

- parameters: the ``train`` and ``window`` sections the model was fitted with, the model id and directory;
- metrics: the CRBM's reconstruction error (best, and per epoch as a series), the epochs run, the held-out
  adjusted Rand index when the data has ground truth (``behaviour``), the k report (silhouette and inertia
  per k, ``step`` = k) when ``train.k_range`` is set;
- artifacts: ``train_report.json`` and the plots training wrote, under ``report/``;
- the model as an MLflow pyfunc model (:mod:`ai4dl.method.pyfunc`) whose ``predict`` labels raw traces.

MLflow is optional (``pip install 'ai4dl[mlflow]'``) and imported only here, only when enabled; enabled
without it installed is one :class:`~ai4dl.errors.ConfigError` line before training starts.

The default tracking URI is a local folder under the lake (``<lake.root>/_mlflow``), MLflow's file store:
MLflow 3 keeps that backend in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is set,
which ai4dl sets for ``file:`` URIs only. Point ``mlflow.tracking_uri`` at a tracking server (or Databricks)
for anything shared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ai4dl.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ai4dl.config import Config
    from ai4dl.method.model import PhaseModel

MODEL_NAME = "model"  # the pyfunc model's name (artifact path) in the run


def require_mlflow() -> Any:
    """The mlflow module, or one line saying how to get it."""
    try:
        import mlflow
    except ImportError:
        raise ConfigError("mlflow.enabled is true but MLflow is not installed: pip install 'ai4dl[mlflow]' "
                          "(or set mlflow.enabled=false)") from None
    return mlflow


def tracking_uri(cfg: Config) -> str:
    """``mlflow.tracking_uri``, or the file store ``<lake.root>/_mlflow`` for a local lake."""
    from ai4dl.lake.tables import is_uri

    if cfg.mlflow.tracking_uri:
        return cfg.mlflow.tracking_uri
    if is_uri(cfg.lake.root) and not cfg.lake.root.startswith("file:"):
        raise ConfigError(f"mlflow.tracking_uri: needed when lake.root is not a local folder ({cfg.lake.root})")
    root = cfg.lake.root[len("file:"):] if cfg.lake.root.startswith("file:") else cfg.lake.root
    return (Path(root).absolute() / "_mlflow").as_uri()


def _use(mlflow: Any, uri: str) -> None:
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(uri)


def params(cfg: Config, model: PhaseModel, model_path: str) -> dict[str, Any]:
    """Flat MLflow parameters: what the model was fitted with."""
    out: dict[str, Any] = {f"train.{k}": v for k, v in dataclasses.asdict(cfg.train).items()}
    w = cfg.window
    out.update({
        "window.features": ",".join(w.features), "window.n_history": w.n_history, "window.train_fraction": w.train_fraction,
        "window.split_seed": w.split_seed, "window.max_gap_seconds": w.max_gap_seconds,
        "model_id": model.model_id, "model_path": model_path,
    })
    return out


def metrics(model: PhaseModel, report: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(name, value, step) of every metric of a training run."""
    crbm = model.info.get("crbm", {})
    out: list[tuple[str, float, int]] = []
    if crbm.get("reconstruction_error") is not None:
        out.append(("crbm_reconstruction_error", float(crbm["reconstruction_error"]), 0))
    for epoch, err in enumerate(crbm.get("epoch_errors") or []):
        out.append(("crbm_epoch_error", float(err), epoch))
    for key, name in (("crbm_epochs", "crbm_epochs"), ("crbm_windows", "crbm_sampled_windows"), ("crbm_seconds", "crbm_seconds"),
                      ("holdout_ari", "holdout_ari"), ("holdout_steps", "holdout_steps")):
        if report.get(key) is not None:
            out.append((name, float(report[key]), 0))
    for k, silhouette, inertia in report.get("k_report") or []:
        out.append(("k_silhouette", float(silhouette), int(k)))
        out.append(("k_inertia", float(inertia), int(k)))
    return out


def log_pyfunc(mlflow: Any, model_path: str, max_gap_seconds: float | None, decoding: str = "none",
               switch_penalty: float | None = None) -> Any:
    """Log the model directory as a pyfunc model of the active run; returns MLflow's ModelInfo."""
    import mlflow.pyfunc

    from ai4dl import __version__
    from ai4dl.method import pyfunc

    with tempfile.TemporaryDirectory() as tmp:
        serving = Path(tmp) / "serving.json"
        serving.write_text(json.dumps({"max_gap_seconds": max_gap_seconds, "decoding": decoding,
                                       "switch_penalty": switch_penalty}))
        artifacts = {pyfunc.MODEL_ARTIFACT: str(model_path), pyfunc.SERVING_ARTIFACT: str(serving)}
        # pip requirements given, not inferred: inference would load the model in a subprocess.
        requirements = [f"ai4dl=={__version__}", "numpy", "pandas", "safetensors"]
        kwargs: dict[str, Any] = {"python_model": pyfunc.__file__, "artifacts": artifacts, "pip_requirements": requirements}
        import inspect

        name_arg = "name" if "name" in inspect.signature(mlflow.pyfunc.log_model).parameters else "artifact_path"
        return mlflow.pyfunc.log_model(**{name_arg: MODEL_NAME}, **kwargs)


def log_training(cfg: Config, model: PhaseModel, model_path: str, report: dict[str, Any],
                 artifacts: Iterable[Path], run_name: str | None = None) -> dict[str, str]:
    """One MLflow run of a training: returns ``{"run_id", "model_uri", "tracking_uri", "experiment"}``."""
    mlflow = require_mlflow()
    uri = tracking_uri(cfg)
    _use(mlflow, uri)
    mlflow.set_experiment(cfg.mlflow.experiment)
    from ai4dl import __version__
    from ai4dl.method.labelling import resolve_decoding

    with mlflow.start_run(run_name=run_name) as run:
        mlflow.set_tags({"ai4dl.version": __version__, "ai4dl.model_id": model.model_id, "ai4dl.config_digest": cfg.digest})
        mlflow.log_params(params(cfg, model, model_path))
        for name, value, step in metrics(model, report):
            mlflow.log_metric(name, value, step=step)
        for path in artifacts:
            if Path(path).is_file():
                mlflow.log_artifact(str(path), artifact_path="report")
        # the label stage's decoding and price, resolved against this model: the served model keeps them pinned
        decoding, multiplier = resolve_decoding(model, cfg.label.smoothing, cfg.label.penalty)
        info = log_pyfunc(mlflow, model_path, cfg.window.max_gap_seconds, decoding, multiplier)
    return {"run_id": run.info.run_id, "model_uri": info.model_uri, "tracking_uri": uri, "experiment": cfg.mlflow.experiment}


def log_policies(cfg: Config, model: Any, model_path: str, table: Any, run_name: str | None = None) -> dict[str, str]:
    """One MLflow run of a fitted policy model (``ai4dl policies`` with ``mlflow.enabled``): the calibrated knob
    of every policy and resource and the service level as parameters, the held-out comparison (``table``, the
    gold ``policy_calibration`` rows) as metrics, the model directory as artifacts. Returns ``{"run_id",
    "tracking_uri", "experiment"}``."""
    mlflow = require_mlflow()
    uri = tracking_uri(cfg)
    _use(mlflow, uri)
    mlflow.set_experiment(cfg.mlflow.experiment)
    from ai4dl import __version__

    values: dict[str, Any] = {f"service_level.{k}": v for k, v in model.level.as_dict().items()}
    values.update({f"knob.{policy}.{resource}": v for (policy, resource), v in model.knob_table().items()})
    values.update({f"deployed.{r}": p for r, p in model.best.items()})
    values.update({"policy_model_id": model.model_id, "phase_model_id": model.phase_model_id, "model_path": model_path})
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.set_tags({"ai4dl.version": __version__, "ai4dl.policy_model_id": model.model_id,
                         "ai4dl.phase_model_id": str(model.phase_model_id), "ai4dl.config_digest": cfg.digest})
        mlflow.log_params(values)
        for r in table.itertuples(index=False):
            for metric in ("savings_vs_static", "fulfilment", "oom_kills_per_100h", "throttled_core_seconds"):
                value = getattr(r, metric)
                if value is not None and value == value:
                    mlflow.log_metric(f"{r.policy}.{r.resource}.{metric}", float(value))
        mlflow.log_artifacts(str(model_path), artifact_path="policy_model")
    return {"run_id": run.info.run_id, "tracking_uri": uri, "experiment": cfg.mlflow.experiment}


__all__ = ["log_policies", "log_pyfunc", "log_training", "metrics", "params", "require_mlflow", "tracking_uri"]
