"""Generators that share one engine (engine.shared_generators, an oga opt-in): every Generator of the
model is a set of requests of one engine run by a background owner thread, so unchanged Generator
loops on many threads get continuous batching. Each Generator must still get exactly the tokens
it gets alone (greedy and seeded sampling), with its own rows, pacing, logits and rewinds."""

import json
import threading

import numpy as np
import pytest

import oga as og
from helpers import OracleSequence, prompt_without_eos
from oga import _core
from oga import executor as executors
from static_models import tiny_llama_static_dir  # noqa: F401

VOCAB, EOS = 64, 1


def shared_test_model(max_batch_size=4, num_blocks=128, preemption=None, shared=True):
    dynamic = {"block_size": 4, "num_blocks": num_blocks, "max_batch_size": max_batch_size}
    if preemption is not None:
        dynamic["preemption"] = preemption
    config = {"model": {"type": "oga_test", "vocab_size": VOCAB, "context_length": 128, "eos_token_id": EOS,
                        "bos_token_id": 0, "pad_token_id": 0, "decoder": {}},
              "search": {"max_length": 128, "do_sample": False},
              "engine": {"dynamic_batching": dynamic, "shared_generators": shared},
              "test_model": {}}
    return _core._test_model_create(json.dumps(config))


def generator(model, **search):
    params = og.GeneratorParams(model)
    params.set_search_options(**search)
    return og.Generator(model, params)


def greedy(prompt, length):
    oracle = OracleSequence(VOCAB, (EOS,), 10**6)
    oracle.extend(prompt)
    sequence = list(prompt)
    while len(sequence) < length:
        token = oracle.greedy()
        if token == EOS:
            break
        sequence.append(token)
        oracle.append(token)
    return sequence


def loop(g, prompt, out, key):
    g.append_tokens(np.array(prompt, np.int32))
    while not g.is_done():
        g.generate_next_token()
    out[key] = [g.get_sequence(i).tolist() for i in range(int(g.get_sequence(0).size and 1))]


def run_threads(model, jobs, generators=None, **search):
    """jobs: {key: prompt}; one thread per job, each with its own Generator loop (`generators`:
    {key: Generator} made beforehand, else each thread makes its own)."""
    out, errors = {}, []

    def worker(key, prompt):
        try:
            g = generators[key] if generators is not None else generator(model, **search)
            loop(g, prompt, out, key)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=item) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return {key: rows[0] for key, rows in out.items()}


def test_many_threads_each_get_their_own_greedy_tokens():
    model = shared_test_model(max_batch_size=4)
    jobs = {i: prompt_without_eos(24, offset=i) for i in range(10)}  # more Generators than rows
    assert run_threads(model, jobs, max_length=24) == {i: greedy(p, 24) for i, p in jobs.items()}


def test_seeded_sampling_is_the_same_as_alone():
    prompts = {i: prompt_without_eos(24, offset=i) for i in range(6)}
    search = dict(max_length=24, do_sample=True, top_k=0, temperature=1.5, random_seed=11)
    alone = run_threads(shared_test_model(shared=False), {0: prompts[0]}, **search)
    shared = run_threads(shared_test_model(), prompts, **search)
    private = {i: run_threads(shared_test_model(shared=False), {i: p}, **search)[i] for i, p in prompts.items()}
    assert shared == private and shared[0] == alone[0]


def test_batches_logits_and_rewinds_on_the_shared_engine():
    model = shared_test_model(max_batch_size=8)
    other = generator(model, max_length=30)
    other.append_tokens(prompt_without_eos(30, offset=5))
    other.generate_next_token()  # another Generator's rows stay resident meanwhile
    prompts = [prompt_without_eos(20, offset=0), prompt_without_eos(20, offset=1)]
    g = generator(model, max_length=20, batch_size=2)
    g.append_tokens(prompts)
    oracle = OracleSequence(VOCAB, (EOS,), 10**6)
    oracle.extend(prompts[0])
    logits = g.get_logits()
    assert logits.shape == (2, 1, VOCAB) and int(np.argmax(logits[0, 0])) == oracle.greedy()
    forced = np.full((2, VOCAB), -5.0, np.float32)
    forced[:, 33] = 5.0
    g.set_logits(forced)
    g.generate_next_token()
    assert [g.get_sequence(i).tolist()[-1] for i in range(2)] == [33, 33]
    while not g.is_done():
        g.generate_next_token()
    assert g.get_sequence(0).tolist() == greedy(prompts[0] + [33], 20)
    single = generator(model, max_length=30)
    prompt = prompt_without_eos(30, offset=2)
    single.append_tokens(prompt)
    for _ in range(8):
        single.generate_next_token()
    full = single.get_sequence(0).tolist()
    single.rewind_to(len(prompt) + 2)
    for _ in range(5):
        single.generate_next_token()
    assert single.get_sequence(0).tolist() == full[:len(prompt) + 8]
    while not other.is_done():
        other.generate_next_token()
    assert other.get_sequence(0).tolist() == greedy(prompt_without_eos(30, offset=5), 30)


