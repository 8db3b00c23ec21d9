"""The web page at `/` in a real headless Chromium, against `edgemoe serve` with the offload
backend and a small slot pool (so experts miss and get copied), behind an API key.

The page loads and asks for the key; a message streams back; the expert heatmap changes
while it generates; Stop aborts the request on the server (`/v1/stats` counts an abort);
the markdown renderer turns hostile text into text, never HTML. A screenshot per state
goes to bench/results/ (ignored by git). Chromium and chromedriver come from Debian
(`make test` installs them); without them the test skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_serve_process import Served
from webdriver import Browser

KEY = "sk-web-test"
SHOTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser.start()
    if b is None:
        why = "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; under CI=true this test may not skip")
        pytest.skip(why)
    yield b
    b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Served]:
    key_file = tmp_path_factory.mktemp("web") / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    # The demo model has 4 MoE layers x 16 experts, 4 routed per token: 24 slots of 64 hit and miss.
    s = Served("--moe-backend", "offload", "--moe-slots", "24", "--api-key-file", str(key_file), "--quiet")
    s.model_name = s.wait_ready(120).group(2)  # type: ignore[attr-defined]
    yield s
    s.kill()


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()


def test_page_chat_live_view_and_stop(browser: Browser, server: Served) -> None:
    browser.get(server.url + "/")
    browser.wait_for("return document.getElementById('key-dialog').open", what="the API key dialog")
    browser.type("#key-input", KEY)
    browser.click("#key-form button")
    browser.wait_for("return window.edgemoe && window.edgemoe.live.frames >= 2", what="live frames")
    assert browser.run("return document.getElementById('model').textContent") == server.model_name  # type: ignore[attr-defined]
    assert browser.run("return !document.getElementById('random-badge').hidden")  # the demo is random weights
    assert browser.run("return document.getElementById('conn').dataset.state") == "live"
    browser.screenshot(SHOTS / "web-1-loaded.png")

    # A long answer, no thinking, so the visible text streams for a while.
    browser.run("document.getElementById('thinking').value = 'off';"
                "document.getElementById('max_tokens').value = '2000';")
    browser.type("#input", "Tell me about mixture-of-experts models.\n")
    first = browser.wait_for("const c = document.querySelector('.msg.assistant .content');"
                             "return c && c.textContent.length", what="the first streamed text")
    maps = set()
    deadline = time.monotonic() + 30
    while len(maps) < 3 and time.monotonic() < deadline:  # the map of each frame while generating
        cells = browser.run("const l = window.edgemoe.live; return l.cells && l.cells.join('|')")
        if cells and any(code in cells for code in "23"):  # hits or copies marked in this frame
            maps.add(cells)
        time.sleep(0.1)
    assert len(maps) >= 3, f"the heatmap did not change while generating (saw {len(maps)} maps)"
    assert browser.run("return Number(document.getElementById('heatmap').dataset.version)") >= 3
    later = browser.run("return document.querySelector('.msg.assistant .content').textContent.length")
    assert later > first  # still streaming
    assert browser.run("return document.querySelector('.msg.assistant').classList.contains('streaming')")
    browser.screenshot(SHOTS / "web-2-streaming.png")
    stats = _stats(server.url)
    assert stats["requests"]["running"] == 1
    assert stats["engine"]["expert_cache"]["misses"] > 0 and stats["engine"]["expert_cache"]["hits"] > 0

    browser.click("#stop")
    browser.wait_for("return document.querySelector('.msg.assistant').classList.contains('stopped')", what="stopped")
    deadline = time.monotonic() + 5
    while True:  # the server saw the client go and aborted the request in the engine
        stats = _stats(server.url)
        if stats["requests"]["running"] == 0 and stats["engine"]["requests_running"] == 0:
            break
        assert time.monotonic() < deadline, f"the request kept running after Stop: {stats['requests']}"
        time.sleep(0.1)
    assert stats["requests"]["by_finish_reason"] == {"abort": 1}
    assert browser.run("return document.getElementById('stop').hidden")
    browser.screenshot(SHOTS / "web-3-stopped.png")


def test_markdown_renders_model_text_as_text(browser: Browser, server: Served) -> None:
    browser.get(server.url + "/")
    hostile = ("# Title\n<img src=x onerror=\"window.pwned=1\"> **bold** [x](javascript:alert(1)) "
               "[ok](https://example.com)\n```python\nprint('<script>')\n```\n- one\n- two")
    result = browser.run(
        "return import('/ui/markdown.js').then(m => {"
        " const div = document.createElement('div'); m.renderMarkdown(div, arguments[0]);"
        " return {imgs: div.querySelectorAll('img, script').length, text: div.textContent,"
        "  links: [...div.querySelectorAll('a')].map(a => a.href), code: div.querySelector('pre code').textContent,"
        "  lang: div.querySelector('pre').dataset.lang, items: div.querySelectorAll('ul li').length,"
        "  strong: div.querySelector('strong').textContent, heading: div.querySelector('h3').textContent}; })",
        hostile,
    )
    assert result["imgs"] == 0 and "<img src=x" in result["text"]  # the tag is shown, not made
    assert result["links"] == ["https://example.com/"]  # javascript: stays text
    assert result["code"] == "print('<script>')" and result["lang"] == "python"
    assert result["items"] == 2 and result["strong"] == "bold" and result["heading"] == "Title"
    assert not browser.run("return window.pwned")
