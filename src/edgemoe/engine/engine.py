"""Engine: step = schedule → forward → sample → update.

Owns every request's state. Not thread-safe: one loop (the engine process, or the
in-process `LLM`) calls `add_request`, `abort` and `step`.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from edgemoe.cache.prefix_cache import make_prefix_cache
from edgemoe.config import EngineConfig
from edgemoe.detokenizer import TextStream
from edgemoe.engine.build import build_runtime
from edgemoe.engine.request import Request
from edgemoe.engine.runner import ModelRunner
from edgemoe.engine.sampling import RequestSampler, SampledTokens
from edgemoe.engine.scheduler import ScheduledSeq, Scheduler, StepPlan
from edgemoe.messages import RequestOutput, SamplingParams, TokenLogprob


class Engine:
    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        self.config = config
        rt = build_runtime(config, progress=progress)
        self.runtime = rt
        self.tokenizer = rt.tokenizer
        self.max_model_len = rt.max_model_len
        self.vocab_size = rt.model.arch.vocab_size
        self.prefix_cache = make_prefix_cache(config.cache.cache_type, rt.pool)
        self.scheduler = Scheduler(config.scheduler, rt.pool, self.prefix_cache)
        self.runner = ModelRunner(rt.model, rt.attention, rt.pool, rt.device)
        self.sampler = RequestSampler(self.vocab_size, rt.device, config.model.seed)
        self.eos_ids = frozenset(rt.tokenizer.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self._streams: dict[str, TextStream] = {}
        self._ids = itertools.count()

    # -- requests ---------------------------------------------------------------------

    def add_request(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a request; raises ValueError (with a clear message) for bad input."""
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.validate(prompt_ids, params)
        req = Request(request_id, list(prompt_ids), params)
        self.sampler.add(req, self.eos_ids)
        self.requests[request_id] = req
        self._streams[request_id] = TextStream.for_request(self.tokenizer.tokenizer, params)
        self.scheduler.add(req)
        return request_id

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        params.validate(self.vocab_size)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens, the context length is {self.max_model_len}"
            )
        capacity = self.runtime.pool.num_pages * self.runtime.pool.page_size
        if len(prompt_ids) + 1 > capacity:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens, the KV cache holds {capacity}")

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        return self._finish(req, "abort", None)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # -- the step ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()
        if not plan.seqs:
            return []
        sampling = [s for s in plan.seqs if s.samples]
        try:
            logits = self.runner.run(list(plan.seqs))
            sampled = self.sampler.sample(logits, [s.request for s in sampling])
        except torch.OutOfMemoryError:
            return self._fail_step(plan, "the device ran out of memory in this step")
        return self._update(plan, sampling, sampled)

    def _fail_step(self, plan: StepPlan, why: str) -> list[RequestOutput]:
        """Fail only this step's requests; free their pages and keep serving."""
        self.runtime.executor.recover()
        if self.runtime.device.type == "cuda":
            torch.cuda.empty_cache()
        outputs = []
        for s in plan.seqs:
            if s.request.request_id in self.requests:
                # The KV written in this step is garbage: nothing of it may be cached.
                s.request.num_computed = min(s.request.num_computed, s.start)
                out = self._finish(s.request, "error", None)
                out.error = f"{why} ({plan.num_tokens} tokens); the request was not completed"
                outputs.append(out)
        return outputs

    def _update(self, plan: StepPlan, sampling: list[ScheduledSeq], sampled: SampledTokens) -> list[RequestOutput]:
        for s in plan.seqs:
            s.request.num_computed = s.start + s.length
        outputs = []
        for row, s in enumerate(sampling):
            token, n_top = sampled.token_ids[row], s.request.params.logprobs
            logprob = sampled.logprob_entry(row, n_top) if n_top is not None else None
            outputs.append(self._append_token(s.request, token, logprob))
        return outputs

    def _append_token(self, req: Request, token: int, logprob: TokenLogprob | None) -> RequestOutput:
        req.output_ids.append(token)
        self.sampler.on_token(req, token)
        p, n_out = req.params, len(req.output_ids)
        can_stop = n_out >= p.min_tokens
        reason: tuple[str, str | int | None] | None = None
        text = ""
        if can_stop and token in p.stop_token_ids:
            reason = ("stop", token)
        elif can_stop and not p.ignore_eos and token in self.eos_ids:
            reason = ("stop", None)
        else:
            delta = self._streams[req.request_id].push(token)
            text = delta.text
            if delta.stopped:
                reason = ("stop", self._streams[req.request_id].stop_reason)
        if reason is None and p.max_tokens is not None and n_out >= p.max_tokens:
            reason = ("length", None)
        if reason is None and req.num_tokens >= self.max_model_len:
            reason = ("length", None)
        out = self._output(req, [token], text, [logprob] if logprob else None)
        if reason is not None:
            done = self._finish(req, *reason)
            out.text += done.text
            out.finished, out.finish_reason, out.stop_reason = True, done.finish_reason, done.stop_reason
        return out

    def _finish(self, req: Request, finish_reason: str, stop_reason: str | int | None) -> RequestOutput:
        stream = self._streams.pop(req.request_id)
        tail = stream.finish()
        if tail.stopped and stop_reason is None and finish_reason != "abort":
            finish_reason, stop_reason = "stop", stream.stop_reason
        self.scheduler.finish(req)
        self.sampler.remove(req)
        del self.requests[req.request_id]
        req.finish_reason, req.stop_reason = finish_reason, stop_reason
        out = self._output(req, [], tail.text, None)
        out.finished, out.finish_reason, out.stop_reason = True, finish_reason, stop_reason
        return out

    def _output(self, req: Request, tokens: list[int], text: str, logprobs) -> RequestOutput:  # noqa: ANN001
        return RequestOutput(
            request_id=req.request_id,
            token_ids=tokens,
            text=text,
            logprobs=logprobs,
            num_prompt_tokens=len(req.prompt_ids),
            num_output_tokens=len(req.output_ids),
            num_cached_tokens=req.num_cached or 0,
        )

    # -- scoring ----------------------------------------------------------------------

    def prompt_logits(self, prompt_ids: list[int]) -> torch.Tensor:
        """Float32 logits [T, V] at every prompt position, through the serving path
        (paged KV, chunked by max_prefill_tokens)."""
        self.validate(prompt_ids, SamplingParams())
        req = Request("score", list(prompt_ids), SamplingParams())
        pool, chunk = self.runtime.pool, self.config.scheduler.max_prefill_tokens
        if not self.scheduler.reserve(req, len(prompt_ids)):
            raise ValueError(f"the KV cache cannot hold {len(prompt_ids)} tokens while other requests run")
        try:
            rows = []
            for start in range(0, len(prompt_ids), chunk):
                seq = ScheduledSeq(req, start, min(chunk, len(prompt_ids) - start))
                rows.append(self.runner.run([seq], all_logits=True))
            return torch.cat(rows)
        finally:
            pool.free(req.pages)

    def stats(self) -> dict[str, object]:
        """Engine statistics: expert traffic, KV pool occupancy, the memory plan."""
        pool, plan = self.runtime.pool, self.runtime.plan
        return {
            "moe_backend": plan.backend,
            "moe": self.runtime.executor.stats.snapshot(),
            "kv_pages_total": pool.num_pages,
            "kv_pages_free": pool.num_free,
            "kv_pages_cached": self.prefix_cache.total_pages,
            "kv_pages_evictable": self.prefix_cache.evictable_pages,
            "prefix_cache": {
                "queries": self.prefix_cache.queries,
                "query_tokens": self.prefix_cache.query_tokens,
                "hit_tokens": self.prefix_cache.hit_tokens,
                "hit_rate": self.prefix_cache.hit_rate,
            },
            "requests_running": len(self.scheduler.running),
            "requests_waiting": len(self.scheduler.waiting),
            "memory_plan": dataclasses.asdict(plan),
            **self._device_memory(),
        }

    def _device_memory(self) -> dict[str, int]:
        """What the caching allocator holds on the device (nothing to report on CPU)."""
        device = self.runtime.device
        if device.type != "cuda":
            return {}
        return {
            "device_memory_allocated": torch.cuda.memory_allocated(device),
            "device_memory_reserved": torch.cuda.memory_reserved(device),
        }

    def close(self) -> None:
        self.runtime.executor.close()
        self.requests.clear()
