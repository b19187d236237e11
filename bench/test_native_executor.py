"""The engine beside a busy Python thread (issue 16), side by side with onnxruntime-genai 0.18 in
the same run: SmolLM2-135M-Instruct (the standard-op fp32 paged build, which 0.18 runs too), 16
requests of 28 prompt tokens and 40 new tokens, refilled as they finish until 64 have run, the owner
thread looping engine.run; each engine alone and with one pure-Python spinner thread in the process
(python -m pytest bench/test_native_executor.py -s).

Two effects, measured apart:
- the GIL: after every Engine.run the owner thread must take the GIL back from the spinner, which
  costs up to the interpreter's switch interval (5 ms); the Python executor also waits for it inside
  the step, at every callback, the native executor never. With one ONNX Runtime intra-op thread the
  model and the spinner each have a core of a two-core machine, and this is all that remains.
  Goals (asserted there): the native executor keeps >= 0.8x of its rate alone, and at least 0.18's
  ratio (within 3%: both pay one GIL hand-over per step, and repeated runs on this shared machine
  differ by a few percent).
- CPU oversubscription: with two intra-op threads on two cores the spinner takes a core from the
  model's thread pool, whose parallel loops then wait for a descheduled thread. No executor avoids
  it (a fair share of 2 cores among 3 busy threads leaves the model 0.67x at best), and 0.18 loses
  the same: asserted is that the native executor keeps at least 0.18's ratio at the same thread count.
  With the decoder's default threads the two engines do not run alike: 0.18 runs this decoder on
  one thread (its process uses 1.00 CPU seconds per second alone), oga on ONNX Runtime's default of
  one per core (1.9): the ratios are reported with the CPU each engine used alone, not compared.
Also: the engine and executor overhead of a SmolLM2 step at batch 16 (step time minus the time inside
ONNX Runtime's run; goal <= 0.1%), on the fused fp32 graph (whose LM head hands the engine block
maxima) and on the standard-op one."""
import json
import os
import threading
import time

import numpy as np
import pytest

import oga
from oga import testing
from oga.executor import native as native_executor

from workloads import cached_model_dir, smollm2_gguf

REQUESTS, CONCURRENT, PROMPT, NEW = 64, 16, 28, 40


def _smollm2_standard():
    return cached_model_dir("smollm2-cpu-standard-b16", dict(
        source=smollm2_gguf(), graph="standard", context_length=1024, block_size=16, num_blocks=1100,
        max_batch_size=16, max_scheduled_tokens=512))


