"""STUNner in Python: the gateway operator."""

__version__ = "0.1.0"
