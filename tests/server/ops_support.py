"""A scripted engine for the operations tests: slow prefills, device out-of-memory, and
`stats()` like the real engine's (a page pool that requests hold while they live).

(Importable because conftest.py puts this folder on sys.path.)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from server_harness import ScriptedEngine, ServerHarness
from server_scripts import SCRIPTS

from edgemoe.messages import RequestOutput, SamplingParams
from edgemoe.server.config import ServerConfig
from edgemoe.tokenizer import TokenizerBundle

PREFILL_STEPS = 150  # "[[prefill]]": steps with no output first (~1.5 s)
STEP_S = 0.01
OOM_AFTER = 2  # "[[oom]]": the step after this many tokens runs out of device memory
OOM_MESSAGE = "the device ran out of memory in this step (12 tokens); the request was not completed"
PAGES = 64
PAGE_SIZE = 16


class OpsEngine(ScriptedEngine):
    """`[[prefill]]` prompts spend PREFILL_STEPS steps before their first token;
    `[[oom]]` prompts end with finish_reason "error" (the real engine's OOM message)
    after OOM_AFTER tokens, or at once with `[[oom0]]`."""

    def __init__(self, tokenizer: TokenizerBundle, scripts: dict[str, str]) -> None:
        super().__init__(tokenizer, scripts)
        self.prefill_left: dict[str, int] = {}
        self.aborted_in_prefill: list[str] = []
        self._oom: dict[str, int] = {}
        self.steps = 0

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> str:
        super().add_request(prompt_ids, params, request_id)
        text = self.tokenizer.decode(prompt_ids)
        if "[[prefill]]" in text:
            self.prefill_left[request_id] = PREFILL_STEPS
        if "[[oom0]]" in text or "[[oom]]" in text:
            self._oom[request_id] = 0 if "[[oom0]]" in text else OOM_AFTER
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        if self.prefill_left.pop(request_id, 0) > 0:
            self.aborted_in_prefill.append(request_id)
        return super().abort(request_id)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        if self.prefill_left or any(r.hang for r in self.requests.values()):
            time.sleep(STEP_S)
        outputs = []
        for rid, req in list(self.requests.items()):
            if self.prefill_left.get(rid, 0) > 0:
                self.prefill_left[rid] -= 1
                continue
            self.prefill_left.pop(rid, None)
            if rid in self._oom and len(req.output) >= self._oom[rid]:
                del self.requests[rid]
                outputs.append(RequestOutput(request_id=rid, finished=True, finish_reason="error",
                                             error=OOM_MESSAGE, num_prompt_tokens=len(req.prompt_ids)))
                continue
            outputs.append(self._advance(rid, req))
        return outputs

    def stats(self) -> dict[str, Any]:
        """The real engine's keys; each live request holds its tokens' pages."""
        held = sum(-(-(len(r.prompt_ids) + len(r.output)) // PAGE_SIZE) for r in self.requests.values())
        held = min(held, PAGES)
        return {
            "moe_backend": "offload",
            "moe": {"hits": 30 * self.steps, "misses": 3 * self.steps, "experts_cpu": self.steps,
                    "bytes_copied": 1000 * self.steps, "tokens": self.steps, "misses_per_token": 3.0,
                    "hit_rate_by_layer": [0.9, 0.95]},
            "kv_pages_total": PAGES,
            "kv_pages_free": PAGES - held,
            "kv_pages_cached": 0,
            "kv_pages_evictable": 0,
            "prefix_cache": {"queries": len(self.seen), "query_tokens": sum(len(p) for p, _ in self.seen),
                             "hit_tokens": 0},
            "requests_running": sum(1 for rid in self.requests if rid not in self.prefill_left),
            "requests_waiting": len(self.prefill_left),
            "memory_plan": {"budget": None, "kv_tokens": PAGES * PAGE_SIZE, "backend": "offload"},
        }


def start_ops_server(demo_dir: Path, tokenizer: TokenizerBundle, **config: Any) -> ServerHarness:
    """A started server over an OpsEngine (stop it when done)."""
    engine = OpsEngine(tokenizer, SCRIPTS)
    return ServerHarness(engine, engine.ready(demo_dir), ServerConfig(**config)).start()


def metrics(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Prometheus text → {sample name: {sorted labels: value}}, via prometheus_client's parser."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def family_names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}