def _with_intra_op_threads(model_dir, threads):
    """model_dir's model with model.decoder.session_options.intra_op_num_threads = threads (None: as
    built): a directory beside it that links the graph files and carries an edited config (0.18
    reads the same)."""
    if threads is None:
        return model_dir
    out = f"{model_dir}-intra{threads}"
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(model_dir):
        if name != "genai_config.json" and not os.path.exists(os.path.join(out, name)):
            os.symlink(os.path.join(model_dir, name), os.path.join(out, name))
    with open(os.path.join(model_dir, "genai_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
    with open(os.path.join(out, "genai_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return out


def _refilled(og, model):
    """REQUESTS chats of PROMPT tokens + exactly NEW new tokens, CONCURRENT at a time (a finished one
    is replaced at once); returns (tokens per second, {chat: tokens}, CPU seconds of the process per
    second)."""
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 49152, size=PROMPT).astype(np.int32) for _ in range(REQUESTS)]
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    started, index, tokens = 0, {}, {}

    def begin():
        nonlocal started
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(NEW)
        options.set_min_generated_tokens(NEW)
        request.begin_turn(prompts[started], options)
        index[id(request)] = (started, request)
        tokens[started] = []
        started += 1

    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(CONCURRENT):
        begin()
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.request is None:
                continue
            chat, _ = index[id(event.request)]
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens[chat].append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                del index[id(event.request)]
                if started < REQUESTS:
                    begin()
    seconds = time.perf_counter() - start
    assert sum(len(t) for t in tokens.values()) == REQUESTS * NEW
    return REQUESTS * NEW / seconds, tokens, (time.process_time() - cpu_start) / seconds


def _spin(stop):
    count = 0
    while not stop.is_set():
        count += 1


def _alone_and_busy(og, model):
    _refilled(og, model)  # warm ONNX Runtime's kernels and the page cache
    alone, tokens, cpu = _refilled(og, model)
    stop = threading.Event()
    spinner = threading.Thread(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    try:
        busy, busy_tokens, _ = _refilled(og, model)
    finally:
        stop.set()
        spinner.join()
    assert busy_tokens == tokens
    return alone, busy, cpu, tokens


@pytest.mark.parametrize("threads", [1, 2, None], ids=["ort-1-thread", "ort-2-threads", "ort-default-threads"])
def test_smollm2_with_a_busy_python_thread(benchmark, monkeypatch, threads):
    import onnxruntime_genai as og18

    model_dir = _with_intra_op_threads(_smollm2_standard(), threads)
    results, outputs = {}, {}
    for name, og, executor in (("oga native", oga, "native"), ("oga python executor", oga, "python"),
                               ("onnxruntime-genai 0.18", og18, None)):
        if executor:
            monkeypatch.setenv("OGA_EXECUTOR", executor)
        model = og.Model(model_dir)
        if executor:
            assert native_executor.selections[os.path.join(model_dir, "model.onnx")].executor == executor
        alone, busy, cpu, tokens = _alone_and_busy(og, model)
        results[name] = (alone, busy, cpu)
        outputs[name] = tokens
        del model
    assert outputs["oga native"] == outputs["oga python executor"] == outputs["onnxruntime-genai 0.18"]
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(f"\nSmolLM2 standard fp32, {REQUESTS} chats ({CONCURRENT} at a time, {PROMPT} + {NEW} tokens), intra-op "
          f"threads {threads or 'default'}, {os.cpu_count()} CPUs -- tokens/s alone / beside a busy Python thread "
          "(CPU seconds per second alone):")
    for name, (alone, busy, cpu) in results.items():
        benchmark.extra_info[f"{name} alone tok/s"] = alone
        benchmark.extra_info[f"{name} busy tok/s"] = busy
        benchmark.extra_info[f"{name} alone cpu/s"] = cpu
        print(f"  {name:24s}: {alone:7.1f} / {busy:7.1f}  ({busy / alone:.2f}x)  ({cpu:.2f} CPU)")
    native = results["oga native"][1] / results["oga native"][0]
    reference = results["onnxruntime-genai 0.18"][1] / results["onnxruntime-genai 0.18"][0]
    if threads is not None:
        # the same threads on both: both pay one GIL hand-over per step and the same oversubscription,
        # and repeated runs on this shared machine differ by a few percent
        assert native >= 0.97 * reference, f"the native executor keeps {native:.2f}x, 0.18 {reference:.2f}x"
    if threads == 1:
        assert native >= 0.8, f"the native executor keeps {native:.2f}x of its rate beside a busy thread"


def _smollm2_fused_fp32():
    return cached_model_dir("smollm2-cpu-fused-fp32-b16", dict(
        source=smollm2_gguf(), graph="fused", precision="fp32", context_length=1024, block_size=16, num_blocks=1100,
        max_batch_size=16, max_scheduled_tokens=512))


@pytest.mark.parametrize("graph", ["fused fp32", "standard"])
def test_engine_and_executor_overhead_of_a_smollm2_step_at_batch_16(benchmark, monkeypatch, graph):
    """Step wall time minus the time inside ONNX Runtime's run (the native executor's counter), over
    the decode steps of 16 resident chats. The fused fp32 graph's LM head (oga.LogitsHead) hands the
    engine each row's block maxima, so greedy selection reads one block of 1024 logits per row
    (goal <= 0.1%, asserted); the standard-op graph's (an ONNX Gemm) does not, so it reads all 16 x
    49152 logits back from memory (reported)."""
    monkeypatch.setenv("OGA_EXECUTOR", "native")
    model_dir = _smollm2_fused_fp32() if graph == "fused fp32" else _smollm2_standard()
    model = oga.Model(model_dir)
    selection = native_executor.selections[os.path.join(model_dir, "model.onnx")]
    engine = oga.Engine(model)
    rng = np.random.default_rng(9)
    requests = []  # a request whose last handle goes away is abandoned
    for _ in range(16):
        request = engine.create_request()
        options = oga.TurnOptions(request)
        options.set_min_generated_tokens(80)
        options.set_max_generated_tokens(80)
        request.begin_turn(rng.integers(3, 49152, size=PROMPT).astype(np.int32), options)
        requests.append(request)
    buffer = engine.create_event_buffer(64)
    for _ in range(3):  # the prefill and the first decodes
        engine.run(buffer)
    before, run_before = testing.engine_counters(engine), native_executor.run_ns(selection)

    def decode():
        for _ in range(60):
            engine.run(buffer)
            assert len(buffer) == 16

    benchmark.pedantic(decode, rounds=1, iterations=1)
    after, run_after = testing.engine_counters(engine), native_executor.run_ns(selection)
    steps = after["committed_steps"] - before["committed_steps"]
    step_ns = after["step_ns"] - before["step_ns"]
    overhead = 1.0 - (run_after - run_before) / step_ns
    benchmark.extra_info.update(overhead_fraction=overhead, steps=steps, step_ms=step_ns / steps / 1e6)
    print(f"\nSmolLM2 ({graph}) decode step at batch 16: {step_ns / steps / 1e6:.2f} ms, engine + executor overhead "
          f"{100 * overhead:.3f}% ({(step_ns - (run_after - run_before)) / steps / 1e3:.1f} us/step)")
    if graph == "fused fp32":
        assert overhead <= 0.001
