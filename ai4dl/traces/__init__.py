"""Where container traces come from: ``ingest`` (exports into bronze, bad rows to quarantine) and
``synthetic`` (a generated fleet with ground-truth behaviours)."""
