"""Engine: step = schedule → launch → complete.

`launch(plan)` builds the step's batch, runs the forward pass and the sampler on the
device and starts the sampled ids on their way to the host, without waiting for any of
it; `complete(handle)` waits for those ids (the step's one host synchronisation),
appends them and applies the stop rules. Overlap scheduling is one switch on top
(`--overlap`, engine/overlap.py): launch step N+1 before completing step N (stop checks
one step behind).

Owns every request's state. Not thread-safe: one loop (the engine process, or the
in-process `LLM`) calls `add_request`, `abort` and `step`.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from dataclasses import dataclass

import torch

from edgemoe.cache.registry import make_prefix_cache
from edgemoe.config import EngineConfig
from edgemoe.detokenizer import TextStream
from edgemoe.engine.batch_buffers import PENDING, SeqChunk
from edgemoe.engine.build import Runtime, build_runtime
from edgemoe.engine.constraints import Constraints
from edgemoe.engine.overlap import OverlapLoop
from edgemoe.engine.process_memory import freeze_heap, release_device_memory
from edgemoe.engine.request import Request
from edgemoe.engine.runner import HostResult
from edgemoe.engine.sampling import SampledTokens, SamplingRows, greedy_tokens, sample_step
from edgemoe.engine.scheduler import ScheduledSeq, Scheduler, StepPlan
from edgemoe.engine.scoring import prompt_logits
from edgemoe.engine.state_snapshots import StateSnapshots, opener_token_ids
from edgemoe.messages import RequestOutput, SamplingParams, TokenLogprob
from edgemoe.ple.store import PleFillError


@dataclass
class StepHandle:
    """A launched step: what it computes, and its sampled ids on their way to the host
    (`result` is None when the step failed before sampling)."""

    plan: StepPlan
    sampling: list[ScheduledSeq]
    result: HostResult | None
    error: str | None = None
    # decodes whose token was on the device at launch: `check_openers` looks at them later
    unchecked: tuple[ScheduledSeq, ...] = ()


class Engine:
    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        self.config = config
        rt = build_runtime(config, progress=progress)
        self.runtime = rt
        self.tokenizer = rt.tokenizer
        self.max_model_len = rt.max_model_len
        self.vocab_size = rt.model.arch.vocab_size
        self.prefix_cache = make_prefix_cache(config.cache.cache_type, rt.pool, rt.states, rt.host_tier)
        self.snapshots = StateSnapshots(  # hybrids: the GDN state kept for the prefix cache
            self.prefix_cache, rt.pool.page_size, opener_token_ids(rt.tokenizer.tokenizer.token_to_id)
        ) if self.prefix_cache.stateful else None
        self.scheduler = Scheduler(rt.scheduler, rt.pool, self.prefix_cache, rt.page_table, rt.max_model_len)
        self.runner = rt.runner
        self.profiler = rt.profiler
        self.sampling = SamplingRows(rt.page_table.max_rows + 1, self.vocab_size, rt.device, config.model.seed)
        self.eos_ids = frozenset(rt.tokenizer.eos_token_ids)
        self.constraints = Constraints(rt.tokenizer.tokenizer, self.vocab_size, self.eos_ids)  # structured outputs
        self.requests: dict[str, Request] = {}
        self._streams: dict[str, TextStream] = {}
        self._ids = itertools.count()
        # A PLE store that hashes on the host (disk) needs each chunk's n-gram context.
        ple = rt.ple
        self.ple_context = ple.geometry.context if ple is not None and not ple.hashes_on_device else 0
        self.overlap = OverlapLoop(self) if rt.overlap else None
        freeze_heap(rt.device)  # full collections while serving skip the engine's own objects

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
        self.requests[request_id] = req
        self._streams[request_id] = TextStream.for_request(self.tokenizer.tokenizer, params)
        if params.structured is not None:
            self.constraints.attach(request_id, params.structured, params.stop_token_ids, params.min_tokens)
        self.scheduler.add(req)
        return request_id

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        params.validate(self.vocab_size)
        if params.structured is not None:
            self.constraints.check(params.structured)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        for t in prompt_ids:  # 1.5 once ran as token 1
            if not isinstance(t, numbers.Integral) or isinstance(t, bool):
                raise ValueError(f"prompt token ids must be integers (got {t!r})")
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

    def needs_host_tokens(self) -> bool:
        """Overlap: whether the next step needs the step in flight's tokens (a structured
        output's mask follows every token it sampled; not while it thinks: a tool-call
        constraint's masks are None whatever the token, a JSON output's next one is picked
        on the device from the token in flight, `Constraints.step_masks`)."""
        return self.constraints.wait_for_tokens()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or (self.overlap is not None and self.overlap.in_flight is not None)

    # -- the step ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self.overlap is not None:
            return self.overlap.step()
        plan = self.scheduler.schedule()
        outputs = self.finish_out_of_kv(plan)
        if plan.seqs:
            outputs += self.complete(self.launch(plan))
        return outputs

    def finish_out_of_kv(self, plan: StepPlan) -> list[RequestOutput]:
        """Requests that cannot grow even alone end with `length` (unless a stop rule ended them)."""
        return [self._finish(r, "length", None) for r in plan.out_of_kv if self.requests.get(r.request_id) is r]

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> StepHandle:
        """Run the step on the device; nothing here waits for the device."""
        sampling = [s for s in plan.seqs if s.samples]
        self.profiler.step_begin()
        try:
            for s in plan.seqs:
                if s.request.sampling_row != s.request.row:
                    self.sampling.assign(s.request, self.eos_ids)
            batch, logits = self.runner.forward([self._chunk(s) for s in plan.seqs])
            with self.profiler.region("sampling"):
                rows = tuple(s.request.row for s in sampling)  # type: ignore[misc]
                generated = tuple(s.request.num_generated for s in sampling)  # pending ones too: min_tokens
                allowed = self.constraints.step_masks(
                    ((s.request.request_id, s.request.row if s.request.num_pending else None) for s in sampling),
                    logits.device, self.runner.buffers.last_token)
                if allowed is None and self.sampling.plain_greedy(rows, generated):
                    out = greedy_tokens(logits)  # one kernel, no per-row gathers
                else:
                    sb = self.sampling.batch(rows, batch.sample_rows, generated, allowed)
                    out = sample_step(self.sampling, logits, sb, batch.sample_rows)
                self.runner.buffers.keep_sampled(batch.sample_rows, out.token_ids)  # overlap: next step's input
                result = HostResult.start(out)
        except torch.OutOfMemoryError:
            return StepHandle(plan, sampling, None, "the device ran out of memory in this step")
        except PleFillError as e:  # raised before any of the step's device work
            return StepHandle(plan, sampling, None, str(e))
        finally:
            self.profiler.step_end()
        for s in plan.seqs:
            s.request.num_computed = s.start + s.length
        for s in sampling:
            s.request.num_pending += 1  # until `complete` appends it
        unchecked = self.snapshots.capture(plan) if self.snapshots is not None else ()
        if self.ple_context:
            self._prefetch_prompt_chunks(plan)
        return StepHandle(plan, sampling, result, unchecked=unchecked)

    def _prefetch_prompt_chunks(self, plan: StepPlan) -> None:
        """Prefill: the next chunk of each unfinished prompt, as long as this one, is
        known now; a disk PLE store reads its rows while this step runs."""
        nxt = []
        for s in plan.seqs:
            req, end = s.request, s.start + s.length
            if end < len(req.prompt_ids):
                nxt.append(self._chunk_at(req, end, min(len(req.prompt_ids), end + s.length)))
        self.runner.prefetch(nxt)

    def _prefetch_decodes(self, handle: StepHandle) -> None:
        """Decode: a running request's next token is known the moment it reaches the host;
        a disk PLE store starts reading its rows now, before the next step is scheduled."""
        nxt = []
        for s in handle.sampling:
            req = s.request
            if req.request_id in self.requests and req.row is not None and req.num_tokens > len(req.prompt_ids):
                nxt.append(self._chunk_at(req, req.num_tokens - 1, req.num_tokens))
        self.runner.prefetch(nxt)

    def check_openers(self, handle: StepHandle) -> None:
        """Overlap: see `StateSnapshots.check_openers`."""
        if self.snapshots is not None:
            self.snapshots.check_openers(handle.unchecked, lambda r: self.requests.get(r.request_id) is r)

    def complete(self, handle: StepHandle) -> list[RequestOutput]:
        """Wait for the step's sampled ids; append them and apply the stop rules."""
        if handle.result is None:
            return self._fail_step(handle.plan, handle.error or "the step failed")
        sampled = SampledTokens(handle.result.wait().token_ids.tolist(), handle.result.output)
        outputs = []
        for row, s in enumerate(handle.sampling):
            s.request.num_pending -= 1
            if self.requests.get(s.request.request_id) is not s.request:
                continue  # finished or aborted while the step ran: its token is dropped, never streamed
            token, n_top = sampled.token_ids[row], s.request.params.logprobs
            logprob = sampled.logprob_entry(row, n_top) if n_top is not None else None
            outputs.append(self._append_token(s.request, token, logprob))
        if self.ple_context:
            self._prefetch_decodes(handle)
        return outputs

    def _chunk(self, s: ScheduledSeq) -> SeqChunk:
        return self._chunk_at(s.request, s.start, s.start + s.length, s.samples)

    def _chunk_at(self, req: Request, start: int, end: int, samples: bool = True) -> SeqChunk:
        assert req.row is not None
        ctx = self.ple_context
        # Overlap: a decode's token the step in flight sampled is read on the device.
        ids = req.token_slice(start, end) if end <= req.num_known else [PENDING]
        assert ids != [PENDING] or end - start == 1 == end - req.num_known, "only a decode's token can be pending"
        return SeqChunk(
            row=req.row, start=start, token_ids=ids, pages=req.pages,
            in_prompt=start < len(req.prompt_ids), wants_logits=samples,
            context=req.token_slice(max(0, start - ctx), start) if ctx else (),
        )

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

    def _append_token(self, req: Request, token: int, logprob: TokenLogprob | None) -> RequestOutput:
        req.output_ids.append(token)
        self.constraints.accept(req.request_id, token)
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
        if reason is None and req.num_known >= self.max_model_len:
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
        if req.row is not None:
            self.sampling.release(req.row)
        self.constraints.release(req.request_id)
        self.scheduler.finish(req)
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
        """Float32 logits [T, V] at every prompt position, through the serving path."""
        return prompt_logits(self, prompt_ids)

    def stats(self) -> dict[str, object]:
        """Engine statistics: expert traffic, KV pool occupancy, the memory plan."""
        pool, plan = self.runtime.pool, self.runtime.plan
        self._step_ended()
        return {
            "moe_backend": plan.backend,
            "routing": self.runtime.routing,
            "moe": {**self.runtime.executor.stats.snapshot(), "routing": self.runtime.routing},
            "kv_pages_total": pool.num_pages,
            "kv_pages_free": pool.num_free,
            "kv_pages_cached": self.prefix_cache.total_pages,
            "kv_pages_evictable": self.prefix_cache.evictable_pages,
            "prefix_cache": {
                "queries": self.prefix_cache.queries,
                "query_tokens": self.prefix_cache.query_tokens,
                "hit_tokens": self.prefix_cache.hit_tokens,
                "hit_rate": self.prefix_cache.hit_rate,
                **self.prefix_cache.tier_stats(),
            },
            "requests_running": len(self.scheduler.running),
            "requests_waiting": len(self.scheduler.waiting),
            "memory_plan": dataclasses.asdict(plan),
            **self._device_memory(),
        }

    def watch_experts(self, on: bool) -> None:
        """Mark per-(layer, expert) activity for `expert_map` (the live view); off, it costs nothing."""
        self.runtime.executor.stats.watch(self.runtime.model.arch.num_experts if on else None)

    def expert_map(self) -> dict[str, object] | None:
        """Each MoE layer's experts since the last call, one code each (moe/activity.py); None unwatched."""
        executor, arch = self.runtime.executor, self.runtime.model.arch
        if executor.stats.activity is None:
            return None
        self._step_ended()
        executor.stats.resolve()  # the resident executor's device counters mark their hits
        cells = executor.stats.activity.take(arch.moe_layers, executor.resident_mask())
        return {"layers": list(arch.moe_layers), "num_experts": arch.num_experts, "cells": cells}

    def _step_ended(self) -> None:
        """The step in flight ends before the statistics' blocking copies, waited for without
        holding the driver (moe/movers.CopierMover's note: its graph may wait on the copier)."""
        if self.runtime.device.type == "cuda":
            torch.cuda.current_stream(self.runtime.device).synchronize()

    def _device_memory(self) -> dict[str, int]:
        """What the engine holds on the device (nothing to report on CPU): the caching
        allocator's blocks and the slot banks mapped beside it (moe/lendable_memory.py)."""
        device = self.runtime.device
        if device.type != "cuda":
            return {}
        banks = getattr(getattr(self.runtime.executor, "slots", None), "outside_allocator", 0)
        return {"device_memory_allocated": torch.cuda.memory_allocated(device) + banks,
                "device_memory_reserved": torch.cuda.memory_reserved(device) + banks}

    def close(self) -> None:
        """Stop the engine's threads and give back its device memory, so the next engine in
        this process has it (`edgemoe.LLM.close`; the engine process simply exits). The
        engine is unusable afterwards; a second close does nothing."""
        rt: Runtime | None = self.__dict__.get("runtime")
        if rt is None:
            return
        rt.executor.close()
        if rt.ple is not None:  # its filler thread, and the tables it page-locked
            rt.ple.close()
        embed_close = getattr(rt.model.embed, "close", None)  # a host embedding's page-locking
        if embed_close is not None:
            embed_close()
        self.requests.clear()
        self._streams.clear()
        device = rt.device
        del rt
        # NOTE: after this the engine refers to nothing on the device, so its memory is free
        # even while a caller still holds the closed Engine (a script's local variable).
        for name in _DEVICE_HOLDERS:
            del self.__dict__[name]
        release_device_memory(device)


# Engine attributes that reach device memory (model, executor, KV pool, state rows, CUDA
# graphs, workspaces, sampling rows); `close` drops them.
_DEVICE_HOLDERS = ("runtime", "runner", "profiler", "scheduler", "prefix_cache", "snapshots", "sampling", "overlap")
