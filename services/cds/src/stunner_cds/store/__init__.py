"""The CDS's view of the config store: mirror (pure), hub (fan-out) and Redis feed."""
