"""Behaviour of containers over phases: ``runs`` (run-length encoding, pure), ``sequences`` (the same in Spark,
transition and dwell counts), ``graph`` (the transition graph and prototype tree, networkx), ``phase_stats``
(the gold per-phase statistics and BI views)."""
