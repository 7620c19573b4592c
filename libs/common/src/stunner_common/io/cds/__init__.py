"""The one CDS client (``CdsClient``: REST, the v1 and ``stunner.cds.v2`` watches) and the bearer
token it sends (``TokenSource``). The wire it speaks is the pure ``stunner_common.cds``."""

from stunner_common.io.cds import client
from stunner_common.io.cds.client import *  # noqa: F403  (its __all__: the client and its errors)
from stunner_common.io.cds.token import TokenSource, token_source

__all__ = [*client.__all__, "TokenSource", "token_source"]
