"""Handing a running stunnerd's sockets and allocation state to its replacement.

`state` is the versioned document; `channel` the Unix socket that carries it with the sockets;
`records` turns a live allocation into the document's record and journals it.
"""
