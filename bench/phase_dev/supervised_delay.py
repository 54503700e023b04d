"""How early could a causal reader of the default windows see a behaviour change if it were taught the *true*
behaviours? A ceiling for the live phases' delay (issue 30), on a development fleet only (never a frozen or
check fleet: it reads the ground truth).

    .venv/bin/python bench/phase_dev/supervised_delay.py /tmp/fleets/ai4dl-1111 [n_history]

Windows: the default features (ai4dl.lake.columns.BEHAVIOUR_FEATURES) at t, t-1, ..., t-n_history, from the raw
traces. Half the containers (every other id, sorted) fit scikit-learn's gradient-boosted classifier on the true
behaviour of each step; the other half are decoded forward (causal) at a few switch penalties and scored as
bench/phase_quality.py scores the phases: ARI, delay p50 / p95 from each true change, false changes per 1,000.
"""
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from sklearn.ensemble import HistGradientBoostingClassifier  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402

from ai4dl.lake.columns import BEHAVIOUR_FEATURES  # noqa: E402
from ai4dl.method.features import derive  # noqa: E402
from ai4dl.method.labelling import forward_decode  # noqa: E402
from ai4dl.method.quality import change_timing, fleet_change_timing  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from feature_ablation import delay_by_change, transitions  # noqa: E402

fleet, n_hist = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
df = pd.read_parquet(fleet).rename(columns={"cpu.usage.cores": "cpu_usage_cores", "cpu.num.cores": "cpu_num_cores",
                                            "mem.current": "mem_current", "mem.limit": "mem_limit"})
pods = sorted(df["pod.id"].unique())
X, Y, P = [], [], []
for pod, g in df.groupby("pod.id", sort=True):
    g = g.sort_values("timestamp")
    f = derive(g, BEHAVIOUR_FEATURES)[list(BEHAVIOUR_FEATURES)].to_numpy(float)
    w = np.column_stack([np.vstack([np.full((k, f.shape[1]), np.nan), f[:len(f) - k]]) for k in range(n_hist + 1)])
    X.append(w); Y.append(g["behaviour"].to_numpy()); P.append(np.full(len(g), pod))
fit = set(pods[::2])
Xf = np.vstack([x for x, p in zip(X, P) if p[0] in fit]); Yf = np.concatenate([y for y, p in zip(Y, P) if p[0] in fit])
clf = HistGradientBoostingClassifier(max_iter=200, random_state=0).fit(Xf, Yf)
classes = clf.classes_
for penalty in (0.0, 1.0, 2.0, 4.0):
    per, truth_all, pred_all, kinds = [], [], [], []
    for x, y, p in zip(X, Y, P):
        if p[0] in fit:
            continue
        costs = -np.log(np.clip(clf.predict_proba(x), 1e-9, 1))  # the product's forward decoder over -log p
        out = forward_decode(costs, penalty)[0]
        pred = classes[out]
        per.append(change_timing(list(y), list(pred))); truth_all += list(y); pred_all += list(pred)
        kinds += transitions(list(y))
    t = fleet_change_timing(per)
    print(f"n_history {n_hist} penalty {penalty}: ARI {adjusted_rand_score(truth_all, pred_all):.3f} "
          f"delay p50 {t['delay_p50']:.0f} p95 {t['delay_p95']:.1f} false/1000 {t['false_per_1000_steps']:.1f}", flush=True)
    late = [f"{k} {v['p95']:.0f} (n {v['n']})" for k, v in delay_by_change(per, kinds).items() if v["p95"] > 3]
    print(f"  slowest changes (p95 > 3 steps): {', '.join(late) or 'none'}", flush=True)
