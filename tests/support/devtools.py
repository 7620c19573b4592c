"""Drive a headless Chromium page through the DevTools protocol (its browser WebSocket).

``devtools_page`` attaches to the first page and yields ``evaluate``: it runs a JavaScript
expression there, awaits the promise it returns and gives back its value, retrying while the
page's first document is still being replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import websockets

Evaluate = Callable[[str], Awaitable[Any]]


@contextlib.asynccontextmanager
async def devtools_page(browser_ws: str) -> AsyncIterator[Evaluate]:
    """Attach to the browser's page; yield a function that evaluates (and awaits) JavaScript."""
    async with websockets.connect(browser_ws, max_size=None) as ws:
        ids = iter(range(1, 1_000_000))

        async def call(method: str, params: dict[str, Any], session: str | None = None) -> Any:
            msg_id = next(ids)
            msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
            if session:
                msg["sessionId"] = session
            await ws.send(json.dumps(msg))
            while True:
                reply = json.loads(await ws.recv())
                if reply.get("id") == msg_id:
                    if "error" in reply:
                        raise RuntimeError(reply["error"])
                    return reply["result"]

        targets = (await call("Target.getTargets", {}))["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        session = (
            await call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})
        )["sessionId"]

        async def evaluate(expression: str) -> Any:
            for _attempt in range(50):  # the first document may still be replaced by the page
                try:
                    result = await call(
                        "Runtime.evaluate",
                        {"expression": expression, "awaitPromise": True, "returnByValue": True},
                        session,
                    )
                except RuntimeError as exc:
                    if "context" not in str(exc):
                        raise
                    await asyncio.sleep(0.1)
                    continue
                if "exceptionDetails" in result:
                    raise RuntimeError(result["exceptionDetails"])
                return result["result"].get("value")
            raise RuntimeError("the page never settled")

        yield evaluate
