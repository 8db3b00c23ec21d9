"""The engine's side of sampling: per-request SamplingState bookkeeping around the
batched `sampler.sample`, and conversion of its tensors into TokenLogprob records."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemoe.engine.request import Request
from edgemoe.engine.sampler import SampleOutput, SamplingBatch, SamplingState, sample
from edgemoe.messages import TokenLogprob


@dataclass
class SampledTokens:
    """One step's sampled tokens, rows in the order of the requests passed in."""

    token_ids: list[int]
    output: SampleOutput

    def logprob_entry(self, row: int, num_top: int) -> TokenLogprob:
        out = self.output
        assert out.logprobs is not None
        top: list[tuple[int, float]] = []
        if out.top_logprobs is not None and num_top:
            ids = out.top_logprobs.ids[row, :num_top].tolist()
            vals = out.top_logprobs.values[row, :num_top].tolist()
            top = list(zip(ids, vals, strict=True))
        return TokenLogprob(self.token_ids[row], float(out.logprobs[row]), top)


class RequestSampler:
    """Keeps a SamplingState per live request; `sample` runs one batched draw."""

    def __init__(self, vocab_size: int, device: torch.device, seed: int) -> None:
        self.vocab_size, self.device = vocab_size, device
        # The shared generator serves unseeded requests: engine-seeded, so runs repeat.
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.states: dict[str, SamplingState] = {}

    def add(self, req: Request, eos_ids: frozenset[int]) -> None:
        eos = frozenset() if req.params.ignore_eos else eos_ids
        self.states[req.request_id] = SamplingState(req.params, req.prompt_ids, eos, self.device)

    def remove(self, req: Request) -> None:
        self.states.pop(req.request_id, None)

    def on_token(self, req: Request, token: int) -> None:
        self.states[req.request_id].append(token)

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> SampledTokens:
        states = [self.states[r.request_id] for r in reqs]
        batch = SamplingBatch.build(states, self.vocab_size, self.device)
        out = sample(logits, batch, self.generator)
        return SampledTokens(out.token_ids.tolist(), out)
