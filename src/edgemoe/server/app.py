"""The FastAPI app: routes only. Each route hands its request to a protocol module.

`create_app(config, client)` wires the state; the app's lifespan starts the engine
client and loads the model's tokenizer/template once the engine reports ready.
Every `/v1/...` route also answers with a trailing slash. Operations routes
(`/metrics`, `/v1/stats`, `/v1/requests`) live in `stats_api`, the live view's stream
(`/v1/stats/stream`) in `live`, the web page (`/`) in `web`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from edgemoe.server import access_log, engine_log
from edgemoe.server.access_log import AccessLogMiddleware
from edgemoe.server.admission import enforce_deadlines
from edgemoe.server.anthropic import (
    ANTHROPIC_VERSION,
    anthropic_model_card,
    anthropic_model_list,
    count_tokens,
    create_message,
)
from edgemoe.server.anthropic_protocol import CountTokensRequest, CreateMessageRequest
from edgemoe.server.config import ServerConfig
from edgemoe.server.disconnect_watch import CancelOnDisconnectMiddleware
from edgemoe.server.engine_client import EngineClient
from edgemoe.server.engine_log import log_engine_lines
from edgemoe.server.error_middleware import UnexpectedErrorMiddleware
from edgemoe.server.errors import APIError, install_handlers, unavailable
from edgemoe.server.host_check import HostCheckMiddleware, HostPolicy
from edgemoe.server.live import add_live_routes
from edgemoe.server.middleware import OPEN_PATHS, GuardMiddleware
from edgemoe.server.openai_chat import create_chat_completion
from edgemoe.server.openai_completions import create_completion
from edgemoe.server.openapi import install_openapi
from edgemoe.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from edgemoe.server.request_body import ThreadedBodyRoute
from edgemoe.server.request_context import RequestContextMiddleware
from edgemoe.server.responses import create_response
from edgemoe.server.responses_protocol import ResponsesRequest
from edgemoe.server.state import ServerState
from edgemoe.server.stats_api import add_ops_routes, health_body
from edgemoe.server.stats_models import Health
from edgemoe.server.tokenize_api import detokenize, tokenize
from edgemoe.server.web import PAGE_PATHS, add_page_routes


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.edgemoe
    return state


def create_app(config: ServerConfig, client: EngineClient) -> FastAPI:
    state = ServerState(config, client)
    client.observer = state.tracker  # every protocol's requests are counted at the client

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await client.start()
        tasks = [asyncio.create_task(state.load())]
        if config.request_timeout is not None:
            tasks.append(asyncio.create_task(
                enforce_deadlines(state.tracker.expired, client.fail, config.request_timeout)))
        if not config.quiet:
            tasks.append(asyncio.create_task(log_engine_lines(state)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await client.close(stop_engine=True)

    app = FastAPI(title="edgemoe", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.router.route_class = ThreadedBodyRoute  # bodies parsed off the event loop
    app.state.edgemoe = state
    install_handlers(app)
    app.add_middleware(UnexpectedErrorMiddleware)  # innermost: a route's failure is a clean 500
    # The page and its assets are public (no secret in them); the page asks for the key.
    app.add_middleware(GuardMiddleware, api_key=config.api_key, max_body_size=config.max_body_size,
                       open_paths=OPEN_PATHS | PAGE_PATHS)
    app.add_middleware(HostCheckMiddleware, policy=HostPolicy.of(config.host, config.allowed_hosts))
    app.add_middleware(CancelOnDisconnectMiddleware)
    if not config.quiet:
        _enable_logs()
        app.add_middleware(AccessLogMiddleware)  # inside the context: reads its token counts
    app.add_middleware(RequestContextMiddleware)  # outermost: arrival time before the body is read
    _add_info_routes(app)
    _add_api_routes(app)
    add_ops_routes(app)
    add_live_routes(app)
    add_page_routes(app)
    install_openapi(app)
    return app


def _enable_logs() -> None:
    # The CLI logs warnings only; the access and engine lines are INFO, on by default.
    for name in (access_log.log.name, engine_log.log.name):
        logging.getLogger(name).setLevel(logging.INFO)


def _both(app: FastAPI, method: str, path: str) -> Callable[[Any], Any]:
    """Register a route at `path` and `path/`."""

    def register(fn: Any) -> Any:
        app.add_api_route(path, fn, methods=[method])
        app.add_api_route(path + "/", fn, methods=[method], include_in_schema=False)
        return fn

    return register


def _add_info_routes(app: FastAPI) -> None:
    @app.get("/health", response_model=None, responses={200: {"model": Health}})
    async def health(request: Request) -> Response:
        state = _state(request)
        if not state.healthy:
            return JSONResponse(unavailable(state.unavailable_reason()).body(), status_code=503)
        return JSONResponse(health_body(state).model_dump())

    # HEAD too (out of the schema: one operation a path and method): load balancers and
    # uptime probes (Docker, k8s httpGet, AWS) often send it.
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @_both(app, "GET", "/debug/engine")
    async def engine_info(request: Request) -> dict[str, Any]:
        state = _state(request)
        info, model = state.client.ready_info, state.model
        return {
            "state": state.client.state.value,
            "failure": state.client.failure,
            "engine_pid": info.pid if info else None,
            "model_dir": info.model_dir if info else None,
            "model_type": info.model_type if info else None,
            "max_model_len": info.max_model_len if info else None,
            "served_model_name": model.name if model else None,
            "tool_call_parser": model.tool_parser if model else None,
            "random_weights": info.random_weights if info else None,
        }

    # An Anthropic client (it sends `anthropic-version`; OpenAI clients never do) gets
    # Anthropic's shape: Claude Code's gateway model discovery reads no other.
    @_both(app, "GET", "/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        model = _state(request).serving(None)
        if ANTHROPIC_VERSION in request.headers:
            return anthropic_model_list(model)
        return {"object": "list", "data": [_card(model.name, request)]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, Any]:
        model_id = model_id.rstrip("/")
        model = _state(request).serving(model_id)
        if ANTHROPIC_VERSION in request.headers:
            return anthropic_model_card(model_id, model)
        return _card(model_id, request)


def _add_api_routes(app: FastAPI) -> None:
    @_both(app, "POST", "/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(_state(request), body, request)

    @_both(app, "POST", "/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(_state(request), body, request)

    @_both(app, "POST", "/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        return await create_response(_state(request), body, request)

    # Anthropic Messages; Claude Code adds `?beta=true`, which changes nothing here.
    @_both(app, "POST", "/v1/messages")
    async def messages(body: CreateMessageRequest, request: Request) -> Response:
        return await create_message(_state(request), body, request)

    @_both(app, "POST", "/v1/messages/count_tokens")
    async def messages_count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
        return await count_tokens(_state(request), body)

    @_both(app, "POST", "/v1/tokenize")
    async def tokenize_route(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        state = _state(request)
        return await tokenize(state.serving(body.model), body, state.config.thinking_default)

    @_both(app, "POST", "/v1/detokenize")
    async def detokenize_route(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        return await detokenize(_state(request).serving(body.model), body)


def _card(model_id: str, request: Request) -> dict[str, Any]:
    model = _state(request).model
    if model is None:  # serving() checked it; keeps type checkers content
        raise APIError(503, "the model is still loading")
    return {
        "id": model_id,
        "object": "model",
        "created": model.created,
        "owned_by": "edgemoe",
        "root": model.info.model_dir,
        "parent": None,
        "max_model_len": model.max_model_len,
    }
