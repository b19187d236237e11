"""SmolLM2-135M-Instruct at 4 bits beside other work, oga against onnxruntime-genai 0.18 in the same run
(python -m pytest bench/test_under_load.py -s): oga's default build (fused graph, GGUF Q4_1 / Q8_0 blocks,
oga.QuantizedLinear on oga's own operator pool) and 0.18 on its own int4 build (bench/test_quantized_cpu.py's
directories), 1 request and 16 chats (64 new tokens each, all begun at once, greedy), each

- alone,
- beside one busy pure-Python thread in the same process (a server's event loop is one),
- beside one CPU-bound process.

Goals asserted (issue 29): beside the busy thread oga keeps at least 0.8x its rate alone and at least 0.18's
ratio; beside the busy process oga's rates are at least 0.18's under the same competition. On a machine shared
with other work the figures move from run to run; each is the best of two."""
import os
import subprocess
import sys
import threading

import pytest

from test_quantized_cpu import oga_int4_dir, ort_genai_int4_dir
from workloads import chat_prompts, run_turns

NEW_TOKENS = 64
CONDITIONS = ("alone", "busy thread", "busy process")


class _BusyThread:
    def __enter__(self):
        self.stop = threading.Event()

        def spin():
            n = 0
            while not self.stop.is_set():
                n += 1

        self.thread = threading.Thread(target=spin, daemon=True)
        self.thread.start()

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


class _BusyProcess:
    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


class _Alone:
    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass


LOADS = {"alone": _Alone, "busy thread": _BusyThread, "busy process": _BusyProcess}


@pytest.mark.parametrize("count", [1, 16])
def test_rates_beside_other_work(benchmark, count):
    import onnxruntime_genai as og18

    import oga

    engines = {"oga": (oga, oga_int4_dir()), "onnxruntime-genai 0.18 int4": (og18, ort_genai_int4_dir())}
    prompts = chat_prompts(os.path.join(oga_int4_dir(), "tokenizer.json"), count)
    rates = {}

    def measure():
        for _ in range(2):
            for condition, load in LOADS.items():
                for name, (module, model_dir) in engines.items():
                    with load():
                        tokens, seconds = run_turns(module, model_dir, prompts, NEW_TOKENS)[:2]
                    rates[name, condition] = max(rates.get((name, condition), 0.0), tokens / seconds)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    print(f"\nSmolLM2 4-bit, {count} request(s), {NEW_TOKENS} new tokens each, tokens/s:")
    for name in engines:
        alone = rates[name, "alone"]
        print(f"  {name:30s} " + "   ".join(
            f"{condition} {rates[name, condition]:7.1f} ({rates[name, condition] / alone:4.2f}x)"
            for condition in CONDITIONS))
        for condition in CONDITIONS:
            benchmark.extra_info[f"{name} {condition}"] = rates[name, condition]
    oga_ratio = rates["oga", "busy thread"] / rates["oga", "alone"]
    peer_ratio = rates["onnxruntime-genai 0.18 int4", "busy thread"] / rates["onnxruntime-genai 0.18 int4", "alone"]
    assert oga_ratio >= 0.8, oga_ratio
    assert oga_ratio >= peer_ratio, (oga_ratio, peer_ratio)
    assert rates["oga", "busy process"] >= rates["onnxruntime-genai 0.18 int4", "busy process"]
