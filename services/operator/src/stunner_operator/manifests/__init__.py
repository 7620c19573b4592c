"""Local mode: the same YAML read from a folder instead of a cluster."""
