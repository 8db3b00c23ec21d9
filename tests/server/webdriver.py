"""A small W3C WebDriver client over httpx, for Debian's `chromium-driver` (no extra package).

Enough for the web page test: open a page, find elements, type, click, run a script,
take a screenshot. `Browser.start()` returns None when chromium or chromedriver is
missing (the test then skips, or fails under CI=true).
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C element reference key
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WebDriverError(RuntimeError):
    pass


class Browser:
    """One headless Chromium session through a chromedriver child process."""

    def __init__(self, driver: subprocess.Popen[bytes], url: str, session: str) -> None:
        self.driver, self.url, self.session = driver, url, session
        self.http = httpx.Client(timeout=60)

    @classmethod
    def binaries(cls) -> tuple[str, str] | None:
        chrome = next((p for n in CHROMIUM_NAMES if (p := shutil.which(n))), None)
        driver = shutil.which("chromedriver")
        return (chrome, driver) if chrome and driver else None

    @classmethod
    def start(cls, width: int = 1400, height: int = 900) -> Browser | None:
        found = cls.binaries()
        if found is None:
            return None
        chrome, driver_bin = found
        port = _free_port()
        driver = subprocess.Popen([driver_bin, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chrome,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--no-first-run", "--no-default-browser-check"],
        }}}}
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.post(f"{url}/session", json=caps, timeout=60)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    driver.kill()
                    raise
                time.sleep(0.1)
        if r.status_code != 200:
            driver.kill()
            raise WebDriverError(f"cannot start a session: {r.text[:500]}")
        return cls(driver, url, r.json()["value"]["sessionId"])

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        r = self.http.request(method, f"{self.url}/session/{self.session}{path}", json=body)
        value = r.json().get("value")
        if r.status_code != 200:
            raise WebDriverError(f"{method} {path}: {value}")
        return value

    def get(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    def find(self, css: str) -> str:
        return str(self._call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT])

    def type(self, css: str, text: str) -> None:
        self._call("POST", f"/element/{self.find(css)}/value", {"text": text})

    def click(self, css: str) -> None:
        self._call("POST", f"/element/{self.find(css)}/click", {})

    def run(self, script: str, *args: Any) -> Any:
        """Run `script` (a function body; `return` gives the value) in the page."""
        return self._call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script: str, timeout: float = 20.0, what: str = "") -> Any:
        """Poll `script` until it returns something truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(script)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or script}")
            time.sleep(0.05)

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))
        return path

    def close(self) -> None:
        try:
            self.http.delete(f"{self.url}/session/{self.session}")
        except httpx.HTTPError:
            pass
        self.http.close()
        self.driver.terminate()
        try:
            self.driver.wait(5)
        except subprocess.TimeoutExpired:
            self.driver.kill()
