"""What people look at: ``plots`` (a trace by phase, phase distributions, graphs, savings) and ``html`` (the
self-contained run report)."""
