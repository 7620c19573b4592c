"""STUNner in Python: the TURN tunnel CLI."""

__version__ = "0.1.0"
