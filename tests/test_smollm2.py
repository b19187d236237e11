"""SmolLM2-135M-Instruct end to end on CPU: built by oga.models (by default: the fused graph with
the GGUF's own Q4_1 / Q8_0 blocks), run by og.Engine."""
import numpy as np
import pytest
from tokenizers import Tokenizer

import oga as og
from greedy_runs import greedy
from oga import testing
from static_models import smollm2_static_dir  # noqa: F401  (fixture)

PROMPTS = [
    "The capital of France is", "Water boils at a temperature of", "The largest planet in the solar system is",
    "def fibonacci(n):", "Once upon a time, there was a", "The chemical symbol for gold is",
    "1, 2, 3, 4, 5,", "In 1492, Christopher Columbus", "The opposite of hot is", "My favourite fruit is the",
    "Translate to French: cat ->", "The speed of light is approximately", "A haiku about the sea:",
    "import numpy as np\n", "The quick brown fox", "Monday, Tuesday, Wednesday,",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_int4_dir):
    return Tokenizer.from_file(f"{smollm2_int4_dir}/tokenizer.json")


def _submit(engine, token_lists, max_new):
    requests = []
    for tokens in token_lists:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(max_new)
        request.begin_turn(np.asarray(tokens, dtype=np.int32), options)
        requests.append(request)
    return requests


def _drain(engine, buffer):
    streams = {}
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            assert event.request is not None, (event.flags, event.error_code)
            if event.token is not None:
                streams.setdefault(event.request, []).append(event.token)
    return streams


def test_capital_of_france(smollm2_int4_dir, tokenizer):
    engine = og.Engine(og.Model(smollm2_int4_dir))
    [request] = _submit(engine, [tokenizer.encode("The capital of France is").ids], 6)
    streams = _drain(engine, engine.create_event_buffer(8))
    assert "Paris" in tokenizer.decode(streams[request])


@pytest.mark.parametrize("build", ["int4-fused", "fp32-standard"])
def test_sixteen_prompts_in_flight_equal_each_alone(request, build, tokenizer):
    model_dir = request.getfixturevalue("smollm2_int4_dir" if build == "int4-fused" else "smollm2_dir")
    model = og.Model(model_dir)
    token_lists = [tokenizer.encode(p).ids for p in PROMPTS]
    alone = []
    for tokens in token_lists:
        engine = og.Engine(model)
        [request] = _submit(engine, [tokens], 10)
        alone.append(_drain(engine, engine.create_event_buffer(4)).get(request, []))
    engine = og.Engine(model)
    requests = _submit(engine, token_lists, 10)
    buffer = engine.create_event_buffer(32)
    together = {}
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.token is not None:
                together.setdefault(event.request, []).append(event.token)
        testing.check_invariants(engine)
    together = [together.get(r, []) for r in requests]
    assert all(len(tokens) > 0 for tokens in alone)
    # Every operator of both graphs computes a row the same way whatever rows run beside it (the fused
    # graph's quantized linears are oga.QuantizedLinear: one fixed-order sum per output), so each
    # stream is exactly its solo run.
    assert together == alone
    # All 16 were resident together: the batch really was continuous, not sequential.
    assert testing.engine_counters(engine)["committed_steps"] < sum(len(t) for t in alone)


def test_engine_token_table_reproduces_the_tokenizers_decode(smollm2_int4_dir, tokenizer):
    """The token text stop strings and guidance use: byte-exact pieces whose concatenation decodes to
    what the tokenizers package decodes, special tokens flagged."""
    from oga.tokenizer import _engine_token_table

    blob, offsets, special = _engine_token_table(str(smollm2_int4_dir))
    assert len(special) == tokenizer.get_vocab_size(with_added_tokens=True)
    assert special[tokenizer.token_to_id("<|im_end|>")] == 1 and special[tokenizer.token_to_id("Paris")] == 0
    for text in ["The capital of France is Paris.", "naïve café — 日本語 😀", "  spaces\n\ttabs"]:
        ids = tokenizer.encode(text).ids
        joined = b"".join(blob[offsets[i]:offsets[i + 1]] for i in ids)
        assert joined.decode("utf-8") == tokenizer.decode(ids)


