"""Headless Chromium driven over the Chrome DevTools Protocol (a websocket, through aiohttp):
no driver binary and no browser download, only Debian's ``chromium``.

Clicks and typing go through ``Input.*`` events, as a person's would, not through
``element.click()``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            future = self._waiting.pop(data.get("id", -1), None)
            if future is None or future.done():
                continue  # an event: not needed here
            if "error" in data:
                future.set_exception(RuntimeError(f"CDP error: {data['error']}"))
            else:
                future.set_result(data.get("result", {}))

    async def send(self, method: str, **params: Any) -> Any:
        ident = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        async with asyncio.timeout(15):
            return await future

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        problem = ""
        while True:
            try:
                value = await self.evaluate(expression)
            except (AssertionError, RuntimeError) as exc:  # e.g. a document being replaced
                value, problem = None, f" (last: {exc})"
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what or expression}{problem}"
                )
            await asyncio.sleep(0.1)

    async def click(self, selector: str) -> None:
        """A left click in the middle of the element, as mouse events."""
        point = await self.wait_for(
            f"""(() => {{
                const e = document.querySelector({json.dumps(selector)});
                if (!e || e.offsetParent === null) return null;
                e.scrollIntoView({{block: "center"}});
                const r = e.getBoundingClientRect();
                return [r.x + r.width / 2, r.y + r.height / 2];
            }})()""",
            what=f"{selector} to be visible",
        )
        x, y = point
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )

    async def type(self, text: str) -> None:
        await self.send("Input.insertText", text=text)

    async def goto(self, url: str) -> None:
        """Navigate, and return once the new document has loaded."""
        await self.send("Page.navigate", url=url)
        await self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            what=f"{url} to load",
        )

    async def reload(self) -> None:
        await self.evaluate("window.__reloading = true")
        await self.send("Page.reload")
        await self.wait_for(
            "window.__reloading === undefined && document.readyState === 'complete'",
            what="the page to reload",
        )

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()


@contextlib.asynccontextmanager
async def chromium(executable: str, profile: Path) -> AsyncIterator[Page]:
    """A headless Chromium with one page; ended (by its pid) on exit."""
    process = await asyncio.create_subprocess_exec(
        executable,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "about:blank",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HOME": str(profile)},
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.returncode is not None:
                raise AssertionError(f"chromium exited with status {process.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError("chromium did not open its DevTools port within 30 s")
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json(content_type=None)
            target = next(t for t in targets if t["type"] == "page")
            ws = await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
            page = Page(ws)
            try:
                await page.send("Page.enable")
                yield page
            finally:
                await page.close()
    finally:
        process.terminate()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
