"""The HTTP plumbing the CDS and the auth service share (FastAPI, uvicorn).

Only those two import it: stunnerd, turncat and the operator do not need FastAPI, so this package
is the ``http`` extra of ``stunner-common``.
"""

from stunner_common.io.http.errors import (
    ApiError,
    ErrorStyle,
    error_response,
    install_error_handlers,
)
from stunner_common.io.http.limits import RequestLimits, protocol_class
from stunner_common.io.http.service import (
    HttpServiceSettings,
    create_service_app,
    listen_port,
    serve,
    uvicorn_server,
)

__all__ = [
    "ApiError",
    "ErrorStyle",
    "HttpServiceSettings",
    "RequestLimits",
    "create_service_app",
    "error_response",
    "install_error_handlers",
    "listen_port",
    "protocol_class",
    "serve",
    "uvicorn_server",
]
