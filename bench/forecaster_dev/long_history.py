"""Forecaster inputs beyond the last three intervals, on a development fleet (never a frozen or check fleet).

    .venv/bin/python bench/forecaster_dev/long_history.py /tmp/fleets/ai4dl-1111 cpu 0.99 h3,h6,long

Variants: ``h3`` today's inputs (the last 3 intervals' max, mean, std, last); ``h6``/``h12`` more intervals of the
same; ``long`` h3 plus what a container has shown over its life, all kept in O(1) state: its running peak,
exponentially weighted peak, |jump| and std (half-lives of about 2 and 7 intervals), and its age. Containers split
in thirds (fit the trees / calibrate the knob / score); prints the knob and the scored (steps met, saved vs static),
for the decision rule before the miss cost (``linear``: median + s * (upper - median)) and the product's.
A variant ``NAME@Q`` targets the interval's Q quantile of steps instead of its peak.
"""
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", ".."))
from ai4dl.policies.forecast import Forecast, Trees, interval_stats  # noqa: E402
from ai4dl.policies.replay import held  # noqa: E402
from ai4dl.policies.rules import KNOBS, limit_before  # noqa: E402

path, res, level = sys.argv[1], sys.argv[2], float(sys.argv[3])
VARIANTS = sys.argv[4].split(",")
QUANTILE = float(sys.argv[5]) if len(sys.argv) > 5 else 0.9
df = pd.read_parquet(path)
ucol, lcol = {"cpu": ("cpu.usage.cores", "cpu.num.cores"), "mem": ("mem.current", "mem.limit")}[res]
L = 10
GRID = np.array(KNOBS["forecast"][1])  # the forecasters' miss costs
SPREADS = np.array([-1, -0.75, -0.5, -0.375, -0.25, -0.125, 0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1, 1.25,
                    1.5, 1.75, 2, 2.5, 3, 4, 6])  # the former rule's knob
pods = sorted(df["pod.id"].unique())
rng = np.random.default_rng(0)
rng.shuffle(pods)
n = len(pods)
fitp, calp, testp = pods[: n // 3], pods[n // 3: 2 * n // 3], pods[2 * n // 3:]
traces = {p: (g[ucol].to_numpy(float), g[lcol].to_numpy(float)) for p, g in df.groupby("pod.id")}


def ewm(values, alpha):
    """Per interval, the weighted mean of the intervals *before* it (NaN before the first; NaN values skipped)."""
    out = np.full(len(values), np.nan)
    acc = np.nan
    for i in range(len(values)):
        out[i] = acc
        v = values[i]
        if np.isfinite(v):
            acc = v if np.isnan(acc) else acc + alpha * (v - acc)
    return out


def inputs(u, lim, variant):
    stats = interval_stats(u, L)
    limits = limit_before(lim, L)
    hist_n = {"h6": 6, "h12": 12}.get(variant.split("+")[0], 3)
    n_int = len(stats)
    hist = np.full((n_int, hist_n, 4), np.nan)
    for k in range(1, hist_n + 1):
        if n_int > k:
            hist[k:, k - 1, :] = stats[:-k]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = hist / np.where(limits > 0, limits, np.nan)[:, None, None]
        x = [share.reshape(n_int, -1)]
        if "long" in variant:
            mx = stats[:, 0]
            prev_mx = np.concatenate([[np.nan], mx[:-1]])
            run_peak = np.concatenate([[np.nan], np.fmax.accumulate(mx)[:-1]])
            jump = np.abs(mx - prev_mx)
            cols = [run_peak, ewm(mx, 0.3), ewm(mx, 0.1), ewm(jump, 0.3), ewm(jump, 0.1), ewm(stats[:, 2], 0.1)]
            x.append(np.column_stack([c / limits for c in cols]))
            x.append(np.log1p(np.arange(n_int))[:, None])
        prev_max = hist[:, 0, 0]
        peak = stats[:, 0]
        if "@" in variant:  # the target: a quantile of the interval's steps instead of its peak
            from ai4dl.policies.rules import blocks
            peak = np.nanquantile(blocks(u, L), float(variant.split("@")[1]), axis=1)
        target = (peak - prev_max) / np.where(limits > 0, limits, np.nan)
    return np.column_stack(x), prev_max, limits, target


def evaluate(ps, decide):
    met = steps = alloc = static = 0.0
    for p in ps:
        u, lim = traces[p]
        a, _ = held(decide(p, u, lim), u, lim, L, res)
        met += (a >= u).sum()
        steps += len(u)
        alloc += a.sum()
        static += lim.sum()
    return round(met / steps, 4), round(1 - alloc / static, 4)


def pick(decide_k, grid=GRID):
    res_ = [(k,) + evaluate(calp, lambda p, u, lim: decide_k(k, p, u, lim)) for k in grid]
    ok = [r for r in res_ if r[1] >= level]
    k = min(ok, key=lambda r: -r[2])[0] if ok else max(res_, key=lambda r: r[1])[0]
    return k, evaluate(testp, lambda p, u, lim: decide_k(k, p, u, lim))


def prev_rules(k, p, u, lim):
    from ai4dl.policies.rules import interval_summaries
    mx, mn, sd = [np.concatenate([[np.nan], s[:-1]]) for s in interval_summaries(u, L)]
    return mn + k * sd


def clairvoyant(k, p, u, lim):
    return interval_stats(u, L)[:, 0]


print("prev.step.rules", pick(prev_rules, np.arange(0, 8.01, 0.25)) if "base" in VARIANTS else "", "current.step.max",
      evaluate(testp, lambda p, u, lim: clairvoyant(0, p, u, lim)), flush=True)
for variant in [v for v in VARIANTS if v != "base"]:
    X, Y = [], []
    for p in fitp:
        x, pm, _, y = inputs(*traces[p], variant)
        keep = np.isfinite(y) & ~np.isnan(pm)
        X.append(x[keep])
        Y.append(y[keep])
    X, Y = np.vstack(X), np.concatenate(Y)
    center, upper = Trees.fit(X, Y, 0.5), Trees.fit(X, Y, QUANTILE)
    cache = {}

    def forecast(p, u, lim, center=center, upper=upper, variant=variant):
        if p not in cache:
            x, pm, limits, _ = inputs(u, lim, variant)
            c, up = np.full(len(pm), np.nan), np.full(len(pm), np.nan)
            at = ~np.isnan(pm)
            c[at], up[at] = center.predict(x[at]), upper.predict(x[at])
            cache[p] = Forecast(pm, c, up, limits, QUANTILE)
        return cache[p]

    def linear(k, p, u, lim):
        """The rule before the miss cost: every interval to the same share of the way to the upper forecast."""
        f = forecast(p, u, lim)
        return f.prev_max + (f.center + k * (f.upper - f.center)) * f.limits

    print(f"{variant:10s} q={QUANTILE} rows={len(Y)} linear   ", pick(linear, SPREADS), flush=True)
    print(f"{variant:10s} q={QUANTILE} rows={len(Y)} miss cost", pick(lambda k, p, u, lim: forecast(p, u, lim).decisions(k)),
          flush=True)
