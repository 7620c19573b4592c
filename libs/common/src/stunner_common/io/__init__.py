"""The I/O half of the shared library: every module here talks to something outside the process.

- ``io.cds``: the one CDS client (REST and WebSocket watch, v1 and ``stunner.cds.v2``) and the
  bearer token it sends (``CDS_TOKEN``, ``CDS_TOKEN_FILE``).
- ``io.store``: the Redis config store, its one writer (the operator) and one reader (the CDS).
- ``io.http``: the FastAPI/uvicorn plumbing of the CDS and the auth service (the ``http`` extra).
- ``io.kube``: the Kubernetes API: kubeconfig and in-cluster credentials, the one API client, the
  port-forward that finds the CDS from a laptop.
- ``io.probe_http``: the tiny HTTP/1.1 server of the health and metrics probes.

The rest of ``stunner_common`` (models, CRDs, codecs, framing, contracts, token math) does no I/O
and imports nothing from here; ``lint-imports`` keeps it so.
"""
