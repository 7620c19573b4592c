"""STUNner in Python: the config discovery service."""

__version__ = "0.1.0"
