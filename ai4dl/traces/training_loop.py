"""The ``training-loop`` profile of the synthetic fleet: containers that run a training job's loop.

A container warms up (start-up, data loading, the first compilation), then runs epochs: a stretch of steady
training compute of regular length, an evaluation after every epoch, and a checkpoint after every few epochs.
Unlike the ``ai4dl`` profile (:mod:`ai4dl.traces.synthetic`), where every phase draws fresh levels and lengths,
the loop repeats: knowing the phase says what comes next, when, and at what level (a positive control for
phase-aware policies).

Services are job templates. Containers of one service (``container_index % n_services``) share the template's
cores, memory limit, levels, lengths and memory pattern, drawn from an RNG seeded by ``(seed, service)``; each
container jitters every template level and length by +-5 % and every segment's length by +-10 %. Lengths are
in seconds and sampled every ``interval_seconds``, so a longer interval sees the same job with fewer samples.

Memory follows one of two patterns per template: ``grow`` (the plateau creeps up over the life, e.g. caches
and fragmentation) or ``saw`` (rises through each epoch, falls back at its evaluation).

Parameters per template (CPU as a fraction of the cores, memory of the limit; U: uniform, logU: log-uniform).
"sample" figures are measured in ``../shared/data/reference/dlaas_sample.csv`` (4 DLaaS training containers of
one service, 4 cores, a 5,000 MiB limit, 28-65 samples each, 10-60 s apart, median 20 s), segmented at the first
CPU >= 5 % of the cores (start-up ends), memory at 90 % of its plateau (loading ends) and memory below half of
it (the run ends); "paper": AI4DL (HotCloud'20) and its follow-up (CLOUD'20: next phase of real containers
predicted at F1 0.92, i.e. real training is highly regular):

=========================== ============================ ================================================
parameter                   value                        source
=========================== ============================ ================================================
cores, memory limit         1-16 cores, 2-32 GiB         assumed: the ai4dl profile's choices (sample: 4,
                                                         5,000 MiB), so both fleets are sized alike
warm-up: start-up           130-210 s, CPU 0.0075-0.0095 sample: 130-210 s; CPU median 0.0075-0.0093
                            (x lognormal 0.5), memory    (max 0.013-0.045); memory 0.0004 -> 0.003-0.004
                            0.0005 -> 0.003, ws 0.99     (floored at 0.001 here); ws/mem 0.991-0.992
warm-up: loading            50-70 s, CPU 0.20-0.28       sample: 50-70 s, CPU max 0.26-0.28; memory
                            (x lognormal 0.3), memory    ramps to the plateau in 3-4 samples; ws/mem
                            geometric ramp to the        dips to 0.49-0.54 mid-ramp
                            plateau, ws/mem dips to
                            0.49-0.54
warm-up: settling           0-30 s at start-up CPU       sample: 0-30 s of low CPU at the plateau
                                                         before training (exec2, exec4)
training CPU (busy job)     0.20-0.60, CV 0.02-0.06      sample: 0.247-0.257 (one busy core of 4), CV
                                                         0.023 steady (exec3); assumed up to 0.60 for jobs
                                                         whose loaders and threads use more cores
training CPU (input-bound)  25 % of templates: 0.08-0.15 sample: exec2, 1 of 4: median 0.098, CV 0.48
                            CV 0.5                       (p10-p90 0.03-0.16)
training memory plateau     0.15-0.45                    sample: 0.191-0.203; assumed wider for limits
                                                         other than the sample's
ws/mem while training       0.870-0.878                  sample: 0.870-0.878
memory noise                lognormal 0.002              sample: plateau CV 0.0013-0.0024 (exec1, exec3)
memory pattern              grow or saw, 1:1             assumed: the sample is too short to show a saw
grow                        logU 1.4-12 % per hour       sample: 1.4-1.6 %/h (exec1, exec3 after the
                                                         ramp), 12 %/h (exec2)
saw                         +3-12 % over an epoch, back  assumed; the sample's memory falls to 0.28-0.30
                            at its evaluation            of the plateau when its run ends (released)
epoch (training stretch)    600-1,800 s (20-60 samples   sample: busy stretches of 530-800 s without an
                            at 30 s)                     evaluation (exec1-exec3): an epoch is at least
                                                         that long; assumed up to 30 min
evaluation length           8-20 % of the epoch          assumed: a 10-20 % validation split, forward
                                                         passes only (1/3 of a step's compute) but
                                                         metrics and uncached loading
evaluation CPU              0.4-0.7 x training, CV 0.10  assumed: forward passes only
evaluation memory           +2-4 % (bump)                sample: transient bumps of +2.8-3.7 % (exec4,
                                                         exec2)
checkpoint every            2-5 epochs, after evaluation assumed: common save schedules
checkpoint length           30-90 s                      sample: the final wind-down lasts 20-40 s for ~1
                                                         GB resident; assumed up to 90 s for bigger states
checkpoint CPU              0.09-0.38 x training, CV 0.3 sample: wind-down samples at 0.09-0.38 of the
                                                         busy level (one thread serialising)
checkpoint memory           flat or +2.6-3.7 %, 1:1      sample: flat in exec1, exec3; +2.6-3.7 % write
                                                         spike in exec4, exec2
per-container jitter        levels, lengths x U(0.95,    sample: exec1 and exec3 (same job) differ by
                            1.05); segments x U(0.9,     0.12 % in plateau, 0 % in CPU, 21 % in run
                            1.1)                         length; paper: F1 0.92 (regular)
=========================== ============================ ================================================

The sample's end of run (CPU 0.0003-0.005 of the cores, memory 0.28-0.30 of the plateau, ws/mem 0.84) is not
generated: a life here is a window on a long run, which goes on past its last sample.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

WARMUP = "warmup"
TRAINING = "training"
EVALUATION = "evaluation"
CHECKPOINT = "checkpoint"

BEHAVIOURS: tuple[str, ...] = (WARMUP, TRAINING, EVALUATION, CHECKPOINT)
_W, _T, _E, _C = range(4)

CORE_CHOICES = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
CORE_PROBS = np.array([0.10, 0.20, 0.35, 0.20, 0.15])
GIB = 1 << 30
MEM_LIMIT_GIB = np.array([2, 4, 6, 8, 12, 16, 24, 32], dtype=np.int64)

# Seed-sequence tags: a template's and a container's streams never coincide with each other or with the ai4dl
# profile's (which is seeded by (seed, container_index) alone).
_TEMPLATE_TAG = 0x544C_5445  # "TLTE"
_CONTAINER_TAG = 0x544C_434F  # "TLCO"

_LEVEL_JITTER = 0.05  # per container, on every template level and length
_SEGMENT_JITTER = 0.10  # per segment, on its length


@dataclass(frozen=True)
class Template:
    """A job template: what every container of one service shares (lengths in seconds)."""

    cores: float
    limit: int
    startup_s: float
    load_s: float
    settle_s: float
    startup_cpu: float
    load_cpu: float
    ws_dip: float
    input_bound: bool
    train_cpu: float
    train_cv: float
    mem_plateau: float
    ws_train: float
    saw: bool  # memory pattern: saw (else grow)
    growth_per_hour: float
    saw_amp: float
    epoch_s: float
    eval_share: float
    eval_cpu_ratio: float
    eval_bump: float
    ckpt_every: int
    ckpt_s: float
    ckpt_cpu_ratio: float
    ckpt_spike: float


def template(seed: int, service_index: int) -> Template:
    """The job template of service ``service_index`` (0-based), deterministic in ``(seed, service_index)``."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(service_index), _TEMPLATE_TAG])
    cores = float(rng.choice(CORE_CHOICES, p=CORE_PROBS))
    limit = int(rng.choice(MEM_LIMIT_GIB)) * GIB
    startup_s, load_s, settle_s = rng.uniform(130, 210), rng.uniform(50, 70), rng.uniform(0, 30)
    startup_cpu, load_cpu, ws_dip = rng.uniform(0.0075, 0.0095), rng.uniform(0.20, 0.28), rng.uniform(0.49, 0.54)
    input_bound = bool(rng.random() < 0.25)
    if input_bound:
        train_cpu, train_cv = rng.uniform(0.08, 0.15), 0.5
    else:
        train_cpu, train_cv = rng.uniform(0.20, 0.60), rng.uniform(0.02, 0.06)
    mem_plateau, ws_train = rng.uniform(0.15, 0.45), rng.uniform(0.870, 0.878)
    saw = bool(rng.random() < 0.5)
    growth = math.exp(rng.uniform(math.log(0.014), math.log(0.12)))
    saw_amp = rng.uniform(0.03, 0.12)
    epoch_s, eval_share = rng.uniform(600, 1800), rng.uniform(0.08, 0.20)
    eval_cpu_ratio, eval_bump = rng.uniform(0.4, 0.7), rng.uniform(0.02, 0.04)
    ckpt_every, ckpt_s = int(rng.integers(2, 6)), rng.uniform(30, 90)
    ckpt_cpu_ratio = rng.uniform(0.09, 0.38)
    ckpt_spike = rng.uniform(0.026, 0.037) if rng.random() < 0.5 else 0.0
    return Template(
        cores, limit, startup_s, load_s, settle_s, startup_cpu, load_cpu, ws_dip, input_bound, train_cpu, train_cv,
        mem_plateau, ws_train, saw, growth, saw_amp, epoch_s, eval_share, eval_cpu_ratio, eval_bump, ckpt_every,
        ckpt_s, ckpt_cpu_ratio, ckpt_spike,
    )


