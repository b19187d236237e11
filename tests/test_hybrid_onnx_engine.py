"""Hybrid ONNX decoders (short-convolution and linear-recurrent layers beside paged attention) on the
whole engine: the FixedStatePool's bank views and gathered rows bound by the ONNX Runtime executor.
Greedy streams of concurrent requests -- chunked prefills, staggered admissions, slot reuse --
equal the numpy reference and each request run alone."""
import numpy as np
import pytest

import oga as og
from oga import testing
from oga.models import build
from oga.models.random_weights import random_model, tiny_spec
from oga.models.reference import greedy

PROMPTS = [list(range(3, 45)), [5, 9, 13], [7] * 20, [11, 4], list(range(60, 20, -3)), [8, 8, 9]]
MAX_GEN = 12


def hybrid_spec(layer_types, **overrides):
    fields = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=len(layer_types), num_heads=4,
                  num_kv_heads=2, head_dim=8, context_length=256, layer_types=list(layer_types), conv_kernel=4)
    fields.update(overrides)
    return tiny_spec(**fields)


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    """(name, graph) -> (model dir, spec), each as both CPU graphs (standard ops, oga's fused operators)."""
    out = {}
    for name, spec in (
            ("crca", hybrid_spec(["conv", "attention", "recurrent", "attention"])),
            ("mixed5", hybrid_spec(["recurrent", "conv", "attention", "conv", "recurrent"], conv_kernel=3,
                                   num_kv_heads=1, tie_word_embeddings=True))):
        for graph in ("standard", "fused"):
            path = tmp_path_factory.mktemp(f"{name}-{graph}")
            # 16 tokens per step: long prompts prefill in chunks beside other rows' decodes.
            build(None, str(path), random_spec=spec, block_size=4, max_batch_size=4, max_scheduled_tokens=16,
                  seed=5, graph=graph)
            out[name, graph] = (str(path), spec)
    return out


def run(og_module, model_dir, prompts, starts, check=None, setup=None):
    """Greedy turns of MAX_GEN tokens; prompt i begins at Run starts[i]. Returns tokens per prompt."""
    engine = og_module.Engine(og_module.Model(model_dir))
    if setup is not None:
        setup(engine)
    requests = [None] * len(prompts)
    tokens = [[] for _ in prompts]
    buffer = engine.create_event_buffer(16)
    runs = 0
    while runs < 2000:
        for i, prompt in enumerate(prompts):
            if requests[i] is None and starts[i] <= runs:
                requests[i] = engine.create_request()
                options = og_module.TurnOptions(requests[i])
                options.set_max_generated_tokens(MAX_GEN)
                requests[i].begin_turn(np.asarray(prompt, np.int32), options)
        if not engine.has_pending_requests():
            if all(r is not None for r in requests):
                break
            runs += 1
            continue
        for event in engine.run(buffer):
            if event.request is None:
                assert event.flags & og_module.EngineEventFlags.CAPACITY_BLOCKED, (event.flags, event.error_code)
                continue
            assert not event.flags & og_module.EngineEventFlags.FAILED, event.error_code
            i = next(k for k, r in enumerate(requests) if r is event.request)
            if event.flags & og_module.EngineEventFlags.TOKEN:
                tokens[i].append(event.token)
            if event.flags & og_module.EngineEventFlags.TURN_FINISHED and i % 2 == 0:
                requests[i].close()  # frees its slot for a later admission
        if check is not None:
            check(engine)
        runs += 1
    return tokens, engine


STARTS = [0, 0, 1, 3, 9, 20]  # six requests through four slots


def reference_streams(spec):
    loaded = random_model(spec, seed=5)
    return [[t for t in greedy(loaded, p, MAX_GEN) if t not in spec.eos_token_ids] for p in PROMPTS]


@pytest.mark.parametrize("name", ["crca", "mixed5"])
def test_onnxruntime_genai_runs_the_hybrid_model_like_the_reference(hybrid_dirs, name):
    """onnxruntime-genai 0.18's engine (the contract's origin) runs the same directories: the
    builder's hybrid decoders follow its fixed-state contract."""
    import onnxruntime_genai as og018
    model_dir, spec = hybrid_dirs[name, "standard"]
    assert run(og018, model_dir, PROMPTS, STARTS)[0] == reference_streams(spec)


