"""llama.cpp's SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`) in GGUF files, exported to
tokenizer.json by oga.models.tokenizer_export, against transformers' own GGUF conversion of the same
file (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, a test dependency only).

Two vocabularies, written with the `gguf` package's writer: a hand-made one (byte tokens, control,
user-defined, unknown and unused tokens, merges that compete on score, space runs, digits, CJK
pieces) and one trained here (the `tokenizers` package's SentencePiece-style BPE trainer on a text of
this file; the `sentencepiece` package is not installed), laid out as llama.cpp's converter lays out
a SentencePiece BPE model: specials, byte tokens, merged pieces scored -rank, then characters.

oga follows llama.cpp, which prefixes a space to the first piece of text and to every piece after a
special token. transformers does the same for Phi-3 only (a normalizer); for other architectures its
Metaspace pre-tokenizer prefixes the first piece only, and not when it already starts with a space.
So on Phi-3 files the ids equal transformers' on every text; on Llama files they do too except on
texts that start with whitespace or continue after a special token, where oga's ids are
transformers' ids of the text with that space written out.
"""
import json
import os

import gguf
import pytest
import tokenizers

import oga as og
from oga.models.tokenizer_export import build_spm_tokenizer_json, spm_merges, tokenizer_from_gguf

from transformers import AutoTokenizer  # noqa: E402  (a test dependency: missing, it fails, never skips)

T = gguf.TokenType
SPACE = "\u2581"
SPECIALS = [("<unk>", T.UNKNOWN), ("<s>", T.CONTROL), ("</s>", T.CONTROL)]
ADDED = [("<|user|>", T.CONTROL), ("<|end|>", T.CONTROL), ("<|endoftext|>", T.CONTROL),
         ("<think>", T.USER_DEFINED), ("<unused0>", T.UNUSED)]
BYTES = [(f"<0x{b:02X}>", T.BYTE) for b in range(256)]

TEXTS = [
    "hello world", "Hello World!", "the in on the world", "The capital of France is",
    "a  b   c    d     e", "trailing  ", "x\n\ny\n", "tab\there\r\n", "12 123 1234 3.14159 -42",
    "café été ö héllo wörld", "Ça va? Ñandú. Ærøskøbing. Пример", "日本語 テキスト 日本",
    "🚀🙂 emoji 🙂🙂", "x\u0301\u0302 combining", "I'm can't won't", "", "a", "\n",
    "hi</s>", "x</think> a<think>", "a <unused0> <0x41> <unk>",
]
# Texts where llama.cpp prefixes a space transformers' Metaspace does not (module docstring), with
# the text transformers must be given for llama.cpp's ids.
PREFIX_CASES = {
    "  two leading": "   two leading",
    " ": "  ",
    "\tindented": " \tindented",
    "<s>hi</s>": "<s> hi</s>",
    "<|user|>\nhi<|end|>\n": "<|user|> \nhi<|end|> \n",
    "<|user|>Say 日本<|end|><think>ok": "<|user|> Say 日本<|end|><think> ok",
    "<think>x</think>": "<think> x</think>",
    "<unk> <unused0>": "<unk>  <unused0>",
}


def _hand_vocab():
    merged = ["\u2581t", "he", "\u2581the", "\u2581a", "in", "\u2581in", "er", "\u2581w", "or", "ld",
              "\u2581wor", "\u2581world", "\u2581h", "el", "ll", "llo", "\u2581hel", "\u2581hello",
              "\u2581H", "\u2581Hello", SPACE * 2, SPACE * 4, "\u2581" + "1", "12", "\u2581\u00e9",
              "t\u00e9", "\u65e5\u672c", "\u2581\u65e5\u672c", "on", "\u2581on", "\u00f6", "ap", "apit",
              "it", "\u2581c", "\u2581cap", "al", "\u2581of", "\u2581is", "\u2581Fr", "an", "ce"]
    singles = list("\u2581abcdefghijklmnopqrstuvwxyzFHITW0123456789.,!?'-\u00e9\u65e5\u672c<>/")
    vocab = [(t, 0.0, k) for t, k in SPECIALS + BYTES + ADDED]
    vocab += [(t, -float(i), T.NORMAL) for i, t in enumerate(merged)]
    vocab += [(c, -1000.0 - i, T.NORMAL) for i, c in enumerate(singles)]
    return vocab


