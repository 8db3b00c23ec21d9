"""The web page at `/`: a chat and a live view of the engine, from files shipped in the package.

Plain HTML, CSS and JavaScript under `edgemoe/server/web/` (package data: no CDN, no build
step). The files are public, like `/health`: nothing secret is in them, and with
`--api-key` the page asks for the key and sends it in a header on its own requests.
Served with a Content-Security-Policy that allows only this origin's scripts, styles and
connections, so model text that got past the page's escaping still could not run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

# Route → (file under web/, media type).
PAGES: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/api.js": ("api.js", "text/javascript; charset=utf-8"),
    "/ui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/ui/live.js": ("live.js", "text/javascript; charset=utf-8"),
    "/ui/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),
}
PAGE_PATHS = frozenset(PAGES)

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new version shows after an upgrade
}


def read_asset(name: str) -> bytes:
    return (resources.files("edgemoe.server") / "web" / name).read_bytes()


def _handler(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def page() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return page


def add_page_routes(app: FastAPI) -> None:
    for path, (name, media_type) in PAGES.items():
        # Read once: the files are small and never change while serving.
        app.add_api_route(path, _handler(read_asset(name), media_type), methods=["GET"], include_in_schema=False)
