"""The conformance harness's side of VPA (``shared/tools/vpa-reference/main.go``) without Go: a trace replayed
through the recommender as the harness drives it (:func:`recommend_trace`), the CSV files it reads and writes
(:func:`recommend_csv`, ``ai4dl vpa-recommend``) and its command-line flags (:func:`params_from_flags`)."""

from __future__ import annotations

import csv
import math
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from ai4dl.durations import parse_duration
from ai4dl.errors import InputError
from ai4dl.policies.vpa.histogram import (
    _resource_amount,
    _step_to_ns,
    _unix_seconds_to_ns,
)
from ai4dl.policies.vpa.recommender import (
    VpaParams,
    VpaRecommender,
    _usable,
)

#: Columns of :func:`recommend_trace` (one container).
OUTPUT_COLUMNS = ["timestamp", "sample_index", "cpu_target", "mem_target", "cpu_lower", "mem_lower", "cpu_upper", "mem_upper"]
#: Columns of the CSV written by :func:`recommend_csv` (and of the ``*.rec.csv`` vectors).
CSV_COLUMNS = ["pod_id", *OUTPUT_COLUMNS]
#: Columns of the input CSV of :func:`recommend_csv`.
INPUT_COLUMNS = ["pod_id", "timestamp_seconds", "cpu_cores_used", "memory_bytes_used"]


# --------------------------------------------------------------------------------------------------------
# Traces
# --------------------------------------------------------------------------------------------------------


