"""og.Tokenizer / og.TokenizerStream against onnxruntime-genai 0.18's, on the same directories.

Two tokenizers: a small byte-level BPE trained here (model_dirs.make_tokenizer_dir) and SmolLM2's,
exported from its GGUF by oga.models.tokenizer_export (the real model's vocabulary, merges and chat
template). Every public call is made on both and the results compared: encode, decode,
encode_batch / decode_batch, apply_chat_template, to_token_id, the special token ids, update_options
and stream decoding. Known, deliberate differences are tested separately at the end.
"""
import json
import os

import numpy as np
import pytest

import oga as og
from model_dirs import EOS, SMOLLM2_TEMPLATE, VOCAB_SIZE, make_tokenizer_dir, smollm2_gguf, write_genai_config

import onnxruntime_genai as ref  # noqa: E402  (a test dependency: missing, it fails, never skips)

TEXTS = [
    "The capital of France is", "Hello, world!  Two  spaces\tand tabs\n\nnewlines",
    "héllo wörld — ünïcode ✓ 日本語 テキスト 🚀🙂", "def f(x):\n    return x**2  # comment\n",
    "<|im_start|>user\nHi<|im_end|>", "numbers 1234567890 3.14159 -42", "   leading spaces", "trailing   ",
    "Ça va? Ñandú. Ærøskøbing. Пример текста. مثال. उदाहरण", "I'm can't won't they're we've", "", "a",
    "🙂" * 5, "x\u0301\u0302 combining",
]

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ünï 日本"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="module")
def smollm2_tokenizer_dir(tmp_path_factory):
    from oga.models.tokenizer_export import special_tokens_map
    from static_models import gguf_tokenizer

    directory = tmp_path_factory.mktemp("smollm2-tokenizer")
    text, config = gguf_tokenizer(smollm2_gguf())   # tokenizer_from_gguf(smollm2_gguf()), once a run
    (directory / "tokenizer.json").write_text(text, encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (directory / "special_tokens_map.json").write_text(json.dumps(special_tokens_map(config)), encoding="utf-8")
    write_genai_config(directory, 49152)  # SmolLM2's ids are also bos 1, eos [2], pad 2
    return str(directory)


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def pair(request, tiny_dir, smollm2_tokenizer_dir):
    """(onnxruntime_genai Tokenizer, oga Tokenizer, vocabulary size) for one directory."""
    directory = tiny_dir if request.param == "tiny" else smollm2_tokenizer_dir
    vocab = VOCAB_SIZE if request.param == "tiny" else 49152
    return ref.Tokenizer(directory), og.Tokenizer(directory), vocab


def test_encode_matches(pair):
    a, b, _ = pair
    for text in TEXTS:
        expected, got = a.encode(text), b.encode(text)
        assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.ndim == 1
        assert got.tolist() == expected.tolist(), text


def test_decode_matches(pair):
    a, b, vocab = pair
    for text in TEXTS:
        ids = a.encode(text)
        assert b.decode(ids) == a.decode(ids) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
        assert b.decode(ids.tolist()) == a.decode(ids.tolist())               # lists
        assert b.decode(ids.astype(np.int64)) == a.decode(ids.astype(np.int64))
    assert b.decode([]) == a.decode([]) == ""
    ids = a.encode("flat ten")
    assert b.decode(ids.reshape(1, -1)) == a.decode(ids.reshape(1, -1)) == "flat ten"  # flattened


def test_encode_batch_and_decode_batch_match(pair):
    a, b, _ = pair
    texts = ["hi", "hello world again", "日本語 🚀"]
    expected, got = a.encode_batch(texts), b.encode_batch(texts)
    assert isinstance(got, og.Tensor)
    assert got.shape() == expected.shape()
    np.testing.assert_array_equal(got.as_numpy(), expected.as_numpy())        # right-padded with pad id
    assert got.as_numpy().dtype == np.int32 and got.type() == og.ElementType.int32
    assert b.decode_batch(got) == a.decode_batch(expected) == texts
    with pytest.raises(RuntimeError, match="input strings must not be empty"):
        b.encode_batch([])


def test_chat_template_matches(pair):
    a, b, _ = pair
    for messages in (MESSAGES, MESSAGES[1:2], []):
        text = json.dumps(messages)
        assert b.apply_chat_template(text) == a.apply_chat_template(text)     # add_generation_prompt=True
        for flag in (True, False):
            assert (b.apply_chat_template(text, add_generation_prompt=flag)
                    == a.apply_chat_template(text, add_generation_prompt=flag))
    assert b.apply_chat_template(messages=json.dumps(MESSAGES)) == a.apply_chat_template(messages=json.dumps(MESSAGES))


@pytest.mark.parametrize("template", [
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m['content'] }}{% endfor %}{{ eos_token }}",
    "{% for m in messages %}\n  {% if true %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}\nEND\n",
    "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}",
    "[{{ none }}][{{ true }}][{{ 1.5 }}][{{ [1, 'a'] }}][{{ {'a': 1} }}][{{ messages[0].missing }}]",
    "{% if tools %}T{% else %}N{% endif %}|{{ tools }}|{{ add_generation_prompt }}",
    "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}"
    "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% if nothing %}Y{% else %}N{% endif %}{% if messages[0].nokey is defined %}Y{% else %}N{% endif %}",
    "[{{ pad_token }}][{{ unk_token }}][{{ date_string }}]{{ strftime_now('%Y') | length }}",
])
def test_template_str_matches(pair, template):
    a, b, _ = pair
    text = json.dumps([{"role": "user", "content": "<a&b'> ünï"}])
    assert b.apply_chat_template(text, template_str=template) == a.apply_chat_template(text, template_str=template)
    tools = json.dumps([{"name": "f", "parameters": {}}])
    assert (b.apply_chat_template(text, template_str=template, tools=tools)
            == a.apply_chat_template(text, template_str=template, tools=tools))