TRAINING_TEXT = """
The capital of France is Paris. The capital of Italy is Rome, and the capital of Japan is Tokyo.
Hello world! Hello again, world. The quick brown fox jumps over the lazy dog, then the dog sleeps.
Numbers like 12, 123 and 2024 appear in text; so do prices such as 3.50 and 42 percent.
Caf\u00e9, na\u00efve, \u00e9t\u00e9, \u00fcber, Stra\u00dfe, ni\u00f1o: accented words in several languages.
\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 and \u4e2d\u6587 text sit next to English words.
def f(x):
    return x * 2  # a comment in code
I'm sure they're here, we've seen it, it's fine and you'll see.
""" * 8


def _trained_vocab():
    trainer = tokenizers.SentencePieceBPETokenizer(add_prefix_space=True)
    trainer.train_from_iterator([TRAINING_TEXT], vocab_size=400, min_frequency=2, show_progress=False,
                                special_tokens=[])
    model = json.loads(trainer.to_str())["model"]
    ids = model["vocab"]
    merged = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in model["merges"]]
    chars = [t for t in sorted(ids, key=ids.get) if len(t) == 1]
    vocab = [(t, 0.0, k) for t, k in SPECIALS + BYTES + ADDED]
    vocab += [(t, -float(i), T.NORMAL) for i, t in enumerate(merged)]
    vocab += [(c, -1e4 - i, T.NORMAL) for i, c in enumerate(chars) if c not in merged]
    return vocab


