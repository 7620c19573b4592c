"""The one Kubernetes API client of the workspace (httpx, raw JSON).

Every process that talks to an API server goes through :class:`KubeApi`: the operator lists,
watches, applies and patches its resources; turncat, stunnerctl and stunnerd (``-c k8s``) list
pods and read the CDS token Secret to find the CDS (:mod:`stunner_common.io.kube.forward`, whose
port-forward WebSockets carry the same credentials). Where the API server is and who the client
is comes from :mod:`stunner_common.io.kube.config`: a kubeconfig as kubectl reads it, or the
pod's service account (:func:`load_access` tries them in that order).

Objects travel as plain dicts and are parsed by the callers' models. Every call has its own
timeout; a watch is a long request whose lines are read one by one. Transport failures and
refusals are :class:`KubeApiError` (with ``NotFoundError``, ``GoneError`` and ``ConflictError``
for the statuses callers act on).
"""

from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from stunner_common.io.kube.config import (
    KubeAccess,
    KubeDiscoveryError,
    KubeOptions,
    in_cluster_access,
    load_kubeconfig,
)

__all__ = [
    "FIELD_MANAGER",
    "ApiResource",
    "ConflictError",
    "GoneError",
    "KubeApi",
    "KubeApiError",
    "NotFoundError",
    "load_access",
]

FIELD_MANAGER = "stunner-gateway-operator"


class KubeApiError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFoundError(KubeApiError):
    pass


class GoneError(KubeApiError):
    """The watch's resourceVersion is too old: list again."""


class ConflictError(KubeApiError):
    """The object changed (or exists) since it was read: read it again."""


class ApiResource(Protocol):
    """What the client needs of a resource: its apiVersion, the kind of its objects and its
    REST paths (``stunner_operator.k8s.resources.Resource`` is one)."""

    @property
    def api_version(self) -> str: ...

    @property
    def object_kind(self) -> str: ...

    def list_path(self) -> str: ...

    def collection_path(self, namespace: str) -> str: ...

    def object_path(self, namespace: str, name: str, subresource: str = "") -> str: ...


def load_access(kubeconfig: Path | None, env: Mapping[str, str]) -> KubeAccess:
    """The API server and credentials from ``kubeconfig``, else from ``KUBECONFIG`` or
    ``~/.kube/config``, else from the pod's service account."""
    try:
        return load_kubeconfig(KubeOptions(str(kubeconfig) if kubeconfig else None), env)
    except KubeDiscoveryError as err:
        if kubeconfig is not None:
            raise KubeApiError(f"cannot load kubeconfig {kubeconfig}: {err}") from err
    try:
        return in_cluster_access(env)
    except KubeDiscoveryError as err2:
        raise KubeApiError(f"no kubeconfig and not running in a cluster: {err2}") from err2


