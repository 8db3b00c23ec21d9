"""Where the copier hangs in the full-size engine (docs/offload.md, "The copy engine inside the
graph"). On the H100 (2026-12-07 14:48-14:57) every `EDGEMOE_COPIER=1 --expert-mover copy` run of
`random:qwen3-30b-a3b` hung after the engine was built (its GPU tests, on a small model, pass):
the engine thread waited in a device read after the prompt while the overlapped first decode
step's graph waited on a done word. The suspect: a blocking driver call on the engine thread
(that read is a copy to pageable memory; a module load is another) holds the driver while it
waits for the device, so the copier's `cuMemcpyHtoDAsync` cannot be issued and the device
waits for ever. This builds the same engine and runs two phases in a worker thread, each
under `--seconds`:
- generate: a whole request, nothing read from the device until it ends (should finish);
- stats-in-flight: a prompt stepped to its first token, then the statistics read at once
  (the bench's order; `Engine.stats` now waits for the step in flight first: should finish);
- raw-read-in-flight: the same with the expert cache's counts copied to pageable memory
  directly, while the overlapped decode step is in flight (hangs if the suspect is right).
A phase that does not finish prints what the host can read without the device: the
copier's counts (did its thread see any ring? did a copy fail?), each row's flag (a ring
published and not taken), whether its thread is inside a ring (stuck in a driver call), and
every Python thread's stack; then the probe exits 3 (the device is wedged).

    EDGEMOE_COPIER=1 PYTHONPATH=/tmp/site:src python3 scripts/gpu_copier_probe.py [--seconds 60]
        [--expert-dtype fp8] [--prompt-tokens 256] [--decode-tokens 16] [--no-cuda-graph]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import threading

from edgemoe import LLM, SamplingParams


def copier_state(llm: LLM) -> dict[str, object]:
    """The host's view of the chain's copier: nothing here reads device memory."""
    mover = getattr(llm.engine.runtime.executor, "mover", None)
    bell = getattr(mover, "bell", None)
    if bell is None:
        return {"copier": None, "mover": type(mover).__name__}
    return bell.host_view()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--model", default="random:qwen3-30b-a3b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--expert-dtype", default="fp8")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--no-cuda-graph", action="store_true")
    args = p.parse_args()
    if os.environ.get("EDGEMOE_COPIER") != "1":
        print("set EDGEMOE_COPIER=1: the copier is opt-in", file=sys.stderr)
        return 2
    llm = LLM(args.model, device=args.device, gpu_memory="16GiB", kv_tokens=8192, routing="synthetic",
              moe_backend="offload", expert_cache="device", expert_dtype=args.expert_dtype, expert_mover="copy",
              no_cuda_graph=args.no_cuda_graph)
    print("before:", json.dumps(copier_state(llm)), flush=True)
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    prompt = list(range(1000, 1000 + args.prompt_tokens))
    raw = llm.engine.runtime.executor.cache.read_counts  # a copy to pageable memory, no wait first
    for name, phase in (("generate", lambda: llm.generate([prompt], params)),
                        ("stats-in-flight", lambda: read_in_flight(llm, prompt, params, llm.stats)),
                        ("raw-read-in-flight", lambda: read_in_flight(llm, prompt, params, raw))):
        watch(llm, name, phase, args.seconds)
    return 0


def read_in_flight(llm: LLM, prompt: list[int], params: SamplingParams, read) -> None:  # noqa: ANN001
    """The bench's order: a prompt stepped to its first token, then `read()` at once."""
    engine = llm.engine
    rid = engine.add_request(prompt, params)
    while not any(out.request_id == rid and out.token_ids for out in engine.step()):
        pass
    read()  # while the next step may be in flight
    while engine.has_work():
        engine.step()


def watch(llm: LLM, name: str, phase, seconds: float) -> None:  # noqa: ANN001 - a callable
    """`phase` in a worker thread; on a timeout the host's view and every stack, then exit 3."""
    done = threading.Event()

    def run() -> None:
        phase()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    if done.wait(seconds):
        print(f"{name} finished:", json.dumps(copier_state(llm)), flush=True)
        return
    print(f"{name} hung after {seconds:.0f} s:", json.dumps(copier_state(llm)), flush=True)
    faulthandler.dump_traceback(all_threads=True)
    os._exit(3)  # NOTE: no clean exit: the device is waiting on a word nobody will write


if __name__ == "__main__":
    sys.exit(main())
