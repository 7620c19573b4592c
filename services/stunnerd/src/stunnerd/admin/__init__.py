"""The operations surface of stunnerd: health probes, the status document and Prometheus metrics.

Both HTTP servers are a few lines of plain asyncio: they serve three fixed GET paths, and a web
framework would be the biggest dependency of the dataplane for no gain.
"""
