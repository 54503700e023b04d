"""The AI4DL method: scale and window traces, encode windows with a CRBM, cluster encodings into phases.

``scaler`` (standardisation fitted on training containers), ``split`` (which containers train), ``windowing``
(sliding windows in Spark), ``crbm`` (the conditional RBM: numpy encode, PyTorch training), ``clustering``
(Spark ML k-means, ARI), ``model`` (the fitted :class:`~ai4dl.method.model.PhaseModel` and its checksummed
directory), ``labelling`` (the per-batch kernel and the two Arrow engines), ``training`` (the estimator:
``PhaseEstimator.fit(windows) -> PhaseModel``), ``reference`` (import of the original AI4DL model).
"""
