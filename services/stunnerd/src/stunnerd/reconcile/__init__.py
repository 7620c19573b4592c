"""Apply a new stunnerd config as a delta against the running one.

`plan` is pure: it compares two validated configs and says what must happen (which
listeners restart, which only swap their policies: services/stunnerd/README.md).
`reconciler.Reconciler` is the one path a config takes (the dataplane, then the admin
endpoints); `listeners.ListenerReconciler` carries a plan out against this process's listeners
and rolls back on failure; `dataplane.Dataplane` is the interface between the two.
"""
