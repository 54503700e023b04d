"""Forecaster design on a development fleet (never a frozen or check fleet); numpy only, no Spark.

    .venv/bin/python bench/unseen_fleet.py --profile ai4dl --seed 1111 --out /tmp/fleets/dev-ai4dl-1111
    .venv/bin/python bench/forecaster_dev/base.py /tmp/fleets/dev-ai4dl-1111 cpu 0.99 max,last

Containers split in thirds (fit the trees / calibrate the knob / score); prints the knob chosen and the scored
(steps met, savings vs static[, OOM kills]).
"""
import sys, numpy as np, pandas as pd
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", ".."))
from ai4dl.policies.forecast import trace_inputs, Forecaster, Forecast, interval_stats, history_of
from ai4dl.policies.rules import blocks, interval_summaries
from ai4dl.policies.replay import held
path, res, level = sys.argv[1], sys.argv[2], float(sys.argv[3])
df = pd.read_parquet(path)
ucol, lcol = {"cpu": ("cpu.usage.cores", "cpu.num.cores"), "mem": ("mem.current", "mem.limit")}[res]
L = 10
KINDS = sys.argv[4].split(",")
from ai4dl.policies.rules import KNOBS  # noqa: E402
GRID = np.array(KNOBS["forecast"][1])  # the forecasters' miss costs
pods = sorted(df["pod.id"].unique()); rng = np.random.default_rng(0); rng.shuffle(pods)
n = len(pods); fitp, calp, testp = pods[: n//3], pods[n//3: 2*n//3], pods[2*n//3:]
traces = {p: (g[ucol].to_numpy(float), g[lcol].to_numpy(float)) for p, g in df.groupby("pod.id")}
def base_of(inp, kind):
    h = inp.x[:, :4] * inp.limits[:, None]  # max, mean, std, last of previous interval (absolute)
    return {"max": h[:, 0], "mean": h[:, 1], "last": h[:, 3], "m2s": h[:, 1] + 2 * h[:, 2]}[kind]
def target_of(u, q):
    b = blocks(u, L)
    return np.nanmax(b, axis=1) if q >= 1 else np.nanquantile(b, q, axis=1)
def evaluate(ps, decide):
    met = steps = alloc = static = kills = 0.0
    for p in ps:
        u, lim = traces[p]
        a, k = held(decide(p, u, lim), u, lim, L, res)
        met += (a >= u).sum(); steps += len(u); alloc += a.sum(); static += lim.sum(); kills += k.sum()
    return round(met / steps, 4), round(1 - alloc / static, 4), int(kills)
def pick(grid, decide_k):
    res_ = [(k,) + evaluate(calp, lambda p, u, lim: decide_k(k, u, lim)) for k in grid]
    ok = [r for r in res_ if r[1] >= level]
    k = min(ok, key=lambda r: -r[2])[0] if ok else max(res_, key=lambda r: r[1])[0]
    return k, evaluate(testp, lambda p, u, lim: decide_k(k, u, lim))
def prev_rules(k, u, lim):
    mx, mn, sd = [np.concatenate([[np.nan], s[:-1]]) for s in interval_summaries(u, L)]
    return mn + k * sd
print("prev.step.rules", pick(np.arange(0, 8.01, 0.25), prev_rules), flush=True)
for kind in KINDS:
    for q in (1.0,):
        X, Y = [], []
        for p in fitp:
            u, lim = traces[p]; inp = trace_inputs(u, lim, None, L)
            y = (target_of(u, q) - base_of(inp, kind)) / inp.limits
            k = np.isfinite(y) & ~np.isnan(inp.prev_max); X.append(inp.x[k]); Y.append(y[k])
        fc = Forecaster.fit(np.vstack(X), np.concatenate(Y), 0.9)
        cache = {}
        def dec(k, u, lim, fc=fc, kind=kind):
            if id(u) not in cache:
                inp = trace_inputs(u, lim, None, L)
                f = fc.forecast(inp)
                cache[id(u)] = Forecast(base_of(inp, kind), f.center, f.upper, f.limits, f.quantile)
            return cache[id(u)].decisions(k)
        print(f"base={kind} target q={q}", pick(GRID, dec), flush=True)
