"""Server settings: a frozen dataclass whose fields are the `edgemoe serve` flags.

Like `edgemoe.config`, each field carries its help (and choices, and how to parse the
flag's text) in `metadata`, so the CLI generates the flags and cannot drift from the
field names. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable

THINKING_MODES = ("on", "off")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str | int) -> int:
    """Bytes from "32MiB", "1GB", "512k" or a plain number.

    `KiB`/`MiB`/`GiB` and bare `K`/`M`/`G` are powers of 1024, `KB`/`MB`/`GB` of 1000.
    """
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (examples: 32MiB, 1GB, 1048576)")
    number, unit, binary, b = m.groups()
    decimal = bool(unit) and bool(b) and not binary
    base = 1000 if decimal else 1024
    return int(float(number) * base ** _POWERS[unit.lower()])


def server_setting(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """A ServerConfig field with its CLI help, choices and text parser attached."""
    meta: dict[str, Any] = {"help": help}
    if choices:
        meta["choices"] = choices
    if parse is not None:
        meta["parse"] = parse
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ServerConfig:
    host: str = server_setting("127.0.0.1", "address to listen on")
    port: int = server_setting(1919, "TCP port to listen on (0: any free port)")
    served_model_name: str | None = server_setting(
        None, "the model's name in the API; default: the checkpoint directory's name"
    )
    api_key: str | None = server_setting(
        None, "require this key (Authorization: Bearer KEY, or x-api-key) on every route but /health; "
        "visible in the process list: prefer --api-key-file or $EDGEMOE_API_KEY"
    )
    strict_model_name: bool = server_setting(
        False, "answer 404 to requests naming another model (default: any name is served)"
    )
    default_thinking_mode: str = server_setting(
        "on", "thinking when a request does not say (reasoning_effort, chat_template_kwargs)",
        choices=THINKING_MODES,
    )
    tool_call_parser: str | None = server_setting(
        None, "tool-call format; default: from the chat template, then the model family"
    )
    max_body_size: int = server_setting(
        32 * 2**20, "largest request body accepted (default 32MiB); larger: 413", parse=parse_size
    )
    request_timeout: float | None = server_setting(
        None, "seconds a request may take from arrival to its last token; past it, it ends with a "
        "timeout error and is aborted in the engine (default: no limit)"
    )
    max_queued_requests: int = server_setting(
        256, "requests that may wait for their first token (default 256); past it, new ones get "
        "429 (OpenAI) / 529 (Anthropic) with Retry-After"
    )
    template_timeout: float = server_setting(
        10.0, "seconds a chat template may take to render one request (default 10); past it: 400"
    )
    quiet: bool = server_setting(
        False, "no access log line per request and no periodic engine line on stderr"
    )

    # Connection limits and the stream heartbeat (`edgemoe.server.connections`, `heartbeat`)
    # and where browsers may call from (`edgemoe.server.host_check`): docs/operations.md.
    max_connections: int = server_setting(
        512, "open connections at most (default 512); one more is answered 503 and closed"
    )
    header_timeout: float = server_setting(
        10.0, "seconds a client has to send a request's headers (default 10); past it: 408, closed"
    )
    body_min_rate: int = server_setting(
        1024, "slowest request-body upload accepted, bytes/s on average after the first --header-timeout "
        "seconds, e.g. 1KiB (default); slower: 408, closed", parse=parse_size,
    )
    keep_alive_timeout: float = server_setting(
        5.0, "seconds an idle connection stays open, before its first request or between requests (default 5)"
    )
    max_send_buffer: int = server_setting(
        2**20, "bytes of response a client may leave unread, e.g. 1MiB (default); past it the client is "
        "disconnected and its generation aborted", parse=parse_size,
    )
    stream_heartbeat: float = server_setting(
        10.0, "seconds of silence after which a stream sends a heartbeat (SSE comment, Anthropic ping), "
        "e.g. during a long prefill (default 10)"
    )
    allowed_hosts: str | None = server_setting(
        None, "comma-separated host names the server answers to besides the --host address and the "
        "localhost names (when bound to all interfaces: any IP address and this machine's name), and "
        "whose web pages may call it; '*': any Host, any Origin"
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the flag of any bad value."""
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535] (got {self.port})")
        if not self.host.strip():  # "" would listen on every interface, unasked
            raise ValueError("--host is empty: give an address, e.g. 127.0.0.1 (0.0.0.0: every interface)")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("--served-model-name is empty: give a name, or leave the flag out for the model's own")
        if self.default_thinking_mode not in THINKING_MODES:
            raise ValueError(f"--default-thinking-mode must be on or off (got {self.default_thinking_mode!r})")
        if self.max_body_size < 1:
            raise ValueError(f"--max-body-size must be >= 1 byte (got {self.max_body_size})")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds (got {self.request_timeout})")
        if not self.template_timeout > 0:
            raise ValueError(f"--template-timeout must be > 0 seconds (got {self.template_timeout})")
        if self.max_queued_requests < 1:
            raise ValueError(f"--max-queued-requests must be >= 1 (got {self.max_queued_requests})")
        for name in ("max_connections", "header_timeout", "body_min_rate", "keep_alive_timeout",
                     "max_send_buffer", "stream_heartbeat"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 (got {getattr(self, name)})")
        if self.tool_call_parser is not None:
            from edgemoe.server.parsers import TOOL_PARSERS

            if self.tool_call_parser not in TOOL_PARSERS:
                raise ValueError(
                    f"--tool-call-parser {self.tool_call_parser!r}: choose one of {', '.join(sorted(TOOL_PARSERS))}"
                )

    @property
    def thinking_default(self) -> bool:
        return self.default_thinking_mode == "on"

    @property
    def template_output_limit(self) -> int:
        """Characters one chat template render may produce: 4 × the largest body."""
        return 4 * self.max_body_size


def server_setting_names() -> list[str]:
    return [f.name for f in fields(ServerConfig)]
