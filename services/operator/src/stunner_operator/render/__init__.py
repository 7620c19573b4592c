"""Pure rendering of Gateway API objects into stunnerd configs and statuses."""
