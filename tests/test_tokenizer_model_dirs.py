"""og.Tokenizer built from a model (og.Tokenizer(og.Model(dir))), as OGA's example programs make it,
side by side with onnxruntime-genai 0.18 on OGA's own CPU build of SmolLM2: the calls the examples
make (apply_chat_template with messages JSON, tools and add_generation_prompt, encode,
encode_batch, decode, decode_batch, to_token_id, eos_token_ids, update_options, streams over the
tokens a Generator produces)."""

import json

import numpy as np
import pytest

import oga as og
from static_models import smollm2_static_dir  # noqa: F401

ref = pytest.importorskip("onnxruntime_genai")

MESSAGES = [{"role": "system", "content": "You answer with tools when you can."},
            {"role": "user", "content": "What's the weather in Paris? Réponds en français."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
# A tool-calling chat template in the style of Qwen2.5's (SmolLM2's own has no tools section).
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] }}\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n"
    "{%- else %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages[1:] %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


@pytest.fixture(scope="module")
def tokenizers(smollm2_static_dir):
    return ref.Tokenizer(ref.Model(smollm2_static_dir)), og.Tokenizer(og.Model(smollm2_static_dir))


def test_chat_templates_with_tools_and_generation_prompt(tokenizers):
    theirs, ours = tokenizers
    messages = json.dumps(MESSAGES)
    for add in (True, False):
        assert (ours.apply_chat_template(messages, add_generation_prompt=add)
                == theirs.apply_chat_template(messages, add_generation_prompt=add))
        for tools in (json.dumps(TOOLS), None, ""):
            assert (ours.apply_chat_template(messages, template_str=TOOL_TEMPLATE, tools=tools, add_generation_prompt=add)
                    == theirs.apply_chat_template(messages, template_str=TOOL_TEMPLATE, tools=tools,
                                                  add_generation_prompt=add))
    prompt = theirs.apply_chat_template(messages, template_str=TOOL_TEMPLATE, tools=json.dumps(TOOLS))
    assert "get_weather" in prompt and prompt.endswith("<|im_start|>assistant")


def test_encoding_ids_and_batches(tokenizers):
    theirs, ours = tokenizers
    prompt = theirs.apply_chat_template(json.dumps(MESSAGES))
    assert ours.encode(prompt).tolist() == theirs.encode(prompt).tolist()
    assert ours.eos_token_ids.tolist() == theirs.eos_token_ids.tolist()
    assert (ours.bos_token_id, ours.pad_token_id) == (theirs.bos_token_id, theirs.pad_token_id)
    for token in ("<|im_end|>", "<|im_start|>", "Paris", "ĠParis", "<tool_call>"):
        assert ours.to_token_id(token) == theirs.to_token_id(token), token
    texts = ["Bonjour !", prompt, "2+2=4"]
    batch_theirs, batch_ours = theirs.encode_batch(texts), ours.encode_batch(texts)
    np.testing.assert_array_equal(batch_ours.as_numpy(), batch_theirs.as_numpy())
    assert ours.decode_batch(batch_ours) == theirs.decode_batch(batch_theirs)


def test_decoding_a_generation_with_streams_and_options(tokenizers, smollm2_static_dir):
    theirs, ours = tokenizers
    model = og.Model(smollm2_static_dir)
    params = og.GeneratorParams(model)
    prompt = ours.encode(ours.apply_chat_template(json.dumps(MESSAGES[1:])))
    params.set_search_options(max_length=len(prompt) + 24)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    ours_stream, theirs_stream = ours.create_stream(), theirs.create_stream()
    pieces = []
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        piece = ours_stream.decode(token)
        assert piece == theirs_stream.decode(token)
        pieces.append(piece)
    sequence = generator.get_sequence(0)
    assert ours.decode(sequence) == theirs.decode(sequence)
    assert "".join(pieces) == ours.decode(sequence[len(prompt):])
    for value in ("false", "true"):
        ours.update_options(skip_special_tokens=value)
        theirs.update_options(skip_special_tokens=value)
        assert ours.decode(sequence) == theirs.decode(sequence)
