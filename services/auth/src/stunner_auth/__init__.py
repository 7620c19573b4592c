"""The STUNner authentication service: TURN credentials and ICE configs, fed live from the CDS."""

__version__ = "0.1.0"
