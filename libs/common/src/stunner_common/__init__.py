"""Shared models and helpers for STUNner in Python.

Every service imports this package and none imports another service: the stunnerd config model,
the CRD and Gateway API models, the CDS wire messages and the Redis layout live here so that
writer and reader share one definition.
"""

__version__ = "0.1.0"
