"""The hybrid presets: `random:qwen3.5-35b-a3b` parses to the published shape (overrides
keep the 3:1 layout), and `random:tiny-qwen3.5-moe` serves a chat through the Qwen3.5
tokenizer and template on the engine path a checkpoint takes."""

from __future__ import annotations

from edgemoe import LLM, SamplingParams
from edgemoe.models.presets import parse_random
from edgemoe.models.registry import model_module
from edgemoe.server.templates import ChatTemplate


def test_qwen3_5_preset_and_overrides() -> None:
    spec = parse_random("random:qwen3.5-35b-a3b")
    a = model_module(spec.config["model_type"]).arch(spec.config)
    assert (a.hidden_size, a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim) == (2048, 40, 16, 2, 256)
    assert (a.num_experts, a.top_k, a.moe_intermediate_size, a.shared_expert_intermediate_size) == (256, 8, 512, 512)
    assert (a.linear_num_key_heads, a.linear_num_value_heads, a.linear_key_head_dim, a.vocab_size) == (16, 32, 128, 248320)
    assert (len(a.gdn_layers), len(a.kv_layers)) == (30, 10)
    small = parse_random("random:qwen3.5-35b-a3b?num_hidden_layers=8,num_experts=16")
    b = model_module(small.config["model_type"]).arch(small.config)
    assert b.kv_layers == (3, 7) and b.store_experts == 17


def test_tiny_preset_chats_with_the_qwen3_5_tokenizer() -> None:
    with LLM("random:tiny-qwen3.5-moe", dtype="float32") as llm:
        tok = llm.tokenizer
        assert tok.tokenizer.token_to_id("<|im_end|>") == 248046 and 248046 in tok.eos_token_ids
        template = ChatTemplate.from_tokenizer(tok)
        assert template is not None
        prompt = template.render([{"role": "user", "content": "Hi"}])
        assert prompt.endswith("<|im_start|>assistant\n<think>\n")
        out = llm.generate([prompt, prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert out[0].token_ids == out[1].token_ids and len(out[0].token_ids) == 6
    assert all(0 <= t < 248320 for t in out[0].token_ids)
