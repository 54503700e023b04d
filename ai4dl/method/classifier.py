"""The phase classifier: what a causal decoder reads instead of raw distances to the k-means centres.

Why: k-means assigns each step to its nearest centre, and that single-step partition of the CRBM's activations
is where live phases lose to offline ones (held-out ARI 0.76 forward-decoded against 0.87-0.88 for Viterbi over
the whole trace, on fleets of three seeds). Viterbi's labels are better because they use the steps *after*:
a change is placed where it began once later steps confirm it. Those labels can be learned from the activations
themselves: on the training containers, Viterbi decodes each whole trace over the centres (offline, where the
future is known), and a small network learns to say, from one step's activations alone, which phase Viterbi
gave that step. Live, the network's ``-log p`` per phase is what the forward decoder minimises, so a stream says
at each step what the offline decoder would most likely have said. Nothing here looks at ground truth: the
targets are the model's own offline decoding (a distillation, not supervision).

Chosen on the training containers of two development fleets (``ai4dl`` profile, seeds 1111 and 3131, half of
the containers fitting, the other half scoring; bench/README.md): forward-decoded ARI 0.762 -> 0.861 and
0.767 -> 0.870 with 64 hidden units, 30 epochs and a switching penalty of one nat; a linear softmax reached
0.83, a network of 16-32 units 0.85-0.86.

The network is stored as plain numbers (its input standardisation and two layers) in the phase model's
safetensors file and applied with numpy, the same numbers in the label stage, the served model and the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ai4dl.errors import ModelError

TARGET_PENALTY = 10.0
"""The switching penalty (x the model's switch gap of squared distances) of the Viterbi decoding whose phases
the classifier learns: the offline decoding's default over distances (``label.smoothing viterbi``), kept apart
from it so a change of the label stage's defaults does not silently change what training learns."""

ARRAYS = ("classifier_mean", "classifier_scale", "classifier_W1", "classifier_b1", "classifier_W2", "classifier_b2")
"""The classifier's arrays in the phase model's weights file."""


@dataclass(frozen=True, eq=False)
class PhaseClassifier:
    """One hidden ReLU layer over standardised activations, a softmax over the k phases."""

    mean: np.ndarray  # (n_hidden,)
    scale: np.ndarray  # (n_hidden,)
    W1: np.ndarray  # (units, n_hidden)
    b1: np.ndarray  # (units,)
    W2: np.ndarray  # (k, units)
    b2: np.ndarray  # (k,)

    def __post_init__(self) -> None:
        for name in ("mean", "scale", "W1", "b1", "W2", "b2"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        if self.mean.ndim != 1 or self.W1.ndim != 2 or self.W2.ndim != 2:
            raise ModelError(f"phase classifier: mean {self.mean.shape}, W1 {self.W1.shape}, W2 {self.W2.shape} "
                             "are not a vector and two matrices")
        n, units, k = self.mean.shape[0], self.W1.shape[0], self.W2.shape[0]
        shapes = {"mean": (n,), "scale": (n,), "W1": (units, n), "b1": (units,), "W2": (k, units), "b2": (k,)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise ModelError(f"phase classifier: {name} has shape {getattr(self, name).shape}, expected {shape}")
        if not all(np.isfinite(getattr(self, name)).all() for name in shapes) or not (self.scale > 0).all():
            raise ModelError("phase classifier: its numbers must be finite, its input scales positive")

    @property
    def n_inputs(self) -> int:
        return self.mean.shape[0]

    @property
    def k(self) -> int:
        return self.W2.shape[0]

    def costs(self, h: np.ndarray) -> np.ndarray:
        """(rows, k): ``-log p(phase | the step's activations)``, what the decoders minimise (in nats).

        >>> c = PhaseClassifier(np.zeros(1), np.ones(1), np.ones((1, 1)), np.zeros(1), np.array([[1.0], [-1.0]]), np.zeros(2))
        >>> np.round(np.exp(-c.costs(np.array([[0.0], [2.0]]))), 3).tolist()
        [[0.5, 0.5], [0.982, 0.018]]
        """
        z = np.maximum((np.asarray(h, dtype=np.float64) - self.mean) / self.scale @ self.W1.T + self.b1, 0.0)
        z = z @ self.W2.T + self.b2
        z = z - z.max(axis=1, keepdims=True)
        return np.log(np.exp(z).sum(axis=1, keepdims=True)) - z

    def as_dict(self) -> dict[str, np.ndarray]:
        return dict(zip(ARRAYS, (self.mean, self.scale, self.W1, self.b1, self.W2, self.b2)))

    @classmethod
    def from_dict(cls, arrays: dict[str, np.ndarray]) -> "PhaseClassifier":
        missing = [a for a in ARRAYS if a not in arrays]
        if missing:
            raise ModelError(f"phase classifier: lacks array(s) {', '.join(missing)}")
        return cls(*(arrays[a] for a in ARRAYS))


def fit_classifier(h: np.ndarray, labels: np.ndarray, k: int, units: int = 64, epochs: int = 30,
                   seed: int = 1234, batch_size: int = 256, learning_rate: float = 1e-3,
                   weight_decay: float = 1e-4) -> PhaseClassifier:
    """Fit the network to per-step ``labels`` (0..k-1) from activations ``h`` (rows, n_hidden): Adam on the
    cross-entropy, mini-batches in a seeded order, on the CPU (a few seconds for 100,000 steps). A phase no
    label names keeps a bias that makes it unlikely, never impossible."""
    import torch

    h = np.asarray(h, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    if h.ndim != 2 or len(h) != len(labels) or not len(h):
        raise ValueError(f"phase classifier: {h.shape} activations for {labels.shape} labels")
    if labels.min() < 0 or labels.max() >= k:
        raise ValueError(f"phase classifier: labels outside 0..{k - 1}")
    mean, scale = h.mean(axis=0), h.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    with torch.random.fork_rng():  # seeded here without moving the caller's global torch random state
        torch.manual_seed(int(seed))
        order = torch.Generator().manual_seed(int(seed))
        x = torch.tensor((h - mean) / scale, dtype=torch.float32)
        y = torch.tensor(labels)
        net = torch.nn.Sequential(torch.nn.Linear(h.shape[1], int(units)), torch.nn.ReLU(),
                                  torch.nn.Linear(int(units), int(k)))
        opt = torch.optim.Adam(net.parameters(), lr=learning_rate, weight_decay=weight_decay)
        for _ in range(int(epochs)):
            perm = torch.randperm(len(y), generator=order)
            for i in range(0, len(y), int(batch_size)):
                idx = perm[i:i + int(batch_size)]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
                opt.step()
    first, last = net[0], net[2]
    as_np = lambda t: t.detach().to(torch.float64).numpy().copy()  # noqa: E731
    return PhaseClassifier(mean, scale, as_np(first.weight), as_np(first.bias), as_np(last.weight), as_np(last.bias))


__all__ = ["ARRAYS", "TARGET_PENALTY", "PhaseClassifier", "fit_classifier"]
