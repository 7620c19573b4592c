"""The operator's only door to the Kubernetes API (kubernetes-asyncio, raw JSON).

Objects travel as plain dicts and are parsed by the shared models, exactly as in local mode.
Every call has its own timeout; a watch is a long request whose lines are read one by one.
Foreign exceptions are mapped to ``KubeApiError`` (with ``NotFoundError`` and ``GoneError``
for the two statuses callers act on) at this boundary.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from stunner_operator.k8s.resources import Resource

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


async def load_client(kubeconfig: Path | None) -> ApiClient:
    """An API client from ``kubeconfig``, else $KUBECONFIG/~/.kube/config, else in-cluster."""
    cfg = Configuration()
    try:
        await kube_config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None, client_configuration=cfg
        )
    except (kube_config.ConfigException, OSError, TypeError) as err:
        if kubeconfig is not None:
            raise KubeApiError(f"cannot load kubeconfig {kubeconfig}: {err}") from err
        # The loader has no annotations; this is its one typed entry.
        load_incluster: Callable[..., None] = kube_config.load_incluster_config
        try:
            load_incluster(client_configuration=cfg)
        except kube_config.ConfigException as err2:
            raise KubeApiError(f"no kubeconfig and not running in a cluster: {err2}") from err2
    return ApiClient(cfg)


class KubeApi:
    def __init__(self, client: ApiClient, *, timeout_s: float = 10.0) -> None:
        self._client = client
        self._timeout_s = timeout_s

    async def aclose(self) -> None:
        await self._client.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
    ) -> aiohttp.ClientResponse:
        try:
            resp: aiohttp.ClientResponse = await self._client.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=timeout_s if timeout_s is not None else self._timeout_s,
            )
        except ApiException as err:
            raise KubeApiError(f"{method} {path}: {err.reason}", err.status) from err
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            raise KubeApiError(f"{method} {path}: {type(err).__name__}: {err}") from err
        return resp

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = await self._call(method, path, **kwargs)
        try:
            async with asyncio.timeout(self._timeout_s):
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise KubeApiError(f"{method} {path}: {type(err).__name__}: {err}") from err
        finally:
            resp.release()
        if resp.status == 404:
            raise NotFoundError(f"{method} {path}: not found", 404)
        if resp.status == 410:
            raise GoneError(f"{method} {path}: gone", 410)
        if resp.status == 409:
            raise ConflictError(f"{method} {path}: conflict", 409)
        if resp.status >= 300:
            raise KubeApiError(f"{method} {path}: HTTP {resp.status}: {text[:300]}", resp.status)
        try:
            data = json.loads(text) if text else {}
        except json.JSONDecodeError as err:
            raise KubeApiError(f"{method} {path}: invalid JSON: {err}") from err
        return data if isinstance(data, dict) else {}

    async def list(self, resource: Resource) -> tuple[list[dict[str, Any]], str]:
        """All objects of ``resource`` and the list's resourceVersion."""
        data = await self._json("GET", resource.list_path())
        items = [i for i in data.get("items") or [] if isinstance(i, dict)]
        for item in items:
            # Items of a list carry no apiVersion/kind.
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", _list_kind(resource))
        return items, str((data.get("metadata") or {}).get("resourceVersion", ""))

    async def watch(
        self, resource: Resource, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) pairs until the server ends the watch."""
        query = [("watch", "true"), ("timeoutSeconds", str(timeout_s))]
        if resource_version:
            query.append(("resourceVersion", resource_version))
            query.append(("allowWatchBookmarks", "true"))
        resp = await self._call("GET", resource.list_path(), query=query, timeout_s=timeout_s + 30)
        try:
            if resp.status == 410:
                raise GoneError("watch: resourceVersion gone", 410)
            if resp.status >= 300:
                raise KubeApiError(f"watch {resource.list_path()}: HTTP {resp.status}", resp.status)
            async for raw in resp.content:
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
        except (aiohttp.ClientError, OSError) as err:
            where = resource.list_path()
            raise KubeApiError(f"watch {where}: {type(err).__name__}: {err}") from err
        finally:
            resp.release()

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", resource.object_path(namespace, name))
        except NotFoundError:
            return None

    async def create(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"].get("namespace", "")
        return await self._json("POST", resource.collection_path(namespace), body=dict(body))

    async def update(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch ``body`` in; a metadata.resourceVersion in it makes the API server
        refuse (409, ``ConflictError``) if the object changed since it was read."""
        meta = body["metadata"]
        path = resource.object_path(meta.get("namespace", ""), meta["name"])
        return await self._json(
            "PATCH", path, body=dict(body), content_type="application/merge-patch+json"
        )

    async def patch_status(
        self, resource: Resource, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        await self._json(
            "PATCH",
            resource.object_path(namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def apply(self, resource: Resource, manifest: Mapping[str, Any]) -> None:
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

    async def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete an object; False if it was not there."""
        try:
            await self._json("DELETE", resource.object_path(namespace, name))
        except NotFoundError:
            return False
        return True


def _list_kind(resource: Resource) -> str:
    return "UDPRoute" if resource.kind == "UDPRouteV1A2" else resource.kind