# Template fields a container jitters (levels and lengths); the others (cores, limit, pattern, schedule, the
# input-bound flag and the CV of its CPU) are the job's spec and stay as they are.
_JITTERED = (
    "startup_s", "load_s", "settle_s", "startup_cpu", "load_cpu", "train_cpu", "mem_plateau", "growth_per_hour",
    "saw_amp", "epoch_s", "eval_share", "eval_cpu_ratio", "eval_bump", "ckpt_s", "ckpt_cpu_ratio", "ckpt_spike",
)


@dataclass(frozen=True)
class Life:
    """One container's life as fractions (CPU of the cores, memory of the limit, working set of memory) and
    behaviour codes (indices into :data:`BEHAVIOURS`), with the RNG its finishing touches continue to draw from."""

    rng: np.random.Generator
    cores: float
    limit: int
    offset: int
    cpu: np.ndarray
    mem: np.ndarray
    ws: np.ndarray
    code: np.ndarray


def _segments(rng: np.random.Generator, tp: Template, horizon: float) -> np.ndarray:
    """Rows (code, start s, end s) from the container's start until ``horizon`` seconds are covered: the
    warm-up, then per epoch training, evaluation and, every ``ckpt_every`` epochs, a checkpoint."""
    warm = tp.startup_s + tp.load_s + tp.settle_s
    rows = [(_W, 0.0, warm)]
    t, epoch = warm, 0
    while t < horizon:
        epoch += 1
        for code, length in ((_T, tp.epoch_s), (_E, tp.epoch_s * tp.eval_share)):
            d = length * rng.uniform(1 - _SEGMENT_JITTER, 1 + _SEGMENT_JITTER)
            rows.append((code, t, t + d))
            t += d
        if epoch % tp.ckpt_every == 0:
            d = tp.ckpt_s * rng.uniform(1 - _SEGMENT_JITTER, 1 + _SEGMENT_JITTER)
            rows.append((_C, t, t + d))
            t += d
    return np.array(rows, dtype=float)


