"""Allocation policies: ``replay`` (the pure per-container replay and metrics, numpy), ``fleet`` (the replay
over a fleet in Spark and its summary), ``vpa`` (the Kubernetes VPA recommender, decision for decision)."""
