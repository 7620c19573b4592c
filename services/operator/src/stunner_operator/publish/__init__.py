"""Publishing rendered configs to Redis."""
