"""Apply a new stunnerd config as a delta against the running one.

`plan` is pure: it compares two validated configs and says what must happen (reference
§2.3). `reconciler` carries a plan out against the running server and rolls back on failure.
"""
