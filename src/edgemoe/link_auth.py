"""The server↔engine ZMQ link, authenticated and encrypted: only the two processes of one
launch can use it.

Why CURVE and not a secret in each frame: the server's sockets are bound to ipc://
paths that any process of the same user can connect to, and a bound PUSH socket hands
its messages round-robin to every connected peer *before* the receiver could check a
frame secret; a foreign PULL would still read a share of the prompts. So peers are
checked at the connection, before they join: every launch makes fresh CURVE key pairs
(Curve25519), the server's sockets are CURVE servers whose ZAP handler admits only the
engine's public key, and the engine checks the server's key. A peer without the keys
fails the handshake, so no frame reaches it or comes from it (both directions); each
refusal is logged, at most one line a minute. Traffic is encrypted as well.

The engine's keys reach it through an inherited socketpair (`hand_over` /
`receive_keys`), never argv or the environment, which other processes of the user can
read in /proc; unlike a pipe, a socket cannot be reopened through /proc/PID/fd either.
(A process allowed to ptrace the server can read its memory, keys included: the
threat model is the user's other processes, not a debugger.)
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from edgemoe.log_limit import LogLimiter

log = logging.getLogger(__name__)

# Handshake failures on the server's sockets: wrong keys, no CURVE at all, garbage.
REFUSED_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
# A key message is ~200 bytes; anything past this is not ours.
MAX_KEYS_BYTES = 4096


class LinkUnavailable(RuntimeError):
    """This libzmq cannot secure the link (built without CURVE)."""


@dataclass(frozen=True)
class EngineKeys:
    """What the engine holds: its key pair and the server's public key (z85 text)."""

    server_public: bytes
    engine_public: bytes
    engine_secret: bytes

    def encode(self) -> bytes:
        return json.dumps({k: v.decode() for k, v in vars(self).items()}).encode()

    @classmethod
    def decode(cls, data: bytes) -> EngineKeys:
        fields = json.loads(data)
        return cls(**{k: str(fields[k]).encode() for k in ("server_public", "engine_public", "engine_secret")})


@dataclass(frozen=True)
class LinkKeys:
    """One launch's key pairs: the server's, and the engine's (the only peer admitted)."""

    server_public: bytes
    server_secret: bytes
    engine_public: bytes
    engine_secret: bytes

    @classmethod
    def generate(cls) -> LinkKeys:
        if not zmq.has("curve"):
            raise LinkUnavailable("this pyzmq's libzmq has no CURVE support, which edgemoe needs to secure "
                                  "its engine link; install pyzmq's wheel from PyPI")
        server_public, server_secret = zmq.curve_keypair()
        engine_public, engine_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, engine_public, engine_secret)

    def engine_keys(self) -> EngineKeys:
        return EngineKeys(self.server_public, self.engine_public, self.engine_secret)

    def __repr__(self) -> str:  # never print secrets
        return f"LinkKeys(server_public={self.server_public!r}, engine_public={self.engine_public!r})"


# --------------------------------------------------------------------------- handing the keys over


def hand_over(keys: EngineKeys) -> socket.socket:
    """Write `keys` into a new socketpair; returns the child's end (pass its fd to the
    child, then close it here). The keys wait in the socket's buffer until read."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        ours.sendall(keys.encode())
    return theirs


def receive_keys(fd: int) -> EngineKeys:
    """Read the keys the parent handed over on inherited descriptor `fd` (and close it)."""
    chunks: list[bytes] = []
    with socket.socket(fileno=fd) as sock:
        while sum(map(len, chunks)) <= MAX_KEYS_BYTES and (chunk := sock.recv(MAX_KEYS_BYTES)):
            chunks.append(chunk)
    try:
        return EngineKeys.decode(b"".join(chunks))
    except (ValueError, KeyError, TypeError) as exc:
        raise LinkUnavailable(f"no engine keys on descriptor {fd}: {exc}") from None


# --------------------------------------------------------------------------- the two sides


def secure_engine_socket(sock: zmq.Socket[Any], keys: EngineKeys) -> None:
    """The engine's end: a CURVE client that only talks to the server holding `server_public`."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.engine_public
    sock.curve_secretkey = keys.engine_secret


class _OnlyTheEngine:
    """The ZAP callback: admit the engine's public key, nothing else."""

    def __init__(self, engine_public: bytes, refusals: LogLimiter) -> None:
        self.engine_public = engine_public
        self.refusals = refusals

    def callback(self, domain: str, key: bytes) -> bool:
        if hmac.compare_digest(key, self.engine_public):
            return True
        self.refusals.warning("engine link: refused a peer with an unknown key (not this launch's engine)")
        return False


GONE_GRACE_S = 0.5  # how long a dying engine's exit may lag its connection's end


async def _gone_soon(engine_gone: Callable[[], bool | None]) -> bool:
    """Whether the engine is gone, or goes within GONE_GRACE_S; at once False where it is
    connected (`engine_gone` None: a handshake failing then is never its own)."""
    if engine_gone() is None:
        return False
    deadline = time.monotonic() + GONE_GRACE_S
    while not engine_gone():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


class LinkGuard:
    """The server's side: CURVE-serving sockets, a ZAP handler admitting only the engine,
    and a log of refused handshakes. `stop()` before the context is terminated."""

    def __init__(self, ctx: zmq.Context[Any], keys: LinkKeys) -> None:
        self.keys = keys
        self.refusals = LogLimiter(log)
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger(f"{__name__}.zap"))
        self._auth.start()
        self._auth.configure_curve_callback("*", _OnlyTheEngine(keys.engine_public, self.refusals))

    def secure(self, sock: zmq.Socket[Any]) -> None:
        """Make `sock` (before bind) a CURVE server under this guard's ZAP handler."""
        sock.curve_server = True
        sock.curve_publickey = self.keys.server_public
        sock.curve_secretkey = self.keys.server_secret

    async def report_refusals(self, actx: zmq.asyncio.Context, socks: Sequence[zmq.Socket[Any]],
                              engine_gone: Callable[[], bool | None] | None = None) -> None:
        """Log failed handshakes on `socks` (rate-limited) until cancelled. `engine_gone`
        says whether the engine is gone (None: it is connected, its handshake done): a
        handshake cut short while it dies (true within GONE_GRACE_S) is its own, not a refusal."""
        monitors = []
        for i, sock in enumerate(socks):
            address = f"inproc://edgemoe-link-monitor-{id(self)}-{i}"
            sock.monitor(address, REFUSED_EVENTS)
            monitor = actx.socket(zmq.PAIR)
            monitor.connect(address)
            monitors.append(monitor)
        poller = zmq.asyncio.Poller()
        for monitor in monitors:
            poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                for monitor, _ in await poller.poll():
                    event = parse_monitor_message(await monitor.recv_multipart())
                    if (event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and engine_gone is not None
                            and await _gone_soon(engine_gone)):
                        # a peer gone mid-handshake: our own engine failing as it starts does this
                        # (its own error says why); a foreign one is refused as below
                        log.debug("engine link: the engine's connection closed during its handshake")
                        continue
                    self.refusals.warning("engine link: refused a connection that failed the handshake "
                                          "(event %s); only this launch's engine may connect", event["event"])
        finally:
            for sock in socks:
                if not sock.closed:
                    sock.disable_monitor()
            for monitor in monitors:
                monitor.close(linger=0)

    def stop(self) -> None:
        self._auth.stop()
