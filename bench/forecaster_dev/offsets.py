"""Forecaster design on a development fleet (never a frozen or check fleet); numpy only, no Spark.

    .venv/bin/python bench/unseen_fleet.py --profile ai4dl --seed 1111 --out /tmp/fleets/dev-ai4dl-1111
    .venv/bin/python bench/forecaster_dev/offsets.py /tmp/fleets/dev-ai4dl-1111 cpu 0.99 off

Containers split in thirds (fit the trees / calibrate the knob / score); prints the knob chosen and the scored
(steps met, savings vs static[, OOM kills]).
"""
import sys, numpy as np, pandas as pd
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", ".."))
from ai4dl.policies.forecast import trace_inputs, Forecaster, Trees
from ai4dl.policies.rules import interval_summaries
from ai4dl.policies.replay import held
path, res, level, variant = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
df = pd.read_parquet(path)
ucol, lcol = {"cpu": ("cpu.usage.cores", "cpu.num.cores"), "mem": ("mem.current", "mem.limit")}[res]
L = 10
from ai4dl.policies.rules import KNOBS  # noqa: E402
GRID = np.array(KNOBS["forecast"][1])  # the forecasters' miss costs
pods = sorted(df["pod.id"].unique()); rng = np.random.default_rng(0); rng.shuffle(pods)
n = len(pods); fitp, calp, testp = pods[: n//3], pods[n//3: 2*n//3], pods[2*n//3:]
traces = {p: (g[ucol].to_numpy(float), g[lcol].to_numpy(float)) for p, g in df.groupby("pod.id")}
def evaluate(ps, decide):
    met = steps = alloc = static = 0.0
    for p in ps:
        u, lim = traces[p]
        a, k = held(decide(p, u, lim), u, lim, L, res)
        met += (a >= u).sum(); steps += len(u); alloc += a.sum(); static += lim.sum()
    return round(met / steps, 4), round(1 - alloc / static, 4)
def pick(grid, decide_k):
    res_ = [(k,) + evaluate(calp, lambda p, u, lim: decide_k(k, u, lim)) for k in grid]
    ok = [r for r in res_ if r[1] >= level]
    k = min(ok, key=lambda r: -r[2])[0] if ok else max(res_, key=lambda r: r[1])[0]
    return k, evaluate(testp, lambda p, u, lim: decide_k(k, u, lim))
offsets = range(L) if "off" in variant else [0]
X, Y = [], []
for p in fitp:
    u, lim = traces[p]
    for o in offsets:
        inp = trace_inputs(u[o:], lim[o:], None, L)
        y = inp.target
        k = np.isfinite(y) & ~np.isnan(inp.prev_max); X.append(inp.x[k]); Y.append(y[k])
X, Y = np.vstack(X), np.concatenate(Y)
big = "big" in variant
kw = dict(max_iter=150, max_leaf_nodes=31) if big else {}
fc = Forecaster(0.9, Trees.fit(X, Y, 0.5, **kw), Trees.fit(X, Y, 0.9, **kw))
cache = {}
def dec(k, u, lim):
    if id(u) not in cache:
        cache[id(u)] = fc.forecast(trace_inputs(u, lim, None, L))
    return cache[id(u)].decisions(k)
print(variant, len(Y), pick(GRID, dec), flush=True)
