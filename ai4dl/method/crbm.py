"""The Conditional RBM that turns a window of resource usage into a hidden-unit code.

Gaussian visible units (unit variance, so the visible mean is linear) and sigmoid hidden units, both
conditioned on the flattened history of the previous ``n_history`` steps. The history vector is
time-major, oldest first: ``[x(t-N) features..., x(t-N+1) features..., ..., x(t-1) features...]``.

Training follows the original AI4DL tool: mean-field contrastive divergence (CD-k) with plain gradient
ascent, one update per mini-batch.

torch is imported lazily. :class:`CRBMWeights` and :func:`encode` are numpy-only because encoding runs
inside Spark executors, which need not have torch installed; :class:`CRBM` (a ``torch.nn.Module``) and
:func:`train_crbm` import torch on first use. ``from ai4dl.method.crbm import CRBM`` still works: the class is
built on first access through the module ``__getattr__``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ai4dl.config import TrainConfig, WindowConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

# The training section's defaults are the only ones (ai4dl.config): a CRBM built or trained without a value
# gets what `ai4dl train` would use.
_TRAIN = TrainConfig()
_N_HISTORY = WindowConfig().n_history

__all__ = ["CRBM", "CRBMWeights", "TrainResult", "encode", "train_crbm"]

WEIGHT_KEYS = ("W", "B", "A", "v_bias", "h_bias")

# Standard deviation of the initial W, A and B; small, so the first hidden codes sit near 0.5.
INIT_STD = 0.01


@dataclass(frozen=True, eq=False)
class CRBMWeights:
    """What a saved model holds; torch-free so executors can encode with it.

    Arrays are copied to read-only float64 on construction, so a frozen instance really is immutable and
    can be shared between threads and broadcast without defensive copies.
    """

    W: np.ndarray
    B: np.ndarray
    A: np.ndarray
    v_bias: np.ndarray
    h_bias: np.ndarray

    def __post_init__(self) -> None:
        for key in WEIGHT_KEYS:
            arr = np.array(getattr(self, key), dtype=np.float64, copy=True)
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)

        if self.W.ndim != 2 or self.W.shape[0] < 1 or self.W.shape[1] < 1:
            raise ValueError(f"CRBMWeights: W must be 2-D (n_hidden, n_visible), got shape {self.W.shape}")
        n_hidden, n_visible = self.W.shape
        if self.B.ndim != 2 or self.B.shape[0] != n_hidden or self.B.shape[1] < n_visible:
            raise ValueError(
                f"CRBMWeights: B must have shape ({n_hidden}, {n_visible} * n_history), got {self.B.shape}"
            )
        if self.B.shape[1] % n_visible:
            raise ValueError(
                f"CRBMWeights: B has {self.B.shape[1]} columns, not a multiple of n_visible={n_visible}"
            )
        n_cond = self.B.shape[1]
        expected = {"A": (n_visible, n_cond), "v_bias": (n_visible,), "h_bias": (n_hidden,)}
        for key, shape in expected.items():
            got = getattr(self, key).shape
            if got != shape:
                raise ValueError(f"CRBMWeights: {key} must have shape {shape}, got {got}")
        for key in WEIGHT_KEYS:
            if not np.isfinite(getattr(self, key)).all():
                raise ValueError(f"CRBMWeights: {key} contains non-finite values")

    @property
    def n_visible(self) -> int:
        return int(self.W.shape[1])

    @property
    def n_hidden(self) -> int:
        return int(self.W.shape[0])

    @property
    def n_history(self) -> int:
        return int(self.B.shape[1] // self.W.shape[1])

    def as_dict(self) -> dict[str, np.ndarray]:
        return {key: getattr(self, key) for key in WEIGHT_KEYS}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CRBMWeights:
        missing = [k for k in WEIGHT_KEYS if k not in d]
        extra = sorted(set(d) - set(WEIGHT_KEYS))
        if missing or extra:
            raise ValueError(
                f"CRBMWeights.from_dict: expected keys {list(WEIGHT_KEYS)}; missing {missing}, unexpected {extra}"
            )
        return cls(**{k: d[k] for k in WEIGHT_KEYS})


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # exp of -|z| never overflows, so large negative pre-activations give 0 without a RuntimeWarning.
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _check_pair(x: np.ndarray, cond: np.ndarray, n_visible: int, n_cond: int, where: str) -> None:
    if x.ndim != 2 or x.shape[1] != n_visible:
        raise ValueError(f"{where}: x must have shape (n, {n_visible}), got {x.shape}")
    if cond.ndim != 2 or cond.shape[1] != n_cond:
        raise ValueError(f"{where}: cond must have shape (n, {n_cond}), got {cond.shape}")
    if x.shape[0] != cond.shape[0]:
        raise ValueError(f"{where}: x has {x.shape[0]} rows but cond has {cond.shape[0]}")


def encode(weights: CRBMWeights, x: np.ndarray, cond: np.ndarray) -> np.ndarray:
    """Hidden means for a batch, in float64, with one matrix product over the concatenated inputs.

    numpy-only so it runs in executors without torch. Non-finite inputs are not rejected here (that
    costs a pass over every batch); they propagate as NaN codes.
    """
    x = np.asarray(x, dtype=np.float64)
    cond = np.asarray(cond, dtype=np.float64)
    _check_pair(x, cond, weights.n_visible, weights.B.shape[1], "encode")
    # [x | cond] @ [W | B].T: a single GEMM instead of two plus an add.
    z = np.concatenate([x, cond], axis=1) @ np.concatenate([weights.W, weights.B], axis=1).T
    z += weights.h_bias
    return _sigmoid(z)


_CRBM_CLASS: type | None = None


def _build_crbm_class() -> type:
    import torch

    class CRBM(torch.nn.Module):
        """Conditional RBM with gradients computed by hand (CD-k), not by autograd.

        Parameters are registered with ``requires_grad=False`` so ``.to(device)`` and ``state_dict`` work
        while no autograd graph is ever built.
        """

        def __init__(
            self,
            n_visible: int,
            n_hidden: int = _TRAIN.n_hidden,
            n_history: int = _N_HISTORY,
            seed: int = _TRAIN.seed,
            dtype: torch.dtype = torch.float32,
        ) -> None:
            super().__init__()
            for name, value in (("n_visible", n_visible), ("n_hidden", n_hidden), ("n_history", n_history)):
                if int(value) != value or value < 1:
                    raise ValueError(f"CRBM: {name} must be a positive integer, got {value!r}")
            self.n_visible = int(n_visible)
            self.n_hidden = int(n_hidden)
            self.n_history = int(n_history)
            n_cond = self.n_visible * self.n_history
            # Drawn in float64 on the CPU so the initial weights do not depend on dtype or device.
            gen = torch.Generator().manual_seed(int(seed))

            def normal(*shape: int) -> torch.nn.Parameter:
                t = torch.randn(*shape, generator=gen, dtype=torch.float64) * INIT_STD
                return torch.nn.Parameter(t.to(dtype), requires_grad=False)

            def zeros(n: int) -> torch.nn.Parameter:
                return torch.nn.Parameter(torch.zeros(n, dtype=dtype), requires_grad=False)

            self.W = normal(self.n_hidden, self.n_visible)
            self.B = normal(self.n_hidden, n_cond)
            self.A = normal(self.n_visible, n_cond)
            self.v_bias = zeros(self.n_visible)
            self.h_bias = zeros(self.n_hidden)
            # Separate stream for Bernoulli hidden samples, so sampling never shifts the initialisation.
            self._sample_gen = torch.Generator().manual_seed(int(seed) + 1)

        def hidden_mean(self, v: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(v @ self.W.T + cond @ self.B.T + self.h_bias)

        def visible_mean(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
            # Gaussian visibles with unit variance: the conditional mean is linear, no squashing.
            return h @ self.W + cond @ self.A.T + self.v_bias

        def _drive(self, h: torch.Tensor, sample_hidden: bool) -> torch.Tensor:
            if not sample_hidden:
                return h
            # Drawn on the CPU generator and moved, so a seed gives the same samples on any device.
            u = torch.rand(h.shape, generator=self._sample_gen, dtype=h.dtype).to(h.device)
            return (u < h).to(h.dtype)

        def _check_batch(self, v: torch.Tensor, cond: torch.Tensor) -> None:
            n_cond = self.n_visible * self.n_history
            if v.ndim != 2 or v.shape[1] != self.n_visible:
                raise ValueError(f"CRBM: v must have shape (n, {self.n_visible}), got {tuple(v.shape)}")
            if cond.ndim != 2 or cond.shape[1] != n_cond:
                raise ValueError(f"CRBM: cond must have shape (n, {n_cond}), got {tuple(cond.shape)}")
            if v.shape[0] != cond.shape[0] or v.shape[0] == 0:
                raise ValueError(
                    f"CRBM: v and cond need the same, non-zero number of rows; got {v.shape[0]} and {cond.shape[0]}"
                )

        @torch.no_grad()
        def cd_gradients(
            self, v: torch.Tensor, cond: torch.Tensor, k: int = 1, sample_hidden: bool = False
        ) -> tuple[dict[str, torch.Tensor], float]:
            """Likelihood-ascent directions from CD-k, batch-averaged, and the reconstruction error.

            The reconstruction error is the mean over rows of ``sum((v - v_neg) ** 2)`` across features,
            with ``v_neg`` the final visible state of the k-step chain (the same negative sample the
            gradient uses), so it is comparable to the squared error the original tool reports.

            Mean-field by default, so results are deterministic; ``sample_hidden`` drives each visible
            reconstruction from Bernoulli samples of the hidden means (statistics still use the means).
            """
            if int(k) != k or k < 1:
                raise ValueError(f"CRBM: k must be a positive integer, got {k!r}")
            self._check_batch(v, cond)
            n = v.shape[0]
            v_pos = v
            h_pos = self.hidden_mean(v_pos, cond)
            v_neg = self.visible_mean(self._drive(h_pos, sample_hidden), cond)
            h_neg = self.hidden_mean(v_neg, cond)
            for _ in range(int(k) - 1):
                v_neg = self.visible_mean(self._drive(h_neg, sample_hidden), cond)
                h_neg = self.hidden_mean(v_neg, cond)
            dv = v_pos - v_neg
            dh = h_pos - h_neg
            grads = {
                "W": (h_pos.T @ v_pos - h_neg.T @ v_neg) / n,
                "B": dh.T @ cond / n,
                "A": dv.T @ cond / n,
                "v_bias": dv.mean(dim=0),
                "h_bias": dh.mean(dim=0),
            }
            rec_error = float((dv * dv).sum(dim=1).mean().item())
            return grads, rec_error

        @torch.no_grad()
        def cd_step(
            self, v: torch.Tensor, cond: torch.Tensor, lr: float, k: int = 1, sample_hidden: bool = False
        ) -> float:
            """One CD-k update in place; returns the reconstruction error measured before the update."""
            grads, rec_error = self.cd_gradients(v, cond, k=k, sample_hidden=sample_hidden)
            for key, g in grads.items():
                getattr(self, key).add_(g, alpha=lr)
            return rec_error

        def weights(self) -> CRBMWeights:
            return CRBMWeights(
                **{key: getattr(self, key).detach().cpu().to(torch.float64).numpy() for key in WEIGHT_KEYS}
            )

        @classmethod
        def from_weights(cls, w: CRBMWeights, dtype: torch.dtype = torch.float32) -> CRBM:
            model = cls(w.n_visible, w.n_hidden, w.n_history, dtype=dtype)
            with torch.no_grad():
                for key in WEIGHT_KEYS:
                    # copy(): the CRBMWeights arrays are read-only, which torch.from_numpy warns about.
                    getattr(model, key).copy_(torch.from_numpy(getattr(w, key).copy()))
            return model

    # Make the lazily built class picklable and print like a top-level one.
    CRBM.__module__ = __name__
    CRBM.__qualname__ = "CRBM"
    return CRBM


def __getattr__(name: str) -> Any:
    global _CRBM_CLASS
    if name == "CRBM":
        if _CRBM_CLASS is None:
            _CRBM_CLASS = _build_crbm_class()
        return _CRBM_CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class TrainResult:
    weights: CRBMWeights
    # Mean reconstruction error per epoch run, including the epochs after the best one.
    epoch_errors: list[float] = field(default_factory=list)
    epochs_run: int = 0
    stopped_early: bool = False
    seconds: float = 0.0
    device: str = "cpu"

    @property
    def best_error(self) -> float:
        return min(self.epoch_errors) if self.epoch_errors else float("nan")


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train_crbm: device {device!r} requested but CUDA is not available")
    return str(device)


def _validate_training_data(x: np.ndarray, cond: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    x = np.asarray(x)
    cond = np.asarray(cond)
    if x.ndim != 2:
        raise ValueError(f"train_crbm: x must be 2-D (n, n_visible), got shape {x.shape}")
    if cond.ndim != 2:
        raise ValueError(f"train_crbm: cond must be 2-D (n, n_visible * n_history), got shape {cond.shape}")
    if x.shape[0] != cond.shape[0]:
        raise ValueError(f"train_crbm: x has {x.shape[0]} rows but cond has {cond.shape[0]}")
    if x.shape[0] == 0:
        raise ValueError("train_crbm: no training rows (x and cond are empty)")
    n_visible = x.shape[1]
    if n_visible == 0:
        raise ValueError("train_crbm: x has no feature columns")
    if cond.shape[1] == 0 or cond.shape[1] % n_visible:
        raise ValueError(
            f"train_crbm: cond has {cond.shape[1]} columns, which is not a positive multiple of "
            f"n_visible={n_visible} (expected n_visible * n_history)"
        )
    for name, arr in (("x", x), ("cond", cond)):
        if not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"train_crbm: {name} must be numeric, got dtype {arr.dtype}")
        bad = ~np.isfinite(arr)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise ValueError(f"train_crbm: {name} has {int(bad.sum())} non-finite values (first in row {row})")
    return x, cond, cond.shape[1] // n_visible


def train_crbm(
    x: np.ndarray,
    cond: np.ndarray,
    *,
    n_hidden: int = _TRAIN.n_hidden,
    cd_k: int = _TRAIN.cd_k,
    epochs: int = _TRAIN.epochs,
    batch_size: int = _TRAIN.batch_size,
    learning_rate: float = _TRAIN.learning_rate,
    patience: int = _TRAIN.patience,
    min_delta: float = _TRAIN.min_delta,
    seed: int = _TRAIN.seed,
    device: str = _TRAIN.device,
    progress: bool | None = None,
    log: Callable[[str], Any] | None = print,
    sample_hidden: bool = False,
    dtype: str = "float32",
    epoch_sync: Callable[[Any, float], float] | None = None,
    threads: int | None = 1,
) -> TrainResult:
    """Mini-batch CD-k with early stopping; returns the weights of the best epoch, not the last.

    The only randomness is the seeded initialisation and a numpy ``default_rng(seed)`` shuffle per epoch
    (plus the hidden samples when ``sample_hidden``), so two runs with the same seed on the same device
    give bit-identical weights. Training stops once the epoch-mean reconstruction error has failed to
    improve on the best by more than ``min_delta`` for ``patience`` consecutive epochs.

    ``epoch_sync(model, epoch_error) -> epoch_error`` runs after every epoch: data-parallel training passes one
    that averages the parameters and the error over all ranks, so every rank continues from, and stops on,
    the same numbers (see :func:`ai4dl.training.train_distributed`).

    ``threads`` caps torch's intra-op threads on CPU for the duration (None: leave torch's default). The
    matrices are tiny (a batch times a few dozen units), so extra threads only add synchronisation: measured
    here, one CD step took 0.5 ms on one thread and 8-24 ms on two on a busy 2-core machine.
    """
    import torch

    x, cond, n_history = _validate_training_data(x, cond)
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("patience", patience), ("cd_k", cd_k)):
        if int(value) != value or value < 1:
            raise ValueError(f"train_crbm: {name} must be a positive integer, got {value!r}")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"train_crbm: dtype must be 'float32' or 'float64', got {dtype!r}")
    torch_dtype = getattr(torch, dtype)
    dev = _resolve_device(device)
    if log is None:
        log = lambda _msg: None  # noqa: E731
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", lambda: False)())

    n, n_visible = x.shape
    previous_threads = torch.get_num_threads()
    if threads is not None and dev == "cpu":
        torch.set_num_threads(int(threads))
    model = _build_model(n_visible, n_hidden, n_history, seed, torch_dtype).to(dev)
    xt = torch.as_tensor(np.ascontiguousarray(x), dtype=torch_dtype).to(dev)
    ct = torch.as_tensor(np.ascontiguousarray(cond), dtype=torch_dtype).to(dev)
    rng = np.random.default_rng(seed)

    bar = _progress_bar(int(epochs), progress, log)
    best_err = float("inf")
    best_weights = model.weights()
    epoch_errors: list[float] = []
    since_best = 0
    stopped_early = False
    t_start = time.perf_counter()
    try:
        for epoch in range(1, int(epochs) + 1):
            t_epoch = time.perf_counter()
            order = torch.from_numpy(rng.permutation(n)).to(dev)
            total = 0.0
            for start in range(0, n, int(batch_size)):
                idx = order[start : start + int(batch_size)]
                err = model.cd_step(xt[idx], ct[idx], learning_rate, k=int(cd_k), sample_hidden=sample_hidden)
                total += err * idx.shape[0]
            epoch_err = total / n
            if epoch_sync is not None:
                epoch_err = float(epoch_sync(model, epoch_err))
            epoch_errors.append(epoch_err)
            if not np.isfinite(epoch_err):
                raise FloatingPointError(
                    f"train_crbm: reconstruction error became {epoch_err} in epoch {epoch}; "
                    f"training diverged, lower learning_rate (now {learning_rate}) or rescale the inputs"
                )
            if bar is None:  # a terminal shows the bar; a log file gets one plain line per epoch instead
                log(f"epoch {epoch:3d}  rec_error {epoch_err:.6f}  {time.perf_counter() - t_epoch:.2f}s")
            else:
                bar.update(1)
                bar.set_postfix(rec_error=f"{epoch_err:.5f}")
            if epoch_err < best_err - min_delta:
                best_err = epoch_err
                best_weights = model.weights()
                since_best = 0
            else:
                since_best += 1
                if since_best >= patience:
                    stopped_early = epoch < epochs
                    break
    finally:
        if bar is not None:
            bar.close()
        torch.set_num_threads(previous_threads)

    return TrainResult(
        weights=best_weights,
        epoch_errors=epoch_errors,
        epochs_run=len(epoch_errors),
        stopped_early=stopped_early,
        seconds=time.perf_counter() - t_start,
        device=dev,
    )


def _build_model(n_visible: int, n_hidden: int, n_history: int, seed: int, dtype: Any) -> Any:
    return __getattr__("CRBM")(n_visible, n_hidden, n_history, seed=seed, dtype=dtype)


def _progress_bar(total: int, enabled: bool, log: Callable[[str], Any]) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        # tqdm is a convenience, not a dependency; the per-epoch log lines carry the same information.
        log("train_crbm: tqdm is not installed, no progress bar")
        return None
    return tqdm(total=total, desc="CRBM", unit="epoch", file=sys.stderr)
