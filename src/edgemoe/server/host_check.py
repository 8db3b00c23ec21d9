"""Which `Host` the server answers to, and which browser pages may call it: against DNS
rebinding and cross-site requests from web pages.

A page on `evil.example` can point its own name at 127.0.0.1 (DNS rebinding) and then
talk to a local server as if same-origin; its requests still carry `Host:
evil.example`. So a request is served only if its Host is one the server is known by
(the `--host` address and the localhost names, plus any IP address and this machine's
name when bound to all interfaces, since then every address of the machine is the
bound one; `--allowed-hosts` adds names). An IP literal is never a rebinding.

A browser also sends `Origin` with cross-site requests (a page POSTing to
`http://127.0.0.1:1919` with a plain-text body needs no CORS preflight): a request
whose Origin is not this server itself, nor a host named with --allowed-hosts, is
refused. Non-browser clients send no Origin. Both refusals are 403 in the route's
error shape. `--allowed-hosts '*'` turns both checks off (behind a proxy that checks).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from edgemoe.server.errors import APIError, error_response

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def hostname(authority: str) -> str:
    """"Example.COM:80" → "example.com"; "[::1]:1919" → "::1"."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    if authority.count(":") == 1:
        authority = authority.split(":", 1)[0]
    return authority.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostPolicy:
    any_host: bool
    names: frozenset[str]  # host names (no port) requests may carry
    any_ip: bool  # bound to all interfaces: every IP literal is ours
    explicit: frozenset[str]  # names given with --allowed-hosts: browser pages there may call us

    @classmethod
    def of(cls, bind: str, allowed_hosts: str | None) -> HostPolicy:
        """The localhost names and the bound address (any IP and this machine's name when
        bound to all interfaces), plus the names in `allowed_hosts` ("*": anything)."""
        given = frozenset(hostname(h) for h in (allowed_hosts or "").split(",") if h.strip())
        if "*" in given:
            return cls(True, frozenset(), True, frozenset())
        wildcard = bind.strip() in WILDCARDS
        own = socket.gethostname().lower() if wildcard else hostname(bind)
        return cls(False, LOCAL_NAMES | given | {own}, wildcard, given)

    def host_ok(self, name: str) -> bool:
        return (self.any_host or name in self.names or name.endswith(".localhost")
                or (self.any_ip and _is_ip(name)))

    def origin_ok(self, origin: str, host_header: str) -> bool:
        """A page at `origin` may call us: the same origin, or a host named explicitly."""
        if self.any_host:
            return True
        parts = urlsplit(origin.strip())
        if not parts.netloc:
            return False  # "null" (sandboxed frames, file:// pages) and the like
        if parts.scheme in ("http", "https") and parts.netloc.lower() == host_header.strip().lower():
            return True
        return hostname(parts.netloc) in self.explicit  # any scheme: an app's own (vscode-webview://…)


class HostCheckMiddleware:
    """403 for a request with a foreign Host, or from a foreign browser Origin."""

    def __init__(self, app: ASGIApp, *, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.policy.any_host:
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host, origin = headers.get(b"host"), headers.get(b"origin")
        error = None
        if host is not None and not self.policy.host_ok(hostname(host)):
            error = APIError(403, f"this server does not answer to Host {host!r}; start it with "
                             "--allowed-hosts to add a name ('*' for any)", code="host_not_allowed")
        elif origin is not None and not self.policy.origin_ok(origin, host or ""):
            error = APIError(403, f"requests from web pages at {origin!r} are not allowed; start the server "
                             "with --allowed-hosts naming that host to allow them", code="origin_not_allowed")
        if error is not None:
            await error_response(error, scope.get("path", ""))(scope, receive, send)
            return
        await self.app(scope, receive, send)
