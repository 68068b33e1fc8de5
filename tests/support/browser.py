"""Real headless Chromium (Debian's `chromium`, installed by .ci/sysdeps) driven over the
DevTools protocol on its websocket, for tests that look at a page as a person would: load
it, wait for what it shows, click with the mouse, count console errors and take PNG
screenshots.

No WebDriver: `--remote-debugging-port=0` makes Chromium print its browser websocket URL,
and one aiohttp websocket carries every command, with flattened sessions per page.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")
# Nothing of the browser's own may go out: no updates, no sync, no reporting, no proxy.
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--no-pings",
    "--metrics-recording-only",
    "--no-proxy-server",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-port=0",
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CdpError(Exception):
    pass


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self._browser = browser
        self.session = session
        # Console errors, uncaught exceptions and browser-logged errors (CSP, network).
        self.errors: list[str] = []
        self.loaded = asyncio.Event()

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._browser.send(method, params, self.session)

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = params.get("args") or []
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in args)
            )
        elif method == "Runtime.exceptionThrown":
            detail = params.get("exceptionDetails") or {}
            text = (detail.get("exception") or {}).get("description") or detail.get("text", "")
            self.errors.append(f"exception: {text}")
        elif method == "Log.entryAdded":
            entry = params.get("entry") or {}
            if entry.get("level") == "error":
                self.errors.append(f"log: {entry.get('text', '')} {entry.get('url', '')}")
        elif method == "Page.loadEventFired":
            self.loaded.set()

    async def goto(self, url: str, timeout: float = 15.0) -> None:
        self.loaded.clear()
        await self.send("Page.navigate", {"url": url})
        async with asyncio.timeout(timeout):
            await self.loaded.wait()

    async def evaluate(self, expression: str) -> Any:
        answer = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            raise CdpError(f"{expression[:80]}: {answer['exceptionDetails']}")
        return (answer.get("result") or {}).get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0, interval: float = 0.1) -> Any:
        """The first truthy value of `expression`, polled; TimeoutError with the last one."""
        last: Any = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    last = await self.evaluate(expression)
                    if last:
                        return last
                    await asyncio.sleep(interval)
        except TimeoutError:
            raise TimeoutError(f"{expression!r} still {last!r} after {timeout}s") from None

    async def click(self, selector: str) -> None:
        """A real mouse click at the middle of the first element `selector` matches."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView?.({block: 'center', inline: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if not box:
            raise CdpError(f"nothing matches {selector!r}")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    async def select(self, selector: str, value: str) -> None:
        """Choose `value` in a <select>, as a user's choice does (a change event)."""
        ok = await self.evaluate(
            f"(() => {{ const s = document.querySelector({json.dumps(selector)});"
            f" if (!s) return false; s.value = {json.dumps(value)};"
            " s.dispatchEvent(new Event('change', {bubbles: true})); return s.value; })()"
        )
        if ok != value:
            raise CdpError(f"cannot choose {value!r} in {selector!r}")

    async def screenshot(self, path: Path) -> Path:
        answer = await self.send("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(answer["data"]))
        return path


class Browser:
    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        ws: aiohttp.ClientWebSocketResponse,
        session: aiohttp.ClientSession,
        profile: str,
    ) -> None:
        self._proc = proc
        self._ws = ws
        self._http = session
        self._profile = profile
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, Page] = {}
        self._reader = asyncio.create_task(self._read())

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        future = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = future
        await self._ws.send_str(json.dumps(message))
        async with asyncio.timeout(30):
            return await future

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    if "error" in data:
                        future.set_exception(CdpError(str(data["error"])))
                    else:
                        future.set_result(data.get("result") or {})
            elif data.get("sessionId") in self._pages:
                self._pages[data["sessionId"]]._event(data["method"], data.get("params") or {})
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(CdpError("the browser closed its websocket"))

    async def new_page(self, width: int = 1400, height: int = 900) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"])
        self._pages[page.session] = page
        for domain in ("Page", "Runtime", "Log"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.send("Browser.close")
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        await self._ws.close()
        await self._http.close()
        try:
            await asyncio.to_thread(self._proc.wait, 10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            await asyncio.to_thread(self._proc.wait)
        shutil.rmtree(self._profile, ignore_errors=True)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    path = chromium_path()
    if path is None:
        raise RuntimeError("chromium is not installed (.ci/sysdeps installs Debian's chromium)")
    profile = tempfile.mkdtemp(prefix="pilotfish-chromium-")
    proc = subprocess.Popen(
        [path, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
        start_new_session=True,
    )
    assert proc.stderr is not None
    stderr = proc.stderr

    def find_url() -> str:
        seen = []
        for raw in stderr:
            line = raw.decode(errors="replace")
            seen.append(line)
            m = _LISTENING.search(line)
            if m:
                return m.group(1)
        raise RuntimeError("chromium exited before listening: " + "".join(seen[-20:]))

    try:
        async with asyncio.timeout(30):
            url = await asyncio.to_thread(find_url)
    except BaseException:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
        raise
    # Keep reading stderr so Chromium never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(url, max_msg_size=0)
    browser = Browser(proc, ws, session, profile)
    try:
        yield browser
    finally:
        await browser.close()


ROOT = Path(__file__).resolve().parents[2]


def artifacts_dir(name: str) -> Path:
    """Where a test leaves its screenshots: `test-artifacts/<name>/` in the work tree
    (gitignored), or under $PILOTFISH_TEST_ARTIFACTS."""
    base = Path(os.environ.get("PILOTFISH_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path
