"""Job configuration: built-in defaults, overlaid by a YAML file under ``conf/``, overlaid by ``--set key=value``.

Every key a job reads has a default here, so a bare ``ai4dl demo`` runs; an unknown key in a file or on the
command line is an error rather than a silently ignored typo.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from ai4dl.schema import DEFAULT_FEATURES

DEFAULTS: dict[str, Any] = {
    "spark": {
        "master": "local[*]",
        "app_name": "ai4dl",
        "shuffle_partitions": 8,
        "arrow": True,
        # Rows per Arrow batch handed to the encoding UDF: one matrix product per batch.
        "arrow_max_records_per_batch": 20000,
        "driver_memory": "4g",
        # Ivy cache for the Delta JARs; relative paths are under the working directory.
        "ivy_cache": ".cache/ivy",
        "conf": {},
    },
    "lake": {
        "root": "data/lake",
        "models": "data/models",
    },
    "ingest": {
        "input": None,
        "format": "csv",  # csv | parquet | delta
        "delimiter": ",",
        "columns": {},  # source column -> lake column, for exports with other names
        # A usage above limit x this factor is a broken sample, not a burst.
        "max_usage_factor": 10.0,
    },
    "generate": {
        "containers": 120,
        "steps": 400,
        "seed": 7,
        "services": 4,
        "start": 1_700_000_000,  # epoch seconds of the first sample
        "interval_seconds": 30,
        "partitions": 0,  # 0: two per core
    },
    "window": {
        "features": list(DEFAULT_FEATURES),
        "n_history": 3,
        "train_fraction": 0.8,
        "split_seed": 42,
        # A gap between two samples longer than this starts a new segment whose first steps lack history.
        "max_gap_seconds": None,
        # Use this model's scaler instead of fitting one (e.g. an imported reference model).
        "scaler_from_model": None,
    },
    "train": {
        "n_hidden": 10,
        "k": 5,
        "cd_k": 1,
        "epochs": 60,
        "batch_size": 128,
        "learning_rate": 0.05,
        "patience": 5,
        "min_delta": 1e-4,
        "sample_size": 100_000,
        "max_per_container": 2_000,
        "seed": 1234,
        "device": "auto",  # auto | cpu | cuda
        # > 1: train the CRBM data-parallel with Spark's TorchDistributor on this many processes.
        "distributor_processes": 0,
        "k_range": None,  # e.g. [3, 8]: print silhouette and inertia for each k
        "model_name": "ai4dl",
    },
    "label": {
        "model": None,  # model directory; default: latest version under lake.models/<train.model_name>
        "engine": "arrow",  # arrow (mapInArrow) | pandas (mapInPandas): see ai4dl.labelling
    },
    "behaviour": {
        # Runs shorter than this are absorbed by a neighbour: single-step flickers are noise, not phases.
        "min_run_steps": 3,
        "top_prototypes": 5,
        # Prototypes and the prefix tree use the first runs of each life (whole lives rarely repeat exactly).
        "prototype_depth": 4,
    },
    "policies": {
        "interval_steps": 10,
        "k_std": 2.0,
        "margin": 0.15,
        "vpa_percentile": 0.9,
        # phase.rule: a phase's quantile of usage, as a share of the container's limit (fraction) or absolute.
        "phase_statistic": "fraction",
        "phase_quantile": 0.95,
        "vpa_half_life_steps": 120,
    },
    "report": {
        "dir": "data/report",
    },
}


class ConfigError(ValueError):
    """A configuration file or override that does not fit the known keys."""


def _merge(base: dict, extra: dict, path: str = "") -> dict:
    for key, value in extra.items():
        where = f"{path}{key}"
        if key not in base:
            raise ConfigError(f"unknown config key '{where}' (known: {', '.join(sorted(base))})")
        if isinstance(base[key], dict) and key != "conf" and key != "columns":
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{where}' must be a mapping, got {value!r}")
            _merge(base[key], value, where + ".")
        elif isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{where}' must be a mapping, got {value!r}")
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not of the form key.path=value")
    key, raw = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Defaults, then the YAML file at ``path``, then each ``a.b=value`` override (values parsed as YAML)."""
    cfg = copy.deepcopy(DEFAULTS)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p} must hold a mapping at top level")
        _merge(cfg, data)
    for item in overrides or []:
        keys, value = _parse_override(item)
        nested: dict[str, Any] = value
        for k in reversed(keys):
            nested = {k: nested}
        _merge(cfg, nested)
    return cfg


def config_hash(cfg: dict[str, Any]) -> str:
    """Short stable digest of a configuration, recorded with what a job wrote."""
    blob = json.dumps(cfg, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