def _as_float_array(name: str, values: Any) -> np.ndarray:
    try:
        arr = np.asarray(pd.to_numeric(pd.Series(values, dtype=object), errors="raise"), dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise InputError(f"recommend_trace: {name} must be numbers (missing samples as NaN/None): {exc}") from None
    if arr.ndim != 1:
        raise InputError(f"recommend_trace: {name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _trace_rows(ts: np.ndarray, cpu: np.ndarray, mem: np.ndarray, interval: int, params: VpaParams) -> tuple[list[tuple], int]:
    """The harness's loop for one container; ``ts`` etc. already in feeding order."""
    rec = VpaRecommender(params)
    step = params.step_seconds
    oom = params.oom_on_shortfall
    rows: list[tuple] = []
    nan = math.nan
    cur_mem = nan
    oom_in_interval = False
    ts_l, cpu_l, mem_l = ts.tolist(), cpu.tolist(), mem.tolist()
    for k in range(len(ts_l)):
        t_ns = _step_to_ns(k, step) if step > 0 else _unix_seconds_to_ns(ts_l[k])
        if k % interval == 0:
            oom_in_interval = False
            r = rec.recommend() if k > 0 else None
            if r is None:
                cur_mem = nan
                rows.append((ts_l[k], k, nan, nan, nan, nan, nan, nan))
            else:
                cur_mem = r.mem_target
                rows.append((ts_l[k], k, r.cpu_target, r.mem_target, r.cpu_lower, r.mem_lower, r.cpu_upper, r.mem_upper))
        c = _usable(cpu_l[k])
        if c is not None:
            rec._add_cpu(t_ns, c)
        m = _usable(mem_l[k])
        if oom and not oom_in_interval and m is not None and cur_mem == cur_mem and m > cur_mem:
            rec._record_oom(t_ns, cur_mem)
            oom_in_interval = True
        if m is not None:
            rec._add_memory(t_ns, _resource_amount(m), False)
    return rows, rec.oom_events


def _check_interval(interval: Any) -> int:
    if isinstance(interval, (bool, np.bool_)) or not isinstance(interval, (int, np.integer)) or interval < 1:
        raise InputError(f"interval={interval!r} is invalid: must be an integer >= 1 (samples per allocation interval)")
    return int(interval)


def recommend_trace(
    timestamps: Sequence[float] | np.ndarray,
    cpu: Sequence[float] | np.ndarray,
    mem: Sequence[float] | np.ndarray,
    interval: int = 10,
    params: VpaParams = VpaParams(),
) -> pd.DataFrame:
    """Replay one container's trace through VPA as the harness does, one row per allocation decision.

    Samples are sorted by timestamp (stable) and fed in that order; before sample k = 0, interval,
    2*interval, ... the recommendation given samples 0..k-1 is recorded (NaN at k = 0 and while no CPU sample
    has been accepted). CPU in cores, memory in bytes; NaN/None/negative values are missing samples. With
    ``params.oom_on_shortfall``, the first sample of an interval whose memory exceeds the memory target in
    force is reported as an OOM kill (``RecordOOM`` with that target as the request) before it is added.

    Returns a DataFrame with columns :data:`OUTPUT_COLUMNS`; ``df.attrs["oom_events"]`` counts OOM events.
    """
    interval = _check_interval(interval)
    if not isinstance(params, VpaParams):
        raise TypeError(f"params must be a VpaParams, got {type(params).__name__}")
    ts = _as_float_array("timestamps", timestamps)
    c = _as_float_array("cpu", cpu)
    m = _as_float_array("mem", mem)
    if not (len(ts) == len(c) == len(m)):
        raise InputError(f"recommend_trace: timestamps, cpu and mem differ in length ({len(ts)}, {len(c)}, {len(m)})")
    if len(ts) and not np.all(np.isfinite(ts)):
        bad = int(np.flatnonzero(~np.isfinite(ts))[0])
        raise InputError(f"recommend_trace: timestamps[{bad}] = {ts[bad]!r} is not a finite number of seconds")
    order = np.argsort(ts, kind="stable")
    rows, ooms = _trace_rows(ts[order], c[order], m[order], interval, params)
    df = pd.DataFrame(rows, columns=OUTPUT_COLUMNS)
    df["sample_index"] = df["sample_index"].astype(np.int64)
    df.attrs["oom_events"] = ooms
    return df


# --------------------------------------------------------------------------------------------------------
# CSV in / out
# --------------------------------------------------------------------------------------------------------

_ALIASES = {
    "pod_id": ("pod_id", "pod.id"),
    "timestamp_seconds": ("timestamp_seconds", "timestamp", "ts"),
    "cpu_cores_used": ("cpu_cores_used", "cpu.usage.cores", "cpu_usage_cores"),
    "memory_bytes_used": ("memory_bytes_used", "mem.current", "mem_current"),
}


def _fmt_g(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'g', -1, 64)``; empty for NaN."""
    if v != v:
        return ""
    if v == 0:
        return "0"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    sign, digits, exp = _shortest_digits(v)
    x = len(digits) - 1 + exp
    if x < -4 or x >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    return sign + _fixed(digits, exp)


def _fmt_f(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``."""
    if v == 0:
        return "0"
    sign, digits, exp = _shortest_digits(v)
    return sign + _fixed(digits, exp)


def _shortest_digits(v: float) -> tuple[str, str, int]:
    s = repr(abs(v))
    mant, _, e = s.partition("e")
    exp = int(e) if e else 0
    ip, _, fp = mant.partition(".")
    digits = (ip + fp).lstrip("0")
    exp -= len(fp)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    return ("-" if v < 0 else ""), stripped or "0", exp


def _fixed(digits: str, exp: int) -> str:
    if exp >= 0:
        return digits + "0" * exp
    point = len(digits) + exp
    if point > 0:
        return digits[:point] + "." + digits[point:]
    return "0." + "0" * (-point) + digits


def _read_traces(path: Path) -> tuple[dict[str, list[tuple[float, float, float]]], list[str]]:
    fix_cols = "the header must name pod_id,timestamp_seconds,cpu_cores_used,memory_bytes_used"
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot open the input CSV ({exc.strerror}); check the path") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise InputError(f"{path}: line 1: the file is empty; {fix_cols}") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: line 1: not a readable CSV header ({exc}); {fix_cols}") from None
        names = [h.strip().strip('"') for h in header]
        idx: dict[str, int] = {}
        for canon, aliases in _ALIASES.items():
            for i, h in enumerate(names):
                if h in aliases:
                    idx[canon] = i
                    break
        missing = [c for c in INPUT_COLUMNS if c not in idx]
        if missing:
            raise InputError(
                f"{path}: line 1: header {names} lacks column(s) {', '.join(missing)}; {fix_cols} "
                "(one row per sample: container id, Unix seconds, cores used, bytes used)"
            )
        pods: dict[str, list[tuple[float, float, float]]] = {}
        order: list[str] = []
        shift = 0
        first = True
        try:
            for rec in reader:
                line = reader.line_num
                if not rec or (len(rec) == 1 and not rec[0].strip()):
                    continue  # blank line
                if first and len(rec) == len(header) + 1:
                    shift = 1  # unnamed leading index column (pandas to_csv)
                first = False
                need = max(idx.values()) + shift
                if len(rec) <= need:
                    raise InputError(
                        f"{path}: line {line}: {len(rec)} field(s), expected {len(header) + shift}; "
                        "every row needs a value (possibly empty for a missing sample) in every column"
                    )
                get = lambda c: rec[idx[c] + shift].strip()  # noqa: E731
                pod = get("pod_id")
                ts = _parse_number(path, line, "timestamp_seconds", get("timestamp_seconds"), required=True)
                cpu = _parse_number(path, line, "cpu_cores_used", get("cpu_cores_used"), required=False)
                mem = _parse_number(path, line, "memory_bytes_used", get("memory_bytes_used"), required=False)
                if pod not in pods:
                    pods[pod] = []
                    order.append(pod)
                pods[pod].append((ts, cpu, mem))
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: line {reader.line_num}: malformed CSV ({exc}); fix the quoting/encoding of that row") from None
    return pods, order


def _parse_number(path: Path, line: int, column: str, text: str, required: bool) -> float:
    if text == "" and not required:
        return math.nan  # missing sample
    try:
        if "_" in text:
            raise InputError(text)
        v = float(text)
    except ValueError:
        fix = "give Unix seconds as a number" if required else "give a number, or leave the cell empty for a missing sample"
        raise InputError(f"{path}: line {line}, column {column}: {text!r} is not a number; {fix}") from None
    if required and not math.isfinite(v):
        raise InputError(f"{path}: line {line}, column {column}: {text!r} is not a finite timestamp; give Unix seconds")
    return v


def recommend_csv(
    input_path: str | Path,
    output_path: str | Path | None,
    interval: int = 10,
    params: VpaParams = VpaParams(),
) -> pd.DataFrame:
    """Recommendations for every container of a CSV ``pod_id,timestamp_seconds,cpu_cores_used,memory_bytes_used``.

    Containers are processed in order of first appearance, each one's samples sorted by timestamp (stable).
    Writes ``pod_id,timestamp,sample_index,cpu_target,mem_target,cpu_lower,mem_lower,cpu_upper,mem_upper``
    formatted like the harness (Go's shortest float formatting; empty fields where VPA gives nothing) to
    ``output_path`` (skipped if None) and returns the same table as a DataFrame.

    Empty, NaN or negative usage cells are missing samples (the harness reads them the same way); any other
    non-numeric cell, an unparsable timestamp or a missing column is an InputError naming file, line, column.
    The DLaaS column names (``timestamp``, ``pod.id``, ``cpu.usage.cores``, ``mem.current``) are accepted too.
    """
    interval = _check_interval(interval)
    if not isinstance(params, VpaParams):
        raise TypeError(f"params must be a VpaParams, got {type(params).__name__}")
    path = Path(input_path)
    pods, order = _read_traces(path)
    out_rows: list[tuple] = []
    ooms = 0
    for pod in order:
        samples = sorted(pods[pod], key=lambda s: s[0])  # stable, like sort.SliceStable
        arr = np.asarray(samples, dtype=np.float64).reshape(-1, 3)
        rows, n = _trace_rows(arr[:, 0], arr[:, 1], arr[:, 2], interval, params)
        ooms += n
        out_rows.extend((pod, *r) for r in rows)
    df = pd.DataFrame(out_rows, columns=CSV_COLUMNS)
    df["sample_index"] = df["sample_index"].astype(np.int64)
    df.attrs["oom_events"] = ooms
    if output_path is not None:
        lines = [",".join(CSV_COLUMNS)]
        for pod, ts, k, *vals in out_rows:
            lines.append(",".join([pod, _fmt_f(ts), str(k), *(_fmt_g(v) for v in vals)]))
        Path(output_path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return df


# --------------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------------

# flag name -> (VpaParams field, kind); harness names first, then VPA recommender's own flag names.
_FLAGS: dict[str, tuple[str, str]] = {
    "step-seconds": ("step_seconds", "float"),
    "cpu-half-life": ("cpu_half_life_s", "duration"),
    "mem-half-life": ("memory_half_life_s", "duration"),
    "mem-interval": ("memory_aggregation_interval_s", "duration"),
    "mem-interval-count": ("memory_aggregation_interval_count", "int"),
    "margin": ("safety_margin_fraction", "float"),
    "min-cpu-millicores": ("pod_min_cpu_millicores", "float"),
    "min-mem-mb": ("pod_min_memory_mb", "float"),
    "target-cpu-percentile": ("target_cpu_percentile", "float"),
    "target-mem-percentile": ("target_memory_percentile", "float"),
    "confidence-interval-cpu": ("confidence_interval_cpu_s", "duration"),
    "confidence-interval-mem": ("confidence_interval_memory_s", "duration"),
    "oom-on-shortfall": ("oom_on_shortfall", "bool"),
    # VPA recommender flag names (aliases)
    "cpu-histogram-decay-half-life": ("cpu_half_life_s", "duration"),
    "memory-histogram-decay-half-life": ("memory_half_life_s", "duration"),
    "memory-aggregation-interval": ("memory_aggregation_interval_s", "duration"),
    "memory-aggregation-interval-count": ("memory_aggregation_interval_count", "int"),
    "recommendation-margin-fraction": ("safety_margin_fraction", "float"),
    "pod-recommendation-min-cpu-millicores": ("pod_min_cpu_millicores", "float"),
    "pod-recommendation-min-memory-mb": ("pod_min_memory_mb", "float"),
    "target-memory-percentile": ("target_memory_percentile", "float"),
    "recommendation-lower-bound-cpu-percentile": ("lower_bound_cpu_percentile", "float"),
    "recommendation-upper-bound-cpu-percentile": ("upper_bound_cpu_percentile", "float"),
    "recommendation-lower-bound-memory-percentile": ("lower_bound_memory_percentile", "float"),
    "recommendation-upper-bound-memory-percentile": ("upper_bound_memory_percentile", "float"),
    "confidence-interval-memory": ("confidence_interval_memory_s", "duration"),
    "oom-bump-up-ratio": ("oom_bump_up_ratio", "float"),
    "oom-min-bump-up-bytes": ("oom_min_bump_up_bytes", "float"),
}
_BOOL_TEXT = {"1": True, "t": True, "T": True, "true": True, "TRUE": True, "True": True,
              "0": False, "f": False, "F": False, "false": False, "FALSE": False, "False": False}


def params_from_flags(argv: Iterable[str], base: VpaParams | None = None) -> VpaParams:
    """VpaParams from the harness's flags (``-step-seconds 10 -cpu-half-life 1200s -mem-half-life 1200s
    -mem-interval 1200s -min-cpu-millicores 0 -min-mem-mb 0 -oom-on-shortfall`` ...), single or double dash,
    ``-flag value`` or ``-flag=value``; the last occurrence wins (as Go's flag package). Durations are Go
    durations (``24h``, ``20m``, ``10s``). VPA's own recommender flag names are accepted as aliases.
    ``-interval`` is not a VPA parameter: pass it to :func:`recommend_trace` / the CLI's ``--interval``.
    """
    args = list(argv)
    values: dict[str, Any] = {}
    i = 0
    known = ", ".join("-" + k for k in _FLAGS)
    while i < len(args):
        tok = args[i]
        if not isinstance(tok, str) or not tok.startswith("-") or tok in ("-", "--"):
            raise InputError(f"unexpected argument {tok!r}: VPA flags look like -name value or -name=value")
        name, eq, inline = tok.lstrip("-").partition("=")
        if name == "interval":
            raise InputError("-interval is not a VPA parameter: pass it as recommend_trace(interval=...) / the CLI's --interval")
        if name not in _FLAGS:
            raise InputError(f"unknown VPA flag {tok!r}; known flags: {known}")
        field_name, kind = _FLAGS[name]
        if kind == "bool":
            if eq:
                if inline not in _BOOL_TEXT:
                    raise InputError(f"flag -{name}: {inline!r} is not a boolean (use -{name} or -{name}=false)")
                values[field_name] = _BOOL_TEXT[inline]
            else:
                values[field_name] = True
            i += 1
            continue
        if eq:
            text = inline
            i += 1
        else:
            if i + 1 >= len(args):
                raise InputError(f"flag -{name} needs a value")
            text = args[i + 1]
            i += 2
        try:
            if kind == "duration":
                values[field_name] = parse_duration(text)
            elif kind == "int":
                values[field_name] = int(text.strip())
            else:
                v = float(text.strip())
                values[field_name] = v
        except ValueError as exc:
            what = {"duration": "a duration such as 24h, 20m or 1200s", "int": "an integer", "float": "a number"}[kind]
            raise InputError(f"flag -{name}: invalid value {text!r}, expected {what} ({exc})") from None
    base = base if base is not None else VpaParams()
    kwargs = {f.name: getattr(base, f.name) for f in fields(base)}
    kwargs.update(values)
    return VpaParams(**kwargs)