def test_raise_exception_in_template(pair):
    a, b, _ = pair
    template = "{{ raise_exception('Conversation roles must alternate') }}"
    for tokenizer in (a, b):
        with pytest.raises(RuntimeError, match="Conversation roles must alternate"):
            tokenizer.apply_chat_template("[]", template_str=template)


def test_token_ids_match(pair):
    a, b, _ = pair
    assert b.bos_token_id == a.bos_token_id
    assert b.pad_token_id == a.pad_token_id
    assert isinstance(b.eos_token_ids, np.ndarray) and b.eos_token_ids.dtype == np.int32
    assert b.eos_token_ids.tolist() == a.eos_token_ids.tolist() == [EOS]
    for name in ("bot_token_id", "eot_token_id", "bor_token_id", "eor_token_id"):
        for tokenizer in (a, b):
            with pytest.raises(RuntimeError, match=f"{name} is not defined for this model"):
                getattr(tokenizer, name)
    for token in ("<|im_end|>", "<|im_start|>", "Ġworld", "Ġthe", "hello", "zzzzqq", "", "a", "Ġ"):
        assert b.to_token_id(token) == a.to_token_id(token), token


def _stream(tokenizer, ids):
    stream = tokenizer.create_stream()
    return [stream.decode(int(token)) for token in ids]


def test_stream_matches_on_text(pair):
    a, b, _ = pair
    for text in TEXTS:
        ids = a.encode(text)
        expected = _stream(a, ids)
        got = _stream(b, ids)
        assert got == expected, text
        assert "".join(got) == b.decode(ids)


def test_stream_holds_partial_characters(tiny_dir):
    """A token that ends inside a multi-byte character emits what is complete and holds the rest."""
    tokenizer = og.Tokenizer(tiny_dir)
    text = "héllo wörld — ünïcode ✓ 日本語 テキスト 🚀🙂"
    ids = tokenizer.encode(text)
    pieces = _stream(tokenizer, ids)
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)
    # The tiny vocabulary splits most non-ASCII characters across tokens: some tokens must give a
    # shorter piece than their own bytes would (held bytes) for the test to mean anything.
    raw = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in r for r in raw)
    # Held bytes never turn into a replacement character, and a piece never starts mid-character.
    for piece in pieces:
        assert piece.encode("utf-8").decode("utf-8") == piece


def test_stream_generation_like_sequences_match(pair):
    """Random sequences of ordinary tokens (printable ASCII) stream like 0.18's. (0.18 drops NUL
    characters, a C-string artefact; oga keeps them.)"""
    a, b, vocab = pair
    rng = np.random.default_rng(0)
    ascii_tokens = [i for i in range(vocab)
                    if (piece := b.decode([i])) and piece.isascii() and (piece.isprintable() or piece.isspace())]
    for _ in range(50):
        ids = rng.choice(ascii_tokens, size=rng.integers(1, 30))
        assert _stream(b, ids) == _stream(a, ids)


def test_stream_special_tokens_and_out_of_range(pair):
    a, b, vocab = pair
    ids = [1, *a.encode("Hi there").tolist(), 2, vocab + 5, -1]
    assert _stream(b, ids) == _stream(a, ids)
    assert _stream(b, ids)[0] == "" and _stream(b, ids)[-3:] == ["", "", ""]


def test_update_options_match(tiny_dir):
    a, b = ref.Tokenizer(tiny_dir), og.Tokenizer(tiny_dir)
    ids = [1, *a.encode("hi").tolist(), 2]
    for options in ({"skip_special_tokens": False}, {"skip_special_tokens": "true"},
                    {"add_special_tokens": "false"}, {"add_special_tokens": True}):
        assert a.update_options(**options) is None
        assert b.update_options(**options) is None
        assert b.decode(ids) == a.decode(ids), options
        assert _stream(b, ids) == _stream(a, ids), options
        assert b.encode("<|im_start|>hi").tolist() == a.encode("<|im_start|>hi").tolist()
    for tokenizer in (a, b):
        with pytest.raises(RuntimeError, match="Invalid tokenizer option key: foo"):
            tokenizer.update_options(foo="1")


