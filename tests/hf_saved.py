"""Checkpoints written by transformers' own `save_pretrained` with weights at unit scale, for
tests that compare our loading of them with transformers' (configs, convert)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from edgemoe.testing.checkpoint import write_tokenizer_files


def scale_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Unit-scale activations (transformers' init, std 0.02, makes near-uniform logits that
    would not tell a wrong LM head from a right one): matrices N(0, 1/fan_in), the
    embedding N(0, 1), 1-d weights (norms, zero-centred or not) shifted by N(0, 0.1²).
    The GDN's A_log, dt_bias and conv keep transformers' init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")) or p.dim() == 3 and "conv" in name:
                continue
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                p.add_(0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))


def save(model: torch.nn.Module, out: Path) -> Path:
    """`model` at unit scale, saved by `save_pretrained` with our test tokenizer files."""
    scale_weights(model)
    model.tie_weights()  # re-tie after the rewrite, where the config ties
    model.save_pretrained(out)
    write_tokenizer_files(out)
    return out


def transformers_logits(path: Path, seq: list[int]) -> torch.Tensor:
    """transformers' own fp32 logits (eager attention) of `seq` on the checkpoint at `path`."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.eval()(torch.tensor([seq])).logits[0]


def assert_logits_match(path: Path, seq: list[int], theirs: torch.Tensor, width: int = 48) -> None:
    """Our fp32 prompt logits of `seq` on `path` are `theirs` to fp32's reduction bound over
    sums of max(`width`, len(seq)) terms."""
    from tolerances import network_atol

    from edgemoe import LLM

    with LLM(str(path), dtype="float32") as llm:
        ours = llm.prompt_logits(seq)
    atol = network_atol(torch.float32, max(width, len(seq)), theirs.abs().max().item())
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)


def assert_greedy_matches_transformers(path: Path, prompts: list[list[int]], tokens: int = 12) -> None:
    """Our greedy tokens for `prompts` are transformers' own (fp32, eager attention) on the
    checkpoint at `path`, and the reference's are not degenerate (a weak test otherwise)."""
    import transformers

    from edgemoe import LLM, SamplingParams

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        expected = [model.eval().generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                          max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                          eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    with LLM(str(path), dtype="float32") as llm:
        greedy = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        got = [o.token_ids for o in llm.generate(prompts, greedy)]
    assert got == expected
    assert len(set(expected[-1])) > 3, "degenerate reference output: weak test"


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]


def served_chat(model_dir: Path, model_type: str, vocab_size: int, eos_ids: list[int]) -> tuple[Any, str, str]:
    """(the server's model for the checkpoint files in `model_dir`, its rendering of CHAT
    with the generation prompt, transformers' rendering of the same)."""
    import transformers

    from edgemoe.messages import EngineReady
    from edgemoe.server.config import ServerConfig
    from edgemoe.server.model import ServedModel

    ready = EngineReady(model_dir=str(model_dir), model_type=model_type, max_model_len=4096, vocab_size=vocab_size,
                        eos_token_ids=eos_ids, pid=0)
    served = ServedModel.load(ready, ServerConfig())
    assert served.template is not None
    theirs = transformers.AutoTokenizer.from_pretrained(model_dir)
    return (served, served.template.render(CHAT, add_generation_prompt=True),
            theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))