class KubeApi:
    """Authenticated REST calls to one API server."""

    def __init__(self, access: KubeAccess, timeout_s: float = 10.0) -> None:
        self.access = access
        self._timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            base_url=access.server, verify=access.ssl_context, timeout=timeout_s
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def _request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: Any,
        content_type: str,
        timeout: httpx.Timeout | float,
    ) -> httpx.Request:
        return self._http.build_request(
            method,
            path,
            params=tuple(query or ()),
            content=None if body is None else json.dumps(body).encode(),
            headers={
                "Content-Type": content_type,
                "Accept": "application/json",
                **self.access.headers,
            },
            timeout=timeout,
        )

    async def _json(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        request = self._request(method, path, query, body, content_type, self._timeout_s)
        try:
            async with asyncio.timeout(self._timeout_s):
                resp = await self._http.send(request)
        except (httpx.HTTPError, OSError, TimeoutError) as err:
            raise KubeApiError(f"{method} {path}: {type(err).__name__}: {err}") from err
        text = resp.text
        if resp.status_code == 404:
            raise NotFoundError(f"{method} {path}: not found", 404)
        if resp.status_code == 410:
            raise GoneError(f"{method} {path}: gone", 410)
        if resp.status_code == 409:
            raise ConflictError(f"{method} {path}: conflict", 409)
        if resp.status_code >= 300:
            raise KubeApiError(
                f"{method} {path}: HTTP {resp.status_code}: {text[:300]}", resp.status_code
            )
        try:
            data = json.loads(text) if text else {}
        except json.JSONDecodeError as err:
            raise KubeApiError(f"{method} {path}: invalid JSON: {err}") from err
        return data if isinstance(data, dict) else {}

    async def list(self, resource: ApiResource) -> tuple[list[dict[str, Any]], str]:
        """All objects of ``resource`` and the list's resourceVersion."""
        data = await self._json("GET", resource.list_path())
        items = [i for i in data.get("items") or [] if isinstance(i, dict)]
        for item in items:
            # Items of a list carry no apiVersion/kind.
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.object_kind)
        return items, str((data.get("metadata") or {}).get("resourceVersion", ""))

    async def watch(
        self, resource: ApiResource, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) pairs until the server ends the watch."""
        query = [("watch", "true"), ("timeoutSeconds", str(timeout_s))]
        if resource_version:
            query.append(("resourceVersion", resource_version))
            query.append(("allowWatchBookmarks", "true"))
        where = resource.list_path()
        timeout = httpx.Timeout(self._timeout_s, read=timeout_s + 30)
        request = self._request("GET", where, query, None, "application/json", timeout)
        try:
            resp = await self._http.send(request, stream=True)
        except (httpx.HTTPError, OSError) as err:
            raise KubeApiError(f"GET {where}: {type(err).__name__}: {err}") from err
        try:
            if resp.status_code == 410:
                raise GoneError("watch: resourceVersion gone", 410)
            if resp.status_code >= 300:
                raise KubeApiError(f"watch {where}: HTTP {resp.status_code}", resp.status_code)
            async for raw in resp.aiter_lines():
                line = raw.strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                etype = event.get("type")
                obj = event.get("object")
                if not isinstance(obj, dict) or not isinstance(etype, str):
                    continue
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise GoneError("watch: resourceVersion gone", 410)
                    raise KubeApiError(f"watch error: {obj.get('message', obj)}", obj.get("code"))
                yield etype, obj
        except (httpx.HTTPError, OSError) as err:
            raise KubeApiError(f"watch {where}: {type(err).__name__}: {err}") from err
        finally:
            await resp.aclose()

    async def get(self, resource: ApiResource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", resource.object_path(namespace, name))
        except NotFoundError:
            return None

    async def create(self, resource: ApiResource, body: Mapping[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"].get("namespace", "")
        return await self._json("POST", resource.collection_path(namespace), body=dict(body))

    async def update(self, resource: ApiResource, body: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch ``body`` in; a metadata.resourceVersion in it makes the API server
        refuse (409, ``ConflictError``) if the object changed since it was read."""
        meta = body["metadata"]
        path = resource.object_path(meta.get("namespace", ""), meta["name"])
        return await self._json(
            "PATCH", path, body=dict(body), content_type="application/merge-patch+json"
        )

    async def patch_status(
        self, resource: ApiResource, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        await self._json(
            "PATCH",
            resource.object_path(namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def apply(self, resource: ApiResource, manifest: Mapping[str, Any]) -> None:
        """Server-side apply of ``manifest`` (created where the server does not do so itself)."""
        meta = manifest["metadata"]
        path = resource.object_path(meta.get("namespace", ""), meta["name"])
        try:
            await self._json(
                "PATCH",
                path,
                body=dict(manifest),
                content_type="application/apply-patch+yaml",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            )
        except NotFoundError:
            await self._json(
                "POST", resource.collection_path(meta.get("namespace", "")), body=dict(manifest)
            )

    async def delete(self, resource: ApiResource, namespace: str, name: str) -> bool:
        """Delete an object; False if it was not there."""
        try:
            await self._json("DELETE", resource.object_path(namespace, name))
        except NotFoundError:
            return False
        return True

    async def list_pods(
        self, namespace: str | None, selector: str, what: str
    ) -> builtins.list[Any]:
        """The pods matching ``selector`` in ``namespace`` (None: every namespace), sorted by
        namespace and name; a failure is a :class:`KubeDiscoveryError` that says ``what``."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"
        try:
            listing = await self._json("GET", path, query=[("labelSelector", selector)])
        except KubeApiError as err:
            raise self._discovery_error(err, what) from None
        return sorted(
            listing.get("items") or [],
            key=lambda pod: (pod["metadata"]["namespace"], pod["metadata"]["name"]),
        )

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Secret, or None when it is absent, not readable or the server is not reached."""
        try:
            return await self._json(
                "GET", f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}"
            )
        except KubeApiError:
            return None

    def _discovery_error(self, err: KubeApiError, what: str) -> KubeDiscoveryError:
        access = self.access
        if err.status in (401, 403):
            who = "the credentials were refused" if err.status == 401 else "forbidden"
            return KubeDiscoveryError(
                f"{what}: {who} by the API server at {access.server} "
                f"(context {access.context!r}, HTTP {err.status})",
                "forbidden",
            )
        if err.status is not None:
            return KubeDiscoveryError(f"{what}: the API server answered HTTP {err.status}")
        cause = err.__cause__
        return KubeDiscoveryError(
            f"cannot reach the API server at {access.server}: {cause or type(cause).__name__}",
            "unreachable",
        )
