"""The server's shared state: settings, the engine client, the model once it is ready,
and the request tracker that feeds metrics, stats, the request log and admission."""

from __future__ import annotations

import asyncio
import logging
import time

import anyio

from edgemoe.server.admission import AdmissionGate
from edgemoe.server.config import ServerConfig
from edgemoe.server.engine_client import EngineClient, EngineUnavailable, State
from edgemoe.server.errors import APIError, unavailable
from edgemoe.server.metrics import ServerMetrics
from edgemoe.server.model import ServedModel
from edgemoe.server.tracker import RequestTracker

log = logging.getLogger(__name__)


class ServerState:
    def __init__(self, config: ServerConfig, client: EngineClient) -> None:
        self.config = config
        self.client = client
        self.model: ServedModel | None = None
        self.load_error: str | None = None
        self.settled = asyncio.Event()  # the model is served, or never will be (load_error says why)
        self.started = time.monotonic()
        self.metrics = ServerMetrics(self._model_name, self._live_counts, lambda: client.stats)
        self.tracker = RequestTracker(
            self.metrics, AdmissionGate(config.max_queued_requests), timeout_s=config.request_timeout)

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started

    def _model_name(self) -> str | None:
        return self.model.name if self.model is not None else None

    def _live_counts(self) -> tuple[int, int]:
        return self.tracker.live_counts()

    async def load(self) -> None:
        """Wait for the engine, then read the model's tokenizer and template."""
        try:
            info = await self.client.wait_ready()
            self.model = await anyio.to_thread.run_sync(ServedModel.load, info, self.config)
        except EngineUnavailable as exc:
            self.load_error = str(exc)
        except Exception as exc:  # the server cannot serve this checkpoint
            log.exception("cannot load the model's tokenizer or template")
            self.load_error = f"cannot load the model's tokenizer or template: {exc}"
        finally:
            self.settled.set()

    @property
    def healthy(self) -> bool:
        return self.model is not None and self.client.state is State.READY

    def unavailable_reason(self) -> str:
        if self.client.state in (State.DEAD, State.CLOSED):
            return self.client.failure or "the engine is not available"
        return self.load_error or "the model is still loading"

    def serving(self, requested: str | None) -> ServedModel:
        """The model for a request naming `requested`: 503 until ready, 404 for a strict mismatch."""
        if not self.healthy or self.model is None:
            raise unavailable(self.unavailable_reason())
        if not self.model.serves(requested, self.config.strict_model_name):
            raise APIError(
                404, f"the model {requested!r} does not exist; this server serves {self.model.name!r}",
                param="model", code="model_not_found",
            )
        return self.model
