"""Which rule predicts a container's next phase best? Rules replayed on the phase runs of a labelled lake, on a
development fleet only (it reads the true behaviours; never a frozen or check fleet).

    .venv/bin/python bench/policy_savings.py --input /tmp/fleets/training-loop-2222 --workdir /tmp/ps-tl2222
    .venv/bin/python bench/phase_dev/next_phase_rules.py /tmp/ps-tl2222

Reads the lake ``bench/policy_savings.py`` left under the workdir: the learned phases' runs
(``gold/phase_sequences``) and the true behaviours' runs (``silver/phases``' ``behaviour``, smoothed as the
ladder's rung c). Transitions are counted on the split's training containers, every rule is scored on the
held-out containers' run ends (F1 as ``ai4dl.policies.nextphase``): the fleet's table; each service's counts with
the fleet's probabilities as a prior of 1, 3, 10 or 30 pseudo-counts (the product's rule at its default, 3);
a second-order table (the previous and the current phase); the service's rule plus the container's own past
transitions at a weight.
"""
from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def container_runs(pdf):
    """{(pod, service): [phase of each run]} with consecutive equal phases merged."""
    out = {}
    for (pod, svc), g in pdf.sort_values(["pod_id", "service", "run"]).groupby(["pod_id", "service"]):
        phases = g["phase"].tolist()
        out[(pod, svc)] = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    return out


def f1(runs, predict) -> float:
    boundaries = predicted = correct = 0
    for (_, svc), r in runs.items():
        for i in range(1, len(r)):
            boundaries += 1
            guess = predict(svc, r, i - 1)
            if guess is not None:
                predicted += 1
                correct += guess == r[i]
    p, rec = (correct / predicted if predicted else 0.0), (correct / boundaries if boundaries else 0.0)
    return 2 * p * rec / (p + rec) if p + rec else 0.0


def rules(train):
    """Rule name -> predict(service, runs, i): the phase after run i."""
    by = defaultdict(Counter)
    for (_, svc), r in train.items():
        for i in range(1, len(r)):
            by[("fleet", r[i - 1])][r[i]] += 1
            by[("service", svc, r[i - 1])][r[i]] += 1
            if i >= 2:
                by[("second", r[i - 2], r[i - 1])][r[i]] += 1
    fleet = {k[1]: {d: n / sum(c.values()) for d, n in c.items()} for k, c in by.items() if k[0] == "fleet"}

    def argmax(scores):
        return min(scores, key=lambda d: (-scores[d], d)) if scores else None

    def service(prior, own_weight=0.0):
        def predict(svc, r, i):
            p, seen = fleet.get(r[i], {}), by.get(("service", svc, r[i]), Counter())
            mine = Counter(r[j + 1] for j in range(i) if r[j] == r[i]) if own_weight else Counter()
            return argmax({d: own_weight * mine[d] + seen[d] + prior * p.get(d, 0.0)
                           for d in set(p) | set(seen) | set(mine) if d != r[i]})
        return predict

    def second(svc, r, i):
        if i >= 1 and ("second", r[i - 1], r[i]) in by:
            return argmax(dict(by[("second", r[i - 1], r[i])]))
        return argmax(fleet.get(r[i], {}))

    out = {"the fleet's table": lambda svc, r, i: argmax({d: v for d, v in fleet.get(r[i], {}).items() if d != r[i]})}
    out.update({f"service, prior {a:g}": service(a) for a in (1.0, 3.0, 10.0, 30.0)})
    out["second order"] = second
    out.update({f"service (prior 3) + own history x{w:g}": service(3.0, w) for w in (0.5, 1.0, 3.0)})
    return out


def main(work: Path) -> None:
    from phase_quality import bench_config

    from ai4dl.behaviour.sequences import run_lengths
    from ai4dl.lake.session import get_spark
    from ai4dl.lake.tables import Lake
    from ai4dl.method.split import ContainerSplit
    from ai4dl.policies.ladder import rung_phases

    cfg = bench_config(work, [])
    lake = Lake.for_config(get_spark(cfg), cfg)
    split = ContainerSplit.of(cfg.window)
    phases = lake.read("phases")
    truth = run_lengths(rung_phases(phases, "c", cfg.policies.interval_steps), cfg.behaviour.min_run_steps)
    print(f"{'rule':<36} {'learned phases':>15} {'true behaviours':>16}")
    table = {}
    for name, runs in (("learned", lake.read("sequences")), ("true", truth)):
        train = container_runs(split.training(runs).toPandas())
        held = container_runs(split.held_out(runs).toPandas())
        for rule, predict in rules(train).items():
            table.setdefault(rule, {})[name] = f1(held, predict)
    for rule, scores in table.items():
        print(f"{rule:<36} {scores['learned']:>15.3f} {scores['true']:>16.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