def life(seed: int, container_index: int, n_services: int, steps: int, interval_seconds: int) -> Life:
    """Container ``container_index``'s life: its service's template, jittered, sampled every ``interval_seconds``
    from its start. Deterministic in ``(seed, container_index, n_services)`` and the shape arguments."""
    tp = template(seed, container_index % n_services)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(container_index), _CONTAINER_TAG])
    jitter = rng.uniform(1 - _LEVEL_JITTER, 1 + _LEVEL_JITTER, len(_JITTERED))
    tp = dataclasses.replace(tp, **{k: getattr(tp, k) * j for k, j in zip(_JITTERED, jitter)})
    offset = int(rng.integers(0, 86_400))

    t = np.arange(steps, dtype=float) * interval_seconds
    seg = _segments(rng, tp, float(t[-1]) + interval_seconds)
    i = np.searchsorted(seg[:, 2], t, side="right")  # segment of each sample: the first ending after it
    code = seg[i, 0].astype(np.int8)
    start, end = seg[i, 1], seg[i, 2]
    u = (t - start) / (end - start)  # position within the segment, [0, 1)
    train_start = tp.startup_s + tp.load_s + tp.settle_s
    hours = np.maximum(t - train_start, 0.0) / 3600.0
    n = steps

    # Memory: the plateau, grown over the life (grow) or risen through the epoch (saw), plus evaluation bumps and
    # checkpoint write spikes over the level the epoch ended at (grow) or fell back to (saw).
    if tp.saw:
        level = tp.mem_plateau * np.where(code == _T, 1.0 + tp.saw_amp * u, 1.0)
    else:
        level = tp.mem_plateau * (1.0 + tp.growth_per_hour * hours)
    mem = level * np.select([code == _E, code == _C], [1.0 + tp.eval_bump, 1.0 + tp.ckpt_spike], 1.0)
    cpu = np.select(
        [code == _T, code == _E, code == _C],
        [tp.train_cpu, tp.train_cpu * tp.eval_cpu_ratio, tp.train_cpu * tp.ckpt_cpu_ratio],
        0.0,
    )
    sigma = np.select(
        [code == _T, code == _E, code == _C],
        [math.sqrt(math.log1p(tp.train_cv**2)), 0.10, 0.3],
        0.5,
    )
    ws = np.full(n, tp.ws_train)

    # The warm-up: start-up (low CPU, a few MB), loading (a CPU burst, memory ramping geometrically to the plateau,
    # the working set lagging), settling (low CPU at the plateau).
    w = code == _W
    startup = w & (t < tp.startup_s)
    loading = w & ~startup & (t < tp.startup_s + tp.load_s)
    settling = w & ~startup & ~loading
    m_up = 0.003
    s_u = t / tp.startup_s
    l_u = (t - tp.startup_s) / tp.load_s
    cpu = np.where(startup | settling, tp.startup_cpu, np.where(loading, tp.load_cpu, cpu))
    sigma = np.where(loading, 0.3, sigma)
    mem = np.where(startup, 0.0005 + (m_up - 0.0005) * s_u, mem)
    mem = np.where(loading, m_up * (tp.mem_plateau / m_up) ** np.clip(l_u, 0.0, 1.0), mem)
    mem = np.where(settling, tp.mem_plateau, mem)
    ws = np.where(startup, 0.99, ws)
    ws = np.where(loading, tp.ws_train - (tp.ws_train - tp.ws_dip) * np.sin(math.pi * np.clip(l_u, 0.0, 1.0)), ws)

    cpu = cpu * np.exp(rng.normal(0.0, 1.0, n) * sigma)  # multiplicative noise with median 1
    mem = mem * np.exp(rng.normal(0.0, 0.002, n))
    ws = np.clip(ws + rng.normal(0.0, 0.002, n), 0.0, 1.0)
    return Life(rng, tp.cores, tp.limit, offset, cpu, mem, ws, code)
