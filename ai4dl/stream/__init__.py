"""Live phases and recommendations: a Structured Streaming job over the lake (``ai4dl stream``).

:mod:`ai4dl.stream.online` is the pure per-container step (no Spark); :mod:`ai4dl.stream.query` runs it in
Spark's state store and writes the results exactly once.
"""
