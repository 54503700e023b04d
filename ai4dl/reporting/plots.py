"""PNG charts of the run report: a trace coloured by phase, per-phase box plots, policy curves, savings.

Every function is pure: it takes small pandas / numpy inputs already on the driver, draws on its own
:class:`matplotlib.figure.Figure` with the Agg canvas (matplotlib's global ``pyplot`` state and backend are never
touched, so the functions are safe in a Spark driver, a thread pool or a test run), writes one PNG and returns
its :class:`~pathlib.Path` (parent directories are created).

Inputs follow :data:`ai4dl.schema.PHASES` (``pod_id``, ``service``, ``ts``, ``step``, ``phase``,
``cpu_usage_cores``, ``cpu_num_cores``, ``mem_current``, ``mem_limit``) and :func:`ai4dl.policies.summarise`.
Memory is drawn in GiB (``bytes / 2**30``). A null phase is drawn grey and labelled ``none``.

The transition graph and the prototype tree are drawn by :func:`ai4dl.behaviour.draw_graph`.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib import dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ai4dl.behaviour.graph import ROOT_PHASE
from ai4dl.config import POLICIES, PoliciesConfig
from ai4dl.policies.replay import allocate, replay_frame, timestamps_seconds
from ai4dl.policies.rules import RESOURCES

GIB = float(2**30)
DPI = 110

# ------------------------------------------------------------------------------------------------ palettes

_TAB10 = [colormaps["tab10"](i) for i in range(10)]
_TAB20 = [colormaps["tab20"](i) for i in range(20)]
NULL_PHASE_COLOUR = "#b3b3b3"


def _to_hex(rgba: Sequence[float]) -> str:
    r, g, b = (int(round(255 * c)) for c in rgba[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


# tab10 without its grey (index 7, kept for the null phase), then the light tab20 partners of those nine.
_PHASE_CYCLE: tuple[str, ...] = tuple(
    [_to_hex(c) for i, c in enumerate(_TAB10) if i != 7]
    + [_to_hex(_TAB20[2 * i + 1]) for i in range(10) if i != 7]
)

PHASE_COLOURS: dict[int | None, str] = {i: c for i, c in enumerate(_PHASE_CYCLE)}
"""Phase id -> colour: tab10 (its grey left out) then tab20's light partners, 18 phases; ``None`` is grey.