@pytest.mark.parametrize("graph", ["standard", "fused"])
@pytest.mark.parametrize("name", ["crca", "mixed5"])
def test_concurrent_requests_match_the_reference_and_running_alone(hybrid_dirs, name, graph):
    model_dir, spec = hybrid_dirs[name, graph]
    starts = STARTS
    tokens, engine = run(og, model_dir, PROMPTS, starts, check=testing.check_invariants)
    assert tokens == reference_streams(spec)
    counters = testing.engine_counters(engine)
    assert counters["fixed_state_direct_steps"] > 0 and counters["fixed_state_fallback_steps"] > 0
    alone = [run(og, model_dir, [p], [0])[0][0] for p in PROMPTS]
    assert alone == tokens
    # Every step gathered and staged: the same streams.
    fallback, engine = run(og, model_dir, PROMPTS, starts,
                           setup=lambda e: testing.set_fixed_state_fallback_only(e, True))
    assert fallback == tokens
    assert testing.engine_counters(engine)["fixed_state_direct_steps"] == 0


def test_the_committed_state_is_the_references(hybrid_dirs):
    """After a turn, the request's committed rows hold the reference's state after its processed
    tokens (prompt plus every generated token but the last)."""
    from oga.models.reference import forward_with_states

    model_dir, spec = hybrid_dirs["crca", "fused"]
    loaded = random_model(spec, seed=5)
    engine = og.Engine(og.Model(model_dir))
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(MAX_GEN)
    prompt = PROMPTS[0]
    request.begin_turn(prompt, options)
    generated = []
    buffer = engine.create_event_buffer(16)
    while engine.has_pending_requests():
        generated += [e.token for e in engine.run(buffer) if e.flags & og.EngineEventFlags.TOKEN]
    _, states = forward_with_states(loaded, prompt + generated[:-1])
    decoder_layers = [0, 2]  # fixed_conv [0], fixed_recurrent [2]: the tensors in state_groups order
    for tensor, layer in enumerate(decoder_layers):
        row = np.frombuffer(testing.fixed_state_row(request, tensor), dtype=np.float32).reshape(states[layer].shape)
        np.testing.assert_allclose(row, states[layer], atol=1e-4)
    assert testing.fixed_state_slot(request)["committed_tokens"] == len(prompt) + len(generated) - 1


def test_drafts_on_a_hybrid_decoder_keep_the_greedy_streams(tmp_path):
    """Per-token logits and per-token state outputs (the builder's default for such hybrid decoders):
    proposals right for a prefix and then wrong commit the state after the last accepted token, so
    the streams stay the reference's."""
    import random

    spec = hybrid_spec(["conv", "attention", "recurrent", "attention"])
    path = str(tmp_path / "hybrid_drafts")
    build(None, path, random_spec=spec, block_size=4, max_batch_size=4, max_scheduled_tokens=32, seed=5,
          per_token_logits=True)
    expected = reference_streams(spec)[:4]
    engine = og.Engine(og.Model(path))
    assert engine.max_draft_tokens_per_proposal() == 7
    rng = random.Random(3)
    requests, streams = [], [[] for _ in expected]
    for prompt in PROMPTS[:4]:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(MAX_GEN)
        request.begin_turn(prompt, options)
        requests.append(request)
    buffer = engine.create_event_buffer(64)
    partial = 0
    while engine.has_pending_requests():
        for i, request in enumerate(requests):
            done = len(streams[i])
            if 0 < done < len(expected[i]):
                want = expected[i][done:done + rng.randrange(2, 6)]
                keep = rng.randrange(0, len(want))
                partial += 1
                request.set_draft_tokens(want[:keep] + [(t + 1) % 97 for t in want[keep:]])
        for event in engine.run(buffer):
            assert event.request is not None and not event.flags & og.EngineEventFlags.FAILED
            if event.flags & og.EngineEventFlags.TOKEN:
                streams[requests.index(event.request)].append(event.token)
        testing.check_invariants(engine)
    assert streams == expected
    assert partial > 0 and engine.get_speculative_stats()["partial_accept_rounds"] > 0
