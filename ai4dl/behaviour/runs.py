"""Run-length encoding of one container's phase sequence, and the smoothing of short runs: pure Python.

The reference for :func:`ai4dl.behaviour.sequences.run_lengths`, which does the same over a fleet in Spark:
null phases (steps without full history) neither start nor split a run and are not counted in its length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Run = tuple[int, int, int]  # (phase, start_index, length)


def rle(phases: Sequence[int | None]) -> list[Run]:
    """Run-length encode a phase sequence: ``[(phase, start_index, length), ...]``.

    ``None`` entries are skipped exactly as :func:`run_lengths` skips null phases: they do not split a run and
    are not counted in its length; ``start_index`` is the position in the *input* sequence of the run's first
    labelled element.

    >>> rle([0, 0, 1, None, 1, 2])
    [(0, 0, 2), (1, 2, 2), (2, 5, 1)]
    """
    runs: list[list[int]] = []
    for i, p in enumerate(phases):
        if p is None:
            continue
        p = int(p)
        if runs and runs[-1][0] == p:
            runs[-1][2] += 1
        else:
            runs.append([p, i, 1])
    return [tuple(r) for r in runs]  # type: ignore[misc]


def smooth_runs(runs: Sequence[Run], min_len: int) -> list[Run]:
    """Absorb runs shorter than ``min_len`` into a neighbour, then merge equal neighbours.

    Deterministic rules, decided on the *original* lengths:

    * a run with ``length >= min_len`` is *long* and survives (possibly grown);
    * a short run after a long one is absorbed into the closest preceding long run (that run's phase, its
      length grows by the short run's length);
    * short runs before the first long run are absorbed into that first long run (whose start moves back to
      the first short run's start);
    * afterwards adjacent runs of the same phase are merged (``0x5, 1x1, 0x5`` -> ``0x11``);
    * if no run is long (the whole sequence is shorter than the minimum), the runs are returned unchanged
      apart from merging equal neighbours: there is nothing trustworthy to absorb them into.

    ``min_len <= 1`` returns the runs unchanged (merged). Runs are ``(phase, start, length)`` tuples as from
    :func:`rle`, given in order; a merged run keeps the start of its first constituent.

    >>> smooth_runs([(0, 0, 5), (1, 5, 1), (0, 6, 5)], 2)
    [(0, 0, 11)]
    >>> smooth_runs([(3, 0, 1), (0, 1, 4), (1, 5, 1)], 2)
    [(0, 0, 6)]
    """
    runs = [(int(p), int(s), int(n)) for p, s, n in runs]
    if min_len > 1 and any(n >= min_len for _, _, n in runs):
        out: list[list[int]] = []
        pending_start: int | None = None
        pending_len = 0
        for p, s, n in runs:
            if n >= min_len:
                if pending_start is not None:  # leading short runs join the first long run
                    out.append([p, pending_start, pending_len + n])
                    pending_start, pending_len = None, 0
                else:
                    out.append([p, s, n])
            elif out:
                out[-1][2] += n
            else:
                if pending_start is None:
                    pending_start = s
                pending_len += n
        runs = [tuple(r) for r in out]  # type: ignore[misc]
    return _merge_equal(runs)


def _merge_equal(runs: Iterable[Run]) -> list[Run]:
    out: list[list[int]] = []
    for p, s, n in runs:
        if out and out[-1][0] == p:
            out[-1][2] += n
        else:
            out.append([p, s, n])
    return [tuple(r) for r in out]  # type: ignore[misc]