Phases beyond the table reuse it cyclically (:func:`phase_colour`), so a phase id always maps to one colour."""
PHASE_COLOURS[None] = NULL_PHASE_COLOUR

POLICY_COLOURS: dict[str, str] = {
    "static": "#000000",
    "current.step.max": _to_hex(_TAB10[0]),
    "current.step.rules": _to_hex(_TAB10[9]),
    "prev.step.max": _to_hex(_TAB10[1]),
    "prev.step.rules": _to_hex(_TAB10[8]),
    "phase.rule": _to_hex(_TAB10[3]),
    "phase.proactive": _to_hex(_TAB10[6]),
    "phase.headroom": _to_hex(_TAB10[2]),
    "forecast": _to_hex(_TAB10[7]),
    "phase.forecast": _to_hex(_TAB10[5]),
    "vpa": _to_hex(_TAB10[4]),
}
"""Policy -> colour, shared by :func:`plot_policy_curves` and :func:`plot_savings`."""

RESOURCE_LABELS = {"cpu": "CPU", "mem": "memory"}


def _is_null(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def phase_colour(phase: Any) -> str:
    """Colour of a phase id (``None``/NaN -> grey); ids past the palette wrap around it."""
    if _is_null(phase):
        return NULL_PHASE_COLOUR
    return _PHASE_CYCLE[int(phase) % len(_PHASE_CYCLE)]


def policy_colour(policy: str) -> str:
    return POLICY_COLOURS.get(policy, "#555555")


def _phase_label(phase: Any) -> str:
    return "none" if _is_null(phase) else str(int(phase))


# ------------------------------------------------------------------------------------------------ helpers


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, png_path: str | Path) -> Path:
    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png")
    return png


def _empty(png_path: str | Path, title: str, message: str = "(no data)") -> Path:
    fig = _figure(6, 3)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="#666666")
    return _save(fig, png_path)


def _numeric(series: pd.Series | None, n: int) -> np.ndarray:
    if series is None:
        return np.full(n, np.nan)
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)


def _phase_codes(series: pd.Series | None, n: int) -> np.ndarray:
    """Phases as float (NaN = null), whatever the input dtype (Int32, object with None, float)."""
    if series is None:
        return np.full(n, np.nan)
    return pd.to_numeric(pd.Series(series, dtype="object"), errors="coerce").astype("float64").to_numpy()


def _runs(codes: np.ndarray) -> list[tuple[float, int, int]]:
    """Runs of equal value in ``codes`` (NaN equal to NaN): ``[(value, first_index, last_index), ...]``."""
    if len(codes) == 0:
        return []
    same = (codes[1:] == codes[:-1]) | (np.isnan(codes[1:]) & np.isnan(codes[:-1]))
    starts = np.concatenate([[0], np.flatnonzero(~same) + 1])
    ends = np.concatenate([starts[1:] - 1, [len(codes) - 1]])
    return [(codes[s], int(s), int(e)) for s, e in zip(starts, ends)]


def _phase_bands(ax: Any, x: np.ndarray, codes: np.ndarray, y0: float = 0.0, height: float = 1.0,
                 alpha: float = 0.28) -> list[Any]:
    """Shade the x-extent of every phase run (one ``broken_barh`` per phase, axes-fraction y); returns the keys.

    A run spans from its first sample to the next run's first sample (the last run to one median step past its
    last sample), so consecutive bands tile the axis without gaps.
    """
    if len(x) == 0:
        return []
    step = float(np.median(np.diff(x))) if len(x) > 1 else 1.0
    edges = np.append(x, x[-1] + (step if step > 0 else 1.0))
    spans: dict[Any, list[tuple[float, float]]] = {}
    for value, first, last in _runs(codes):
        key = None if np.isnan(value) else int(value)
        spans.setdefault(key, []).append((float(edges[first]), float(edges[last + 1] - edges[first])))
    for key, xr in spans.items():
        ax.broken_barh(xr, (y0, height), transform=ax.get_xaxis_transform(), facecolors=phase_colour(key),
                       alpha=alpha, linewidth=0, zorder=0)
    return sorted(spans, key=lambda k: (k is None, k if k is not None else 0))


def _phase_keys(codes: np.ndarray) -> list[Any]:
    """Distinct phases of ``codes`` in order, ``None`` (null) last."""
    keys: list[Any] = sorted({int(c) for c in codes[~np.isnan(codes)]})
    return keys + ([None] if np.isnan(codes).any() else [])


def _phase_handles(keys: Sequence[Any], counts: Mapping[Any, int] | None = None,
                   names: Mapping[int, str] | None = None) -> list[Patch]:
    handles = []
    for k in keys:
        label = "no phase" if k is None else f"{int(k)}: {names[int(k)]}" if names and int(k) in names else f"phase {int(k)}"
        if counts is not None and k in counts:
            label += f" ({counts[k]})"
        handles.append(Patch(facecolor=phase_colour(k), alpha=0.6, label=label))
    return handles


def _sorted_trace(pdf: pd.DataFrame) -> pd.DataFrame:
    df = pdf.sort_values("step", kind="stable") if "step" in pdf.columns else pdf
    return df.reset_index(drop=True)


def _time_axis(df: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """x values: matplotlib date numbers of ``ts`` when every ts is known, else the ``step`` numbers."""
    if "ts" in df.columns:
        ts = pd.to_datetime(df["ts"], errors="coerce")
        if len(ts) and ts.notna().all():
            if getattr(ts.dt, "tz", None) is not None:
                ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
            return mdates.date2num(ts.to_numpy()), True
    if "step" in df.columns:
        return pd.to_numeric(df["step"], errors="coerce").to_numpy(dtype=float), False
    return np.arange(len(df), dtype=float), False


def _container_title(df: pd.DataFrame) -> str:
    pod = str(df["pod_id"].iloc[0]) if "pod_id" in df.columns and len(df) else "container"
    if "service" in df.columns and df["service"].notna().any():
        return f"{pod} ({df['service'].dropna().iloc[0]})"
    return pod


# ------------------------------------------------------------------------------------------------ plots


def plot_trace_phases(pdf: pd.DataFrame, png_path: str | Path, title: str | None = None,
                      names: Mapping[int, str] | None = None) -> Path:
    """One container's trace coloured by phase: CPU cores (top) and memory GiB (bottom) over time.

    ``pdf`` holds one container's ``PHASES`` rows (any order; sorted by ``step`` here). Usage is the dark line,
    the limit (``cpu_num_cores`` / ``mem_limit``) dashed red; the background of both panels is shaded by phase
    run (grey where the phase is null, e.g. before the history window is full). The x axis is ``ts`` (falls back
    to ``step`` when a timestamp is missing). The legend lists the phases (by ``names`` when given) with their
    step counts.
    """
    df = _sorted_trace(pdf)
    heading = title or _container_title(df)
    if df.empty:
        return _empty(png_path, heading)
    n = len(df)
    x, is_time = _time_axis(df)
    codes = _phase_codes(df.get("phase"), n)
    panels = [
        ("CPU cores", _numeric(df.get("cpu_usage_cores"), n), _numeric(df.get("cpu_num_cores"), n)),
        ("memory (GiB)", _numeric(df.get("mem_current"), n) / GIB, _numeric(df.get("mem_limit"), n) / GIB),
    ]
    fig = _figure(11, 6)
    axes = fig.subplots(2, 1, sharex=True)
    keys: list[Any] = []
    for ax, (label, usage, limit) in zip(axes, panels):
        keys = _phase_bands(ax, x, codes)
        ax.plot(x, usage, color="#1f1f1f", linewidth=1.0, label="usage", zorder=3)
        if np.isfinite(limit).any():
            ax.plot(x, limit, color="#d62728", linestyle="--", linewidth=1.3, label="limit", zorder=4)
        ax.set_ylabel(label)
        top = np.nanmax(np.concatenate([usage, limit])) if np.isfinite(np.concatenate([usage, limit])).any() else 1
        ax.set_ylim(0, float(top) * 1.08 if top > 0 else 1.0)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_title(heading)
    if is_time:
        locator = mdates.AutoDateLocator()
        axes[1].xaxis.set_major_locator(locator)
        axes[1].xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        axes[1].set_xlabel("time (ts)")
    else:
        axes[1].set_xlabel("step")
    axes[1].set_xlim(x[0], x[-1] if x[-1] > x[0] else x[0] + 1)
    counts: dict[Any, int] = {}
    for c in codes:
        k = None if np.isnan(c) else int(c)
        counts[k] = counts.get(k, 0) + 1
    handles = [
        Line2D([], [], color="#1f1f1f", linewidth=1.0, label="usage"),
        Line2D([], [], color="#d62728", linestyle="--", linewidth=1.3, label="limit"),
        *_phase_handles(keys, counts, names),
    ]
    fig.legend(handles=handles, loc="outside right upper", title="steps per phase", fontsize=8, title_fontsize=8)
    return _save(fig, png_path)


def plot_phase_boxplots(pdf: pd.DataFrame, png_path: str | Path, title: str | None = None) -> Path:
    """Per-phase box plots of CPU cores and memory (GiB), and a bar of how often each phase occurs (3 panels).

    ``pdf`` is a *bounded sample* of ``PHASES`` rows as pandas: the caller samples in Spark (e.g.
    ``phases.sample(fraction=..., seed=...).limit(200_000).toPandas()``); this function holds the whole sample in
    memory and draws every box from it. Rows with a null phase form a grey ``none`` group at the end. The bar
    panel shows the share of the sample in each phase, labelled with the row count. Outliers are not drawn
    (``showfliers=False``): with a large sample they would bury the boxes.
    """
    heading = title or "Resource usage per phase"
    if pdf is None or pdf.empty:
        return _empty(png_path, heading)
    n = len(pdf)
    codes = _phase_codes(pdf.get("phase"), n)
    cpu = _numeric(pdf.get("cpu_usage_cores"), n)
    mem = _numeric(pdf.get("mem_current"), n) / GIB
    keys = _phase_keys(codes)
    masks = [np.isnan(codes) if k is None else codes == k for k in keys]
    labels = [_phase_label(k) for k in keys]
    colours = [phase_colour(k) for k in keys]
    positions = np.arange(1, len(keys) + 1)

    fig = _figure(min(20.0, max(9.0, 3.0 + 1.35 * len(keys))), 4.2)
    axes = fig.subplots(1, 3)
    for ax, values, ylabel in ((axes[0], cpu, "CPU cores used"), (axes[1], mem, "memory used (GiB)")):
        data = [values[m][np.isfinite(values[m])] for m in masks]
        data = [d if d.size else np.array([np.nan]) for d in data]
        bp = ax.boxplot(data, positions=positions, widths=0.6, patch_artist=True, showfliers=False,
                        medianprops={"color": "#1f1f1f", "linewidth": 1.4})
        for box, colour in zip(bp["boxes"], colours):
            box.set_facecolor(colour)
            box.set_alpha(0.75)
        ax.set_xticks(positions, labels)
        ax.set_xlabel("phase")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    counts = np.array([int(m.sum()) for m in masks])
    share = counts / counts.sum()
    bars = axes[2].bar(positions, share, color=colours, alpha=0.85, width=0.6)
    axes[2].bar_label(bars, labels=[f"{c:,}" for c in counts], fontsize=7, padding=2)
    axes[2].set_xticks(positions, labels)
    axes[2].set_xlabel("phase")
    axes[2].set_ylabel("share of sampled steps")
    axes[2].set_ylim(0, min(1.0, float(share.max()) * 1.18 + 0.02))
    axes[2].yaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f}%")
    axes[2].grid(True, axis="y", alpha=0.3)
    axes[0].set_title("CPU")
    axes[1].set_title("memory")
    axes[2].set_title("phase frequency")
    fig.suptitle(f"{heading} (sample of {n:,} steps)")
    return _save(fig, png_path)


def _container_arrays(pdf: pd.DataFrame, resource: str) -> tuple[np.ndarray, np.ndarray]:
    usage_col, limit_col = RESOURCES[resource]
    usage = pd.to_numeric(pdf[usage_col], errors="coerce").to_numpy(dtype=float)
    limit = pd.to_numeric(pdf[limit_col], errors="coerce").ffill().bfill().to_numpy(dtype=float)
    return usage, limit


def plot_policy_curves(
    pdf: pd.DataFrame,
    png_path: str | Path,
    model: Any = None,
    policies: Sequence[str] | None = None,
    resource: str = "both",
    title: str | None = None,
) -> Path:
    """Usage against the allocation of each policy over one container's life (step curves), with the limit.

    ``pdf`` holds one container's ``PHASES`` rows; the replay is the one of
    :func:`ai4dl.policies.replay_container` (sorted by ``step``, missing steps as unknown usage, limit filled
    forward/backward) and each curve is :func:`ai4dl.policies.replay.allocate`'s per-step allocation, memory with
    its reactions to OOM kills. ``static`` is the limit, drawn dashed black. ``model`` (a
    :class:`~ai4dl.policies.model.PolicyModel`) gives every policy its calibrated knob per resource and the phase
    policies their statistics and transitions (without one: the configured defaults, and the phase policies fall
    back to the limit); the ``ts`` column, when present, is ``vpa``'s clock as in the replay. ``resource`` is
    ``"cpu"``, ``"mem"`` or ``"both"`` (one panel each). Each legend entry carries the policy's saving vs the
    limit and its fulfilment (share of steps met) on this container. A thin band at the top of each panel shows
    the phase of every step. x axis: step.
    """
    policies = list(POLICIES if policies is None else policies)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown} (known: {', '.join(POLICIES)})")
    if resource == "both":
        resources = list(RESOURCES)
    elif resource in RESOURCES:
        resources = [resource]
    else:
        raise ValueError(f"resource must be 'cpu', 'mem' or 'both', got {resource!r}")
    heading = title or (f"Allocation policies: {_container_title(pdf)}" if pdf is not None and len(pdf) else
                        "Allocation policies")
    if pdf is None or pdf.empty:
        return _empty(png_path, heading)

    df = replay_frame(pdf)
    ts_seconds = timestamps_seconds(df)
    x = df.index.to_numpy(dtype=float)
    phases = df["phase"].to_numpy(dtype=object) if "phase" in df.columns else None
    codes = _phase_codes(df["phase"] if "phase" in df.columns else None, len(df))
    fig = _figure(11, 3.4 * len(resources) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(resources), 1, sharex=True, squeeze=False)[:, 0])
    for ax, res in zip(axes, resources):
        usage, limit = _container_arrays(df, res)
        scale = GIB if res == "mem" else 1.0
        ok = ~np.isnan(usage) & ~np.isnan(limit)
        ax.fill_between(x, 0, np.nan_to_num(usage / scale), step="post", color="#bbbbbb", alpha=0.7,
                        linewidth=0, label="usage", zorder=1)
        ax.plot(x, limit / scale, drawstyle="steps-post", color=policy_colour("static"), linestyle="--",
                linewidth=1.3, label="limit (static)", zorder=5)
        for policy in policies:
            if policy == "static":
                continue
            params = model.params_for(policy, res) if model is not None else PoliciesConfig()
            stats, transitions = (model.phase_stats, model.transitions) if model is not None else (None, None)
            alloc = allocate(policy, usage, limit, params, phases, stats, res, ts_seconds, transitions)
            label = policy
            if ok.any() and np.nansum(limit[ok]) > 0:
                saving = 1.0 - float(alloc[ok].sum()) / float(limit[ok].sum())
                met = float(np.mean(alloc[ok] >= usage[ok]))
                label = f"{policy}: saves {100 * saving:.0f}%, meets {100 * met:.0f}%"
            ax.plot(x, alloc / scale, drawstyle="steps-post", color=policy_colour(policy), linewidth=1.2,
                    label=label, zorder=3)
        if phases is not None:
            _phase_bands(ax, x, codes, y0=0.965, height=0.035, alpha=0.9)
        both = np.concatenate([usage, limit]) / scale
        top = float(np.nanmax(both)) if np.isfinite(both).any() else 1.0
        ax.set_ylim(0, float(top) * 1.12 if top > 0 else 1.0)
        ax.set_xlim(x[0], x[-1] + 1)
        ax.set_ylabel("CPU cores" if res == "cpu" else "memory (GiB)")
        length = (model.params if model is not None else PoliciesConfig()).interval_steps
        ax.set_title(f"{RESOURCE_LABELS[res]} (interval {length} steps)", fontsize=10, loc="left")
        ax.grid(True, axis="y", alpha=0.3)
        handles, _labels = ax.get_legend_handles_labels()
        if phases is not None and ax is axes[0]:
            handles += _phase_handles(_phase_keys(codes))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False)
    axes[-1].set_xlabel("step")
    fig.suptitle(heading)
    return _save(fig, png_path)


def _summary_value(summary: pd.DataFrame, policy: str, resource: str, column: str) -> float:
    rows = summary[(summary["policy"] == policy) & (summary["resource"] == resource)]
    if rows.empty or column not in rows.columns:
        return math.nan
    value = pd.to_numeric(rows[column], errors="coerce").iloc[0]
    return float(value) if pd.notna(value) else math.nan


def plot_savings(summary_pdf: pd.DataFrame, png_path: str | Path, title: str | None = None) -> Path:
    """The policies' trade-off from :func:`ai4dl.policies.summarise` (as pandas).

    Top: per policy, bars of ``savings_vs_static`` (left) and ``fulfilment`` (right), one bar per resource
    (CPU solid, memory hatched). Bottom: the savings curve, x = fulfilment, y = savings, one labelled point per
    policy and resource (circle = CPU, square = memory); the top-right corner is best. Null ratios are skipped.
    """
    heading = title or "Allocation policies: savings vs fulfilment (fleet)"
    if summary_pdf is None or summary_pdf.empty:
        return _empty(png_path, heading)
    summary = summary_pdf.copy()
    seen = list(dict.fromkeys(summary["policy"].astype(str)))
    policies = [p for p in POLICIES if p in seen] + [p for p in seen if p not in POLICIES]
    resources = [r for r in RESOURCES if r in set(summary["resource"])] + sorted(
        set(summary["resource"]) - set(RESOURCES))

    fig = _figure(12, 8.5)
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.25])
    bar_axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])]
    scatter = fig.add_subplot(grid[1, :])
    pos = np.arange(len(policies), dtype=float)
    width = 0.8 / max(len(resources), 1)
    for ax, column, label in ((bar_axes[0], "savings_vs_static", "savings vs static"),
                              (bar_axes[1], "fulfilment", "fulfilment (steps met)")):
        lo = 0.0
        for j, res in enumerate(resources):
            values = np.array([_summary_value(summary, p, res, column) for p in policies])
            lo = min(lo, float(np.nanmin(values)) if np.isfinite(values).any() else 0.0)
            offset = (j - (len(resources) - 1) / 2) * width
            bars = ax.bar(pos + offset, np.nan_to_num(values), width=width * 0.95,
                          color=[policy_colour(p) for p in policies], alpha=0.85 if j == 0 else 0.55,
                          hatch=None if j == 0 else "//", edgecolor="#333333", linewidth=0.5)
            ax.bar_label(bars, labels=["" if np.isnan(v) else f"{100 * v:.0f}" for v in values], fontsize=6.5,
                         padding=1)
        ax.set_xticks(pos, policies, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(min(lo * 1.15, 0.0), 1.12)
        ax.axhline(0, color="#333333", linewidth=0.6)
        ax.yaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f}%")
        ax.set_title(label, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    bar_axes[0].legend(
        handles=[Patch(facecolor="#999999", alpha=0.85 if j == 0 else 0.55, hatch=None if j == 0 else "//",
                       edgecolor="#333333", label=RESOURCE_LABELS.get(r, r)) for j, r in enumerate(resources)],
        fontsize=8, loc="upper left",
    )

    markers = {"cpu": "o", "mem": "s"}
    labels: dict[tuple[float, float], list[str]] = {}  # coinciding points (e.g. static cpu and mem) share a label
    for res in resources:
        for p in policies:
            fx = _summary_value(summary, p, res, "fulfilment")
            sy = _summary_value(summary, p, res, "savings_vs_static")
            if not (math.isfinite(fx) and math.isfinite(sy)):
                continue
            scatter.scatter([fx], [sy], s=70, marker=markers.get(res, "^"), color=policy_colour(p),
                            edgecolor="#222222", linewidth=0.6, zorder=3)
            labels.setdefault((round(fx, 3), round(sy, 3)), []).append(f"{p} ({res})")
    for (fx, sy), names in labels.items():
        scatter.annotate(", ".join(names), (fx, sy), xytext=(6, 4), textcoords="offset points", fontsize=7.5)
    scatter.set_xlabel("fulfilment (share of steps whose usage the allocation met)")
    scatter.set_ylabel("savings vs static")
    scatter.xaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f}%")
    scatter.yaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f}%")
    scatter.grid(True, alpha=0.3)
    scatter.set_title("trade-off (top right is best)", fontsize=10)
    scatter.legend(
        handles=[Line2D([], [], marker=markers.get(r, "^"), linestyle="", color="#777777", markersize=8,
                        label=RESOURCE_LABELS.get(r, r)) for r in resources],
        fontsize=8, loc="lower left",
    )
    scatter.margins(x=0.12, y=0.12)
    fig.suptitle(heading)
    return _save(fig, png_path)


def plot_frontier(totals: pd.DataFrame, calibration: pd.DataFrame | None, png_path: str | Path,
                  target: float | Mapping[str, float | None] | None = None, title: str | None = None) -> Path:
    """The frontier: savings vs static against the service level over each policy's knob range, held-out
    containers (one panel per resource; rows of :func:`ai4dl.policies.fleet.frontier_totals`). The service level
    is the share of steps met, or, for memory held to an OOM budget (the calibration's ``oom_budget_per_100h``),
    OOM kills per 100 container-hours (log scale, the budget dashed; left is better there). The knob chosen on
    the training containers is ringed; the dashed line is the target (one for both resources, or per resource)."""
    heading = title or "Policy frontiers (held-out containers): savings over each knob at the service level it gives"
    if totals is None or totals.empty:
        return _empty(png_path, heading)
    df = totals.copy()
    df["fulfilment"] = df["met_steps"] / df["steps"].where(df["steps"] > 0)
    df["savings"] = 1.0 - df["allocated"] / df["static_allocated"].where(df["static_allocated"] > 0)
    if "hours" in df.columns:
        df["kills"] = 100.0 * df["oom_kills"] / df["hours"].where(df["hours"] > 0)
    resources = [r for r in RESOURCES if r in set(df["resource"])]
    fig = _figure(6.2 * max(len(resources), 1), 5.2)
    for j, res in enumerate(resources):
        ax = fig.add_subplot(1, len(resources), j + 1)
        part = df[df["resource"] == res]
        budget = None
        if calibration is not None and "oom_budget_per_100h" in calibration and "kills" in part:
            budgets = calibration[calibration["resource"] == res]["oom_budget_per_100h"].dropna()
            budget = float(budgets.iloc[0]) if len(budgets) else None
        x_col = "fulfilment" if budget is None else "kills"
        floor = 0.5 * max(float(part[x_col][part[x_col] > 0].min()), 1e-3) if budget is not None and (part[x_col] > 0).any() else 0.1
        for policy in [p for p in POLICIES if p in set(part["policy"])]:
            rows = part[part["policy"] == policy].sort_values("knob")
            colour = policy_colour(policy)
            style = "-o" if rows["knob"].notna().any() else "s"
            x = rows[x_col] if budget is None else rows[x_col].clip(lower=floor)  # zero kills drawn at the axis' floor
            ax.plot(x, rows["savings"], style, color=colour, markersize=3.5, linewidth=1.2, label=policy)
            if calibration is not None and not calibration.empty:
                chosen = calibration[(calibration["policy"] == policy) & (calibration["resource"] == res)]
                for c in chosen.itertuples(index=False):
                    cx = c.fulfilment if budget is None else max(float(c.oom_kills_per_100h), floor)
                    ax.plot([cx], [c.savings_vs_static], "o", markersize=10, markerfacecolor="none",
                            markeredgecolor=colour, markeredgewidth=1.6)
        line = budget if budget is not None else (target.get(res) if isinstance(target, Mapping) else target)
        if line is not None:
            ax.axvline(max(line, floor) if budget is not None else line, color="#555555", linestyle="--", linewidth=0.9)
        if budget is None:
            ax.set_xlabel("fulfilment (steps with allocation >= usage)")
            ax.xaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f}%")
        else:
            ax.set_xscale("log")
            ax.set_xlabel(f"OOM kills per 100 container-hours (log; none drawn at {floor:.2g}; budget {budget:g})")
        ax.set_ylabel("savings vs static")
        ax.yaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f}%")
        ax.set_title(RESOURCE_LABELS.get(res, res), fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower left" if budget is None else "upper right")
    fig.suptitle(heading, fontsize=11)
    return _save(fig, png_path)


def plot_training(epoch_errors: Sequence[float], k_scores: Sequence[Sequence[float]] | None, png_path: str | Path,
                  title: str | None = None) -> Path:
    """The CRBM's reconstruction error per epoch (did it converge?) and, with a k report, silhouette and
    inertia per k (which k to choose): the plots a training run writes and logs."""
    if not len(epoch_errors):
        return _empty(png_path, title or "CRBM training")
    panels = 2 if k_scores else 1
    fig = _figure(5.5 * panels, 3.2)
    ax = fig.add_subplot(1, panels, 1)
    ax.plot(range(1, len(epoch_errors) + 1), list(epoch_errors), marker="o", markersize=3)
    ax.set_xlabel("epoch")
    ax.set_ylabel("reconstruction error")
    ax.set_title(title or "CRBM training")
    ax.grid(alpha=0.3)
    if k_scores:
        ks = [int(r[0]) for r in k_scores]
        ax2 = fig.add_subplot(1, 2, 2)
        ax2.plot(ks, [r[1] for r in k_scores], marker="o", color="#1f77b4", label="silhouette")
        ax2.set_xlabel("k")
        ax2.set_ylabel("silhouette")
        twin = ax2.twinx()
        twin.plot(ks, [r[2] for r in k_scores], marker="s", color="#d62728", label="inertia")
        twin.set_ylabel("inertia")
        ax2.set_title("Choosing k")
        ax2.grid(alpha=0.3)
    return _save(fig, png_path)


def draw_graph(graph: nx.DiGraph, png_path: str | Path, title: str | None = None, max_leaves: int = 8) -> Path:
    """Draw a phase graph (or prototype tree) to a PNG with matplotlib's Agg canvas (no global backend change):
    :func:`graph_figure`, saved."""
    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    graph_figure(graph, title, max_leaves).savefig(png)
    return png


def top_of_tree(tree: nx.DiGraph, max_leaves: int) -> nx.DiGraph:
    """The prototype tree cut to the paths of its ``max_leaves`` most common executions (leaves by ``count``,
    ties by name): what a reader can take in; the whole tree stays in the GraphML/JSON export."""
    leaves = sorted((n for n in tree.nodes if tree.out_degree(n) == 0),
                    key=lambda n: (-float(tree.nodes[n].get("count", 0)), str(n)))[:max_leaves]
    keep = set()
    for leaf in leaves:
        keep.add(leaf)
        keep.update(nx.ancestors(tree, leaf))
    return tree.subgraph(keep).copy()


def graph_figure(graph: nx.DiGraph, title: str | None = None, max_leaves: int = 8) -> Figure:
    """The figure :func:`draw_graph` saves. Nodes carry short labels (the phase id, its mean dwell or count); the
    phases' names are listed once beside the drawing, so long names never collide. A prototype tree is cut to
    its ``max_leaves`` most common executions (:func:`top_of_tree`) and laid out left to right, one row per
    execution. Node size grows with ``mean_dwell_steps`` (else ``count``), edge width with ``probability`` (else
    ``count``); a transition graph labels only the edges of probability >= 0.15. The layout is seeded, so the
    same graph draws the same picture."""
    tree = graph.graph.get("kind") == "prototype_tree"
    if tree:
        graph = top_of_tree(graph, max_leaves)
    leaves = sum(1 for n in graph.nodes if graph.out_degree(n) == 0) if tree else 0
    names = {}
    for n in graph.nodes:
        d = graph.nodes[n]
        phase = d.get("phase", n)
        if d.get("name") and phase != ROOT_PHASE:
            names[phase] = str(d["name"])
    height = max(4.0, 0.75 * leaves + 1.5) if tree else 5.5
    fig = Figure(figsize=(10.5 if names else 7.0, height), dpi=DPI)  # no constrained layout: the legend's room is set
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_axis_off()
    if title or graph.graph.get("kind"):
        ax.set_title(title or str(graph.graph.get("kind")))
    if graph.number_of_nodes() == 0:
        ax.text(0.5, 0.5, "(empty graph)", ha="center", va="center")
        return fig

    nodes = list(graph.nodes)

    def _node_weight(n: Any) -> float:
        d = graph.nodes[n]
        return float(d.get("mean_dwell_steps", d.get("count", 1)) or 0.0)

    weights = [_node_weight(n) for n in nodes]
    wmax = max(weights) or 1.0
    sizes = [300 + (900 if tree else 2200) * w / wmax for w in weights]

    edges = list(graph.edges)
    if edges and all("probability" in graph.edges[e] for e in edges):
        widths = [0.5 + 5.0 * float(graph.edges[e]["probability"]) for e in edges]
        edge_labels = {e: f"{float(graph.edges[e]['probability']):.2f}" for e in edges
                       if float(graph.edges[e]["probability"]) >= 0.15}
    else:
        counts = [float(graph.edges[e].get("count", 1)) for e in edges]
        cmax = max(counts, default=1.0) or 1.0
        widths = [0.5 + 5.0 * c / cmax for c in counts]
        edge_labels = {} if tree else {e: str(graph.edges[e].get("count", "")) for e in edges}

    def _label(n: Any) -> str:
        d = graph.nodes[n]
        phase = d.get("phase", n)
        head = "start" if phase == ROOT_PHASE else str(phase)
        if "mean_dwell_steps" in d:
            return f"{head}\n{float(d['mean_dwell_steps']):.1f} st"
        if "count" in d:
            return f"{head}\nn={d['count']}"
        return head

    if tree:
        pos = _tree_layout(graph)
    else:
        pos = nx.circular_layout(graph) if len(nodes) <= 2 else nx.spring_layout(graph, seed=7, k=1.5)
    nx.draw_networkx_nodes(graph, pos, nodelist=nodes, node_size=sizes, node_color="#9ecae1", edgecolors="#3182bd", ax=ax)
    labels = nx.draw_networkx_labels(graph, pos, labels={n: _label(n) for n in nodes}, font_size=7, ax=ax)
    for text in labels.values():
        text.set_gid("node-label")
    if edges:
        nx.draw_networkx_edges(
            graph, pos, edgelist=edges, width=widths, arrows=True, arrowsize=12,
            connectionstyle="arc3,rad=0.0" if tree else "arc3,rad=0.12", node_size=sizes, ax=ax,
        )
        if edge_labels:
            nx.draw_networkx_edge_labels(graph, pos, edge_labels=edge_labels, font_size=7, ax=ax,
                                         connectionstyle="arc3,rad=0.12")
    if names:
        legend = "\n".join(f"{p}: " + "\n    ".join(textwrap.wrap(names[p], 44)) for p in sorted(names))
        fig.text(0.99, 0.5, legend, ha="right", va="center", multialignment="left", fontsize=7, family="monospace",
                 bbox={"boxstyle": "round", "facecolor": "#f7f7f7", "edgecolor": "#cccccc"})
        fig.subplots_adjust(right=0.58)
    if tree:
        ax.margins(x=0.08, y=0.12)
        ax.text(0.0, -0.02, f"the {leaves} most common executions of their first phases (n: containers)",
                transform=ax.transAxes, fontsize=7, color="#555555")
    return fig


def _tree_layout(tree: nx.DiGraph) -> dict[Any, tuple[float, float]]:
    """Left-to-right layout: depth on x, leaves one row each from the top, parents centred on their children."""
    pos: dict[Any, tuple[float, float]] = {}
    next_y = [0.0]

    def place(node: Any, depth: int) -> float:
        children = sorted(tree.successors(node), key=lambda c: (-float(tree.nodes[c].get("count", 0)), str(c)))
        if not children:
            y = next_y[0]
            next_y[0] -= 1.0
        else:
            ys = [place(c, depth + 1) for c in children]
            y = sum(ys) / len(ys)
        pos[node] = (float(depth), y)
        return y

    roots = [n for n in tree.nodes if tree.in_degree(n) == 0] or list(tree.nodes)[:1]
    for r in roots:
        place(r, 0)
    return pos


_RUNG_COLOURS = {"clairvoyant": "#1f77b4", "baseline": "#7f7f7f", "best": "#2ca02c", "a": "#bcbd22", "b": "#17becf",
                 "c": "#9467bd", "d": "#d62728", "d'": "#d62728"}


def plot_ladder(table: pd.DataFrame, png_path: str | Path, title: str | None = None) -> Path:
    """The value-of-information ladder (:func:`ai4dl.policies.ladder.ladder` rows): one panel per resource and
    service level, a bar per rung measuring the share of the gap closed between the best baseline (0) and the
    clairvoyant (1) on the held-out containers, labelled with its savings vs static; a rung that missed the
    level in training is hatched. Savings alone would hide the differences: every rung saves about the same
    share of a fleet's static allocation, what differs is how much of the room it takes."""
    heading = title or "What knowing the phase is worth"
    if table is None or table.empty:
        return _empty(png_path, heading)
    panels = list(table.groupby(["resource", "level"], sort=False))
    cols = min(len(panels), 3)
    rows_n = -(-len(panels) // cols)
    fig = _figure(5.2 * cols, 3.4 * rows_n)
    for i, ((resource, level), part) in enumerate(panels):
        ax = fig.add_subplot(rows_n, cols, i + 1)
        part = part.iloc[::-1]  # the clairvoyant on top
        y = np.arange(len(part))
        gaps = part["gap_closed"].to_numpy(dtype=float)
        shown = np.nan_to_num(gaps, nan=0.0)
        bars = ax.barh(y, shown, color=[_RUNG_COLOURS.get(r, "#555555") for r in part["rung"]], alpha=0.85)
        low = min(-0.1, float(np.min(shown)) - 0.05)
        for bar, r in zip(bars, part.itertuples(index=False)):
            if not r.reached and r.rung not in ("clairvoyant", "baseline"):
                bar.set_hatch("//")
            gap = "n/a" if r.gap_closed != r.gap_closed else f"{100 * r.gap_closed:.0f}%"
            ax.text(max(bar.get_width(), 0.0) + 0.02, bar.get_y() + bar.get_height() / 2,
                    f"{gap} (saves {100 * r.savings:.1f}%)", va="center", fontsize=7)
        ax.axvline(0.0, color="#555555", linewidth=0.8)
        ax.set_yticks(y, [f"{r.rung}: {r.policy}" for r in part.itertuples(index=False)], fontsize=7)
        ax.set_xlim(low, 1.5)
        ax.xaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f}%")
        ax.set_xlabel("share of the gap closed, baseline -> clairvoyant (held out)", fontsize=8)
        ax.set_title(f"{RESOURCE_LABELS.get(resource, resource)} at {level}", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(heading + "\n(a: recent usage; b: + learned phase; c: + true behaviour; d: + true behaviour of the "
                 "coming interval; d': + learned phase of the coming interval; hatched: level missed in training)",
                 fontsize=9)
    return _save(fig, png_path)
