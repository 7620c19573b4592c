"""STUNner in Python: the TURN dataplane."""

__version__ = "0.1.0"
