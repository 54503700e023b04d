"""ai4dl: phases of deep-learning training containers, mined on Spark + Delta Lake (the AI4DL method)."""

__version__ = "0.1.0"