def _write(path, vocab, *, arch="llama", name="tiny", add_space_prefix=None, add_bos=None,
           add_eos=None):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    _add_vocabulary(writer, vocab, add_space_prefix=add_space_prefix, add_bos=add_bos, add_eos=add_eos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_vocabulary(writer, vocab, *, add_space_prefix=None, add_bos=None, add_eos=None):
    writer.add_tokenizer_model("llama")
    writer.add_token_list([t for t, _, _ in vocab])
    writer.add_token_scores([s for _, s, _ in vocab])
    writer.add_token_types([int(k) for _, _, k in vocab])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_eos is not None:
        writer.add_add_eos_token(add_eos)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(path, transformers tokenizer, oga's tokenizers.Tokenizer, tokenizer_config) per file."""
    directory = tmp_path_factory.mktemp("spm-gguf")
    cache = {}

    def get(vocab, arch="llama", **kwargs):
        key = (vocab, arch, tuple(sorted(kwargs.items())))
        if key not in cache:
            name = f"{vocab}-{arch}-{len(cache)}.gguf"
            made = _hand_vocab() if vocab == "hand" else _trained_vocab()
            path = _write(directory / name, made, arch=arch, **kwargs)
            ref = AutoTokenizer.from_pretrained(str(directory), gguf_file=name)
            text, config = tokenizer_from_gguf(str(path))
            cache[key] = path, ref, tokenizers.Tokenizer.from_str(text), config
        return cache[key]
    return get


def _ids(tok, text):
    return tok.encode(text).ids if isinstance(tok, tokenizers.Tokenizer) else tok.encode(text)


@pytest.mark.parametrize("vocab", ["hand", "trained"])
@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_ids_and_decoding_equal_transformers(files, vocab, arch):
    _, ref, ours, _ = files(vocab, arch)
    texts = TEXTS + [TRAINING_TEXT[:400]]
    if arch == "phi3":   # transformers prefixes every piece here, as llama.cpp does
        texts += list(PREFIX_CASES)
    for text in texts:
        ids = _ids(ref, text)
        assert _ids(ours, text) == ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text


@pytest.mark.parametrize("vocab", ["hand", "trained"])
def test_llama_prefixes_a_space_where_llama_cpp_does(files, vocab):
    _, ref, ours, _ = files(vocab, "llama")
    for text, spelled in PREFIX_CASES.items():
        assert _ids(ours, text) == _ids(ref, spelled), text
    # and decoding gives the text back, leading whitespace included
    for text in ["  two leading", "\tindented", " "]:
        assert ours.decode(_ids(ours, text), skip_special_tokens=True) == text


def test_hand_vocabulary_pieces(files):
    """What llama.cpp's SPM tokenizer makes of the hand-made vocabulary, piece by piece."""
    _, _, ours, config = files("hand", "llama")
    pieces = lambda text: ours.encode(text).tokens  # noqa: E731
    # the best-scored pair merges first: "he" (score -1) before "▁h" (-12), which leaves no way to
    # "▁hello"; "▁t" (0) before "he", then "▁t" + "he" = "▁the"
    assert pieces("hello world") == ["<s>", "\u2581", "he", "llo", "\u2581world"]
    assert pieces("the") == ["<s>", "\u2581the"]
    assert pieces("a  b") == ["<s>", "\u2581a", SPACE * 2, "b"]
    assert pieces("a     b") == ["<s>", "\u2581a", SPACE * 4, SPACE, "b"]
    # newline, tab and characters outside the vocabulary fall back to their UTF-8 bytes
    assert pieces("x\ny") == ["<s>", "\u2581", "x", "<0x0A>", "y"]
    assert pieces("\u00fc") == ["<s>", "\u2581", "<0xC3>", "<0xBC>"]
    assert pieces("\u65e5\u672c\u8a9e") == ["<s>", "\u2581\u65e5\u672c", "<0xE8>", "<0xAA>", "<0x9E>"]
    # digits: the pieces the vocabulary has
    assert pieces("1234") == ["<s>", "\u2581" + "1", "2", "3", "4"]
    # control and user-defined tokens are matched whole; unused ones are not
    assert pieces("<|user|>a<think>") == ["<s>", "<|user|>", "\u2581a", "<think>"]
    assert "<unused0>" not in pieces("<unused0>")
    # decoding: bytes joined into characters, specials skipped, the prefix space dropped
    ids = ours.encode("<|user|>caf\u00e9 \u00fc\n<think>").ids
    assert ours.decode(ids, skip_special_tokens=True) == "caf\u00e9 \u00fc\n<think>"
    assert config["add_bos_token"] is True and config["add_eos_token"] is False
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")


def test_add_bos_add_eos_and_no_space_prefix(files):
    _, _, ours, config = files("hand", "llama", add_bos=False, add_eos=True, add_space_prefix=False)
    assert config["add_bos_token"] is False and config["add_eos_token"] is True
    assert ours.encode("hello world").tokens == ["he", "llo", "\u2581world", "</s>"]
    assert ours.decode(ours.encode(" hello").ids, skip_special_tokens=True) == " hello"


def test_no_space_prefix_equals_transformers_gemma(files):
    """Gemma's files say add_space_prefix = false; transformers' Gemma tokenizer prefixes nothing."""
    _, ref, ours, _ = files("hand", "gemma2", add_space_prefix=False)
    for text in TEXTS + list(PREFIX_CASES):
        assert _ids(ours, text) == _ids(ref, text), text
        assert ours.decode(_ids(ref, text), skip_special_tokens=True) == \
            ref.decode(_ids(ref, text), skip_special_tokens=True), text


def test_phi3_strips_whitespace_after_its_special_tokens(files):
    """llama.cpp recognises Phi-3 by general.name and strips the whitespace after its special tokens
    (not after <unk>, <s>, <|endoftext|>); transformers' conversion does not."""
    _, ref, ours, _ = files("hand", "phi3", name="Phi-3 Mini 4k Instruct")
    assert _ids(ours, "<|user|>\nhi<|end|>\n") == _ids(ref, "<|user|>hi<|end|>")
    assert _ids(ours, "<|endoftext|> hi") == _ids(ref, "<|endoftext|> hi")
    assert _ids(ours, "<s> hi</s>\n") == _ids(ref, "<s> hi</s>")


def test_spm_merges_rank_every_split_by_score():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    merges = spm_merges(tokens, [0, 0, 0, -3, -1, -2])
    assert merges == [("b", "c"), ("ab", "c"), ("a", "bc"), ("a", "b")]
    ours = tokenizers.Tokenizer.from_str(build_spm_tokenizer_json(
        tokens, [0, 0, 0, -3, -1, -2], None, bos_id=None, unk_id=None, add_space_prefix=False))
    assert ours.encode("abc").tokens == ["abc"]   # "bc" first (best), then "a" + "bc"
    assert ours.encode("abab").tokens == ["ab", "ab"]


def test_oga_build_writes_a_tokenizer_og_tokenizer_loads(tmp_path, files):
    """`oga build` of a tiny Llama GGUF with a SentencePiece vocabulary: og.Tokenizer encodes like
    transformers and decodes (whole and streamed) back to the text."""
    from oga.models import build
    from oga.models.random_weights import random_model, tiny_spec
    from test_model_weights import _tiny_gguf

    vocab = _trained_vocab()
    spec = tiny_spec(vocab_size=len(vocab))
    extra = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [t for t, _, _ in vocab],
             "tokenizer.ggml.scores": [float(s) for _, s, _ in vocab],
             "tokenizer.ggml.token_type": [int(k) for _, _, k in vocab],
             "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    path = _tiny_gguf(tmp_path, spec, random_model(spec, seed=5).weights,
                      qtype=gguf.GGMLQuantizationType.F32, extra_kv=extra)
    out = tmp_path / "model"
    build(str(path), str(out), context_length=64, max_batch_size=2)
    assert os.path.isfile(out / "tokenizer.json")
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    tokenizer = og.Tokenizer(og.Model(str(out)))
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_ids.tolist() == [2]
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids.tolist() == ref.encode(text), text
        assert tokenizer.decode(ids) == ref.decode(ref.encode(text), skip_special_tokens=True), text
        stream = tokenizer.create_stream()
        assert "".join(stream.decode(int(i)) for i in ids) == tokenizer.decode(ids), text
    text = "caf\u00e9 \u65e5\u672c\u8a9e \U0001f680"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_onnxruntime_genai_0_18_on_the_same_directory(tmp_path, files):
    """The README's deliberate difference: 0.18 adds no BOS on this tokenizer.json and leaves
    "▁" + "12" apart where the vocabulary has "▁12"; oga gives llama.cpp's ids."""
    import onnxruntime_genai as ref
    from model_dirs import write_genai_config
    from oga.models.tokenizer_export import special_tokens_map

    _, _, ours, config = files("trained", "llama")
    (tmp_path / "tokenizer.json").write_text(ours.to_str(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(special_tokens_map(config)),
                                                      encoding="utf-8")
    write_genai_config(tmp_path, ours.get_vocab_size())
    theirs, oga_tokenizer = ref.Tokenizer(str(tmp_path)), og.Tokenizer(str(tmp_path))
    text = "The capital of France is"
    assert oga_tokenizer.encode(text).tolist() == [1] + theirs.encode(text).tolist()
    assert ours.encode("12").tokens == ["<s>", "\u258112"]
    assert [ours.id_to_token(i) for i in theirs.encode("12").tolist()] == ["\u2581", "12"]


def test_a_rendered_chat_template_gets_no_second_bos(tmp_path):
    """A chat template that writes BOS itself (Llama 2, Gemma, Mistral) over a tokenizer whose
    post-processor prepends BOS: oga generate / oga serve encode the rendered template without the
    post-processor's tokens, so the prompt starts with one BOS, not two."""
    import json

    import oga as og
    from oga.cli import prompt_tokens
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hi": 3, "there": 4, "[": 5, "]": 6, "user": 7}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}[ {{ m.role }} ] {{ m.content }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}))
    loaded = og.Tokenizer(str(tmp_path))
    assert list(loaded.encode("hi there")) == [1, 3, 4]                     # encode keeps 0.18's behaviour
    assert list(prompt_tokens(loaded, "hi there")) == [1, 5, 7, 6, 3, 4]    # one BOS, the template's
