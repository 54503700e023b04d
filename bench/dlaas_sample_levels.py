"""`bench/dlaas_sample_levels.py [CSV]`: Figures of the real DLaaS sample that set the training-loop profile's parameters (printed, per container).

Segments each container by simple thresholds: start-up (before CPU first reaches 5 % of the cores), loading
(from then until memory reaches 90 % of the training plateau), training (plateau reached until memory falls
below half of it), tail (after that).
"""
import sys
from pathlib import Path

import numpy as np
import pandas as pd

d = pd.read_csv(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1].parent / "shared/data/reference/dlaas_sample.csv"))
d["cf"] = d["cpu.usage.cores"] / d["cpu.num.cores"]
d["mf"] = d["mem.current"] / d["mem.limit"]
d["ws"] = d["mem.working.set"] / d["mem.current"]
dt = d.groupby("pod.id")["timestamp"].diff().dropna()
print(f"samples {len(d)}, containers {d['pod.id'].nunique()}, cores {sorted(d['cpu.num.cores'].unique())}, "
      f"limit {sorted(d['mem.limit'].unique())} B, services {sorted(d['service'].unique())}")
print(f"interval: median {dt.median():.0f} s, mean {dt.mean():.1f} s, range {dt.min():.0f}-{dt.max():.0f} s")
rows = []
for pod, g in d.groupby("pod.id"):
    g = g.reset_index(drop=True)
    ts, cf, mf, ws = g["timestamp"].to_numpy(), g["cf"].to_numpy(), g["mf"].to_numpy(), g["ws"].to_numpy()
    busy0 = int(np.argmax(cf >= 0.05))
    drop = int(np.argmax((mf < 0.5 * mf.max()) & (np.arange(len(g)) > busy0 + 3)))
    plateau = np.median(mf[busy0:drop])
    load_end = busy0 + int(np.argmax(mf[busy0:] >= 0.9 * plateau))
    tr = slice(load_end, drop)
    # training proper: the last sample before the drop already falls (CPU winds down): stop at CPU < 0.3 x median
    cmed = np.median(cf[tr])
    busy = np.flatnonzero(cf[load_end:drop] >= 0.3 * cmed)
    end = load_end + int(busy[-1]) + 1
    tr = slice(load_end, end)
    t_h = (ts[tr] - ts[tr][0]) / 3600.0
    slope = np.polyfit(t_h, mf[tr], 1)[0] / np.median(mf[tr]) if len(t_h) > 2 else np.nan
    # growth over the steady part (skip the first 3 samples after the ramp, still settling)
    st = slice(load_end + 3, end)
    t2 = (ts[st] - ts[st][0]) / 3600.0
    slope2 = np.polyfit(t2, mf[st], 1)[0] / np.median(mf[st]) if len(t2) > 2 else np.nan
    rows.append(dict(
        pod=pod,
        startup_s=ts[busy0] - ts[0], startup_cpu_med=np.median(cf[:busy0]), startup_cpu_max=cf[:busy0].max(),
        startup_mem_max=mf[:busy0].max(), startup_ws=np.median(ws[:busy0]),
        load_s=ts[load_end] - ts[busy0], load_cpu_max=cf[busy0:load_end + 1].max(), load_ws_min=ws[busy0:load_end + 1].min(),
        train_s=ts[end - 1] - ts[load_end], train_cpu_med=np.median(cf[tr]), train_cpu_cv=cf[tr].std() / cf[tr].mean(),
        train_cpu_p10=np.quantile(cf[tr], 0.1), train_cpu_p90=np.quantile(cf[tr], 0.9),
        plateau=np.median(mf[tr]), mem_cv=mf[tr].std() / mf[tr].mean(),
        growth_per_h=slope, growth_steady_per_h=slope2, mem_bump_max=mf[tr].max() / np.median(mf[tr]) - 1,
        train_ws=np.median(ws[tr]),
        busy_cpu_cv=(lambda x: x.std() / x.mean())(cf[tr][cf[tr] >= 0.5 * cmed]),
        busy_share=(cf[tr] >= 0.5 * cmed).mean(),
        settle_s=ts[load_end + int(np.argmax(cf[load_end:] >= 0.5 * cmed))] - ts[load_end],
        tail_s=ts[-1] - ts[drop], tail_cpu_med=np.median(cf[drop:]), tail_mem_rel=np.median(mf[drop:]) / plateau,
        tail_ws=np.median(ws[drop:]),
    ))
r = pd.DataFrame(rows).set_index("pod").T
pd.set_option("display.width", 200)
print(r.to_string(float_format=lambda v: f"{v:.4g}"))
a, b = r["exec1"], r["exec3"]
print(f"exec1 vs exec3: plateau differs {abs(a.plateau / b.plateau - 1):.2%}, training CPU {abs(a.train_cpu_med / b.train_cpu_med - 1):.2%}, "
      f"training length {abs(a.train_s / b.train_s - 1):.0%}")