def test_terminate_session_wakes_a_waiting_generator_and_closing_frees_its_rows():
    model = shared_test_model(max_batch_size=2)
    g = generator(model, max_length=40)
    g.append_tokens(prompt_without_eos(40))
    g.generate_next_token()
    g.set_runtime_option("terminate_session", "1")
    with pytest.raises(RuntimeError, match="^Session in Terminated state, exiting!$"):
        g.generate_next_token()
    g.set_runtime_option("terminate_session", "0")
    g.generate_next_token()
    assert g.token_count() == 5
    del g  # its rows leave the engine: two new Generators fit its two residency slots
    jobs = {i: prompt_without_eos(16, offset=i) for i in range(2)}
    assert run_threads(model, jobs, max_length=16) == {i: greedy(p, 16) for i, p in jobs.items()}


def test_models_that_cannot_share_are_refused():
    with pytest.raises(RuntimeError, match='needs engine.dynamic_batching.preemption "recompute"'):
        generator(shared_test_model(preemption="none"), max_length=10)


def test_one_engine_serves_every_generator_of_an_onnx_model(tmp_path_factory, monkeypatch):
    """On a real paged decoder: Generators on 8 threads run on one engine executor, and their tokens
    are those each gets on an engine of its own. (The Python executor, whose per-engine objects the
    test counts.)"""
    from model_dirs import executor_model_dir

    monkeypatch.setenv("OGA_EXECUTOR", "python")
    directory = executor_model_dir(tmp_path_factory, "tiny-llama")
    config = og.Config(directory)
    config.overlay('{"engine": {"shared_generators": true}}')
    shared_model = og.Model(config)
    prompts = {i: [1, 5 + i, 9, 13 + 2 * i] for i in range(8)}
    before = set(map(id, executors.OnnxEngineExecutor.live))
    generators = {i: generator(shared_model, max_length=20) for i in prompts}
    opened = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    assert len(opened) == 1  # one engine for all eight
    shared = run_threads(shared_model, prompts, generators=generators)
    alone_model = og.Model(directory)
    alone = {i: run_threads(alone_model, {i: p}, max_length=20)[i] for i, p in prompts.items()}
    assert shared == alone


def test_chat_threads_on_smollm2_get_their_tokens_alone(smollm2_dir):
    """SmolLM2 (oga's standard-op fp32 paged build, whose results do not depend on the batch): 8
    threads each running a chat Generator loop on the shared engine get exactly the tokens each
    gets on an engine of its own (bench/test_generator.py runs 16 threads on the int4 build)."""
    tokenizer = og.Tokenizer(og.Model(smollm2_dir))
    questions = ["What is the capital of France?", "Name a colour.", "What is 2+2?", "Say hello.",
                 "Who wrote Hamlet?", "What is water made of?", "Count to five.", "Name a planet."]
    prompts = {i: tokenizer.encode(tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": q}]),
                                                                 add_generation_prompt=True)).tolist()
               for i, q in enumerate(questions)}
    config = og.Config(smollm2_dir)
    config.overlay('{"engine": {"shared_generators": true}}')
    shared = run_threads(og.Model(config), prompts, max_length=56)
    alone_model = og.Model(smollm2_dir)
    alone = {i: run_threads(alone_model, {i: p}, max_length=56)[i] for i, p in prompts.items()}
    assert shared == alone


def test_a_static_model_cannot_share(tiny_llama_static_dir):
    config = og.Config(tiny_llama_static_dir)
    config.overlay('{"engine": {"shared_generators": true}}')
    with pytest.raises(RuntimeError, match="engine.shared_generators needs engine.dynamic_batching"):
        generator(og.Model(config), max_length=10)
