"""Allocation policies: ``rules`` (what each policy decides, and how it reacts to an OOM kill), ``replay`` (the
pure per-container replay and its metrics), ``calibration`` (service levels, knobs chosen on training containers,
scored held out), ``nextphase`` (next-phase prediction), ``model`` (``PolicyEstimator.fit -> PolicyModel``, the
fitted, versioned policy half of the method), ``live`` (a container's deployed policies from running summaries),
``fleet`` (the replay and statistics over a fleet in Spark), ``formatting`` (the comparison table), ``k8s``
(Kubernetes objects), ``vpa`` (the Kubernetes VPA recommender, decision for decision)."""