def test_stop_string_on_the_real_model(smollm2_int4_dir, tokenizer):
    model = og.Model(smollm2_int4_dir)
    prompt = tokenizer.encode("The capital of France is").ids
    engine = og.Engine(model)
    [request] = _submit(engine, [prompt], 24)
    plain = _drain(engine, engine.create_event_buffer(8))[request]
    text = tokenizer.decode(plain)
    stop = text[len(text) // 2:len(text) // 2 + 4]
    # Where the oracle says the match completes: the first prefix of tokens whose text contains it.
    at = next(i for i in range(len(plain)) if stop in tokenizer.decode(plain[:i + 1]))
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(24)
    options.set_stop_strings(["never-in-this-text", stop])
    request.begin_turn(np.asarray(prompt, dtype=np.int32), options)
    events = []
    buffer = engine.create_event_buffer(8)
    while engine.has_pending_requests():
        events.extend((e.token, int(e.finish_reason), e.matched_stop_string_index) for e in engine.run(buffer))
    assert [e[0] for e in events] == plain[:at + 1]
    assert events[-1][1:] == (int(og.FinishReason.STOP_STRING), 1)


def test_json_schema_guidance_gives_valid_json(smollm2_int4_dir):
    import json

    model = og.Model(smollm2_int4_dir)
    tokenizer = og.Tokenizer(model)
    engine = og.Engine(model)
    schema = {"type": "object",
              "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                             "population": {"type": "integer"}},
              "required": ["city", "country", "population"], "additionalProperties": False}
    messages = json.dumps([{"role": "user", "content": "Describe Paris as a JSON object."}])
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    requests = []
    for _ in range(2):  # two guided rows in one batch, beside an unguided one
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(80)
        options.set_guidance("json_schema", json.dumps(schema))
        request.begin_turn(prompt, options)
        requests.append(request)
    plain = engine.create_request()
    options = og.TurnOptions(plain)
    options.set_max_generated_tokens(20)
    plain.begin_turn(prompt, options)
    streams = {}
    finish = {}
    buffer = engine.create_event_buffer(8)
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.token is not None:
                streams.setdefault(event.request, []).append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                finish[event.request] = event.finish_reason
    for request in requests:
        assert finish[request] == og.FinishReason.EOS
        value = json.loads(tokenizer.decode(streams[request]))
        assert set(value) == {"city", "country", "population"}
        assert isinstance(value["population"], int) and isinstance(value["city"], str)
    assert streams[requests[0]] == streams[requests[1]]  # greedy: identical rows stay identical


def test_the_paged_build_gives_the_tokens_of_ogas_own_build(smollm2_dir, smollm2_static_dir):
    """oga's standard-op paged build of the GGUF and onnxruntime-genai's own fp32 CPU build of the same
    weights (GroupQueryAttention, its static engine), token by token: 16 chat prompts, 32 greedy tokens
    each, concurrently in both engines."""
    import onnxruntime_genai as og18

    template = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
    questions = ["What is the capital of Japan?", "Write a haiku about the sea.", "How do plants make food?",
                 "Name three primary colors.", "What is 12 times 7?", "Why is the sky blue?",
                 "Give me a tip for learning Python.", "What does a CPU do?", "Who wrote Romeo and Juliet?",
                 "Describe a cat in one sentence.", "What is the boiling point of water?",
                 "How many days are in a leap year?", "Suggest a name for a puppy.", "What is photosynthesis?",
                 "Translate 'thank you' into Spanish.", "What is the largest ocean on Earth?"]
    tokenizer = Tokenizer.from_file(f"{smollm2_dir}/tokenizer.json")
    prompts = [tokenizer.encode(template.format(q)).ids for q in questions]
    ours = greedy(og, smollm2_dir, prompts, 32)
    theirs = greedy(og18, smollm2_static_dir, prompts, 32)
    assert ours == theirs
    assert sum(map(len, ours)) > 16 * 16