def test_missing_chat_template(tmp_path):
    directory = make_tokenizer_dir(tmp_path, chat_template=None)
    for tokenizer in (ref.Tokenizer(directory), og.Tokenizer(directory)):
        with pytest.raises(RuntimeError, match="Empty chat template"):
            tokenizer.apply_chat_template(json.dumps(MESSAGES))
        assert tokenizer.apply_chat_template("[]", template_str="x{{ eos_token }}") == "x<|im_end|>"


# ---- construction and errors --------------------------------------------------------------------


def test_constructors(tiny_dir, tmp_path):
    import pathlib

    assert og.Tokenizer(pathlib.Path(tiny_dir)).encode("hello").tolist() == og.Tokenizer(tiny_dir).encode("hello").tolist()
    assert og.Tokenizer.from_directory(tiny_dir).bos_token_id == 1

    class FakeModel:
        path = tiny_dir
    assert og.Tokenizer(FakeModel()).pad_token_id == 2

    class DirectorylessModel:
        path = None
    with pytest.raises(RuntimeError, match="no directory"):
        og.Tokenizer(DirectorylessModel())
    with pytest.raises(TypeError):
        og.Tokenizer(5)
    with pytest.raises(TypeError, match="No constructor defined"):
        og.TokenizerStream()


def test_test_model_has_no_tokenizer():
    import oga.testing

    with pytest.raises(RuntimeError, match="no directory"):
        og.Tokenizer(oga.testing.create_test_model())


def test_missing_files(tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        og.Tokenizer(str(tmp_path / "nope"))
    with pytest.raises(RuntimeError, match="tokenizer.json not found"):
        og.Tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(RuntimeError, match="cannot load"):
        og.Tokenizer(str(tmp_path))


def test_without_genai_config_ids_come_from_tokenizer_config(tmp_path):
    tokenizer = og.Tokenizer(make_tokenizer_dir(tmp_path, genai_config=False))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_ids.tolist(), tokenizer.pad_token_id) == (1, [2], 2)


def test_argument_types(tiny_dir):
    tokenizer = og.Tokenizer(tiny_dir)
    with pytest.raises(TypeError):
        tokenizer.encode(5)
    with pytest.raises(TypeError):
        tokenizer.create_stream().decode("a")
    with pytest.raises(TypeError):
        tokenizer.create_stream().decode(2**40)
    assert tokenizer.create_stream().decode(np.int32(259)) == tokenizer.decode([259])


# ---- deliberate differences (oga accepts more, or reports more) ---------------------------------


def test_oga_accepts_parsed_messages_and_tools(pair):
    a, b, _ = pair
    template = "{% for t in tools %}{{ t.name }}{% endfor %}|{{ messages[0].content }}"
    assert (b.apply_chat_template(MESSAGES, template_str=template, tools=[{"name": "f"}])
            == a.apply_chat_template(json.dumps(MESSAGES), template_str=template, tools='[{"name": "f"}]'))
    assert b.apply_chat_template(MESSAGES) == a.apply_chat_template(json.dumps(MESSAGES))


def test_decode_of_nothing_is_empty(pair):
    """0.18 returns U+FFFD when non-empty input decodes to nothing (a lone EOS, only special
    tokens) and maps ids outside the vocabulary to the unknown token; oga returns '' and skips
    them, as the tokenizers package does."""
    a, b, vocab = pair
    assert a.decode([EOS]) == "\ufffd" and b.decode([EOS]) == ""
    assert b.decode([vocab + 100]) == ""
    assert b.decode([*a.encode("ok").tolist(), vocab + 1]) == a.decode([*a.encode("ok").tolist(), vocab + 1]) == "ok"


def test_invalid_utf8_in_stream_becomes_replacement_character(tiny_dir):
    """0.18's stream silently drops bytes that can never form a character (and its decode() stops
    at them); oga emits U+FFFD in both, so the stream always equals decode()."""
    tokenizer = og.Tokenizer(tiny_dir)
    lone_continuation = next(i for i in range(3, VOCAB_SIZE) if tokenizer.decode([i]) == "\ufffd")
    ids = [*tokenizer.encode("ab").tolist(), lone_continuation, *tokenizer.encode("cd").tolist()]
    assert "".join(_stream(tokenizer, ids)) == tokenizer.decode(ids) == "ab\ufffdcd"


def test_chat_template_file_and_named_templates(tmp_path):
    directory = make_tokenizer_dir(tmp_path, chat_template=None)
    with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
        f.write("J{{ messages[0].content }}")
    assert og.Tokenizer(directory).apply_chat_template('[{"role": "user", "content": "x"}]') == "Jx"
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = json.load(open(config_path))
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": SMOLLM2_TEMPLATE}]
    json.dump(config, open(config_path, "w"))
    assert og.Tokenizer(directory).apply_chat_template("[]") == "<|im_start|>assistant\n"
