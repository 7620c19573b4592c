"""The handoff's plain transport: documents and sockets, knowing no server, worker or setting.

`state` is the versioned document; `channel` the Unix socket that carries it with the sockets;
`records` turns a live allocation into the document's record and journals it; `journal` is a
worker's journal of those records, kept by its supervisor and handed to its replacement.
"""
