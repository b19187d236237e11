"""Turn a GGUF file's tokenizer metadata into Hugging Face `tokenizer.json` text.

Handles llama.cpp's byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`), which is
what Llama 3, SmolLM, Qwen2 and most recent GGUF files carry. The pre-tokenizer follows
`tokenizer.ggml.pre`, reproducing the regex list llama.cpp's `llama-vocab.cpp` uses for it:

- "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva":
  `\\p{N}` (every digit its own piece), then the GPT-2 regex -> tokenizers'
  `Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]`;
- "gpt-2", "default", "mpt", "olmo", "jais": the GPT-2 regex -> `ByteLevel(use_regex=True)`;
- "llama-bpe"/"llama3" and "qwen2" (+ aliases): their Split regex, then `ByteLevel(use_regex=False)`.

Tokens whose `token_type` is CONTROL (3) or USER_DEFINED (4) become added tokens (CONTROL
ones `special`), matched before the pre-tokenizer, as llama.cpp and `tokenizers` both do.
"""

from __future__ import annotations

import json
import os

# llama.cpp's token types (gguf.TokenType)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = \
    1, 2, 3, 4, 5, 6

_GPT2_PRE = {"gpt-2", "gpt2", "default", "mpt", "olmo", "jais", "trillion"}
_DIGITS_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_PRE = {
    "llama-bpe": _LLAMA3_REGEX, "llama3": _LLAMA3_REGEX, "llama-v3": _LLAMA3_REGEX,
    "smaug-bpe": _LLAMA3_REGEX,
    "qwen2": _QWEN2_REGEX, "qwen2.5": _QWEN2_REGEX, "qwen-2.5": _QWEN2_REGEX,
    "deepseek-r1-qwen": _QWEN2_REGEX,
}


def _byte_level(add_prefix_space=False, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def pre_tokenizer_for(pre: str | None) -> dict:
    """The `tokenizers` pre_tokenizer JSON for llama.cpp's pre-tokenizer name."""
    pre = pre or "default"
    if pre in _DIGITS_PRE:
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, _byte_level()]}
    if pre in _GPT2_PRE:
        return _byte_level()
    if pre in _SPLIT_PRE:
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": _SPLIT_PRE[pre]}, "behavior": "Isolated",
             "invert": False},
            _byte_level(use_regex=False)]}
    raise NotImplementedError(
        f"GGUF pre-tokenizer {pre!r} is not supported; supported: "
        f"{', '.join(sorted(_DIGITS_PRE | _GPT2_PRE | set(_SPLIT_PRE)))}")


def _contents(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def build_tokenizer_json(tokens: list[str], merges: list[str], token_types: list[int] | None,
                         pre: str | None) -> str:
    """tokenizer.json text for a byte-level BPE vocabulary."""
    vocab = {tok: i for i, tok in enumerate(tokens)}   # a duplicated text keeps its last id
    added = []
    for i, tok in enumerate(tokens):
        kind = token_types[i] if token_types is not None else TOKEN_NORMAL
        if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False,
                          "special": kind == TOKEN_CONTROL})
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer_for(pre),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            # every byte has a token in a byte-level vocabulary, so BPE never needs an unk
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
            "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": [m.split(" ", 1) for m in merges],
        },
    }
    return json.dumps(doc, ensure_ascii=False)


def tokenizer_from_gguf(source) -> tuple[str, dict]:
    """(tokenizer.json text, tokenizer_config dict) from a GGUF path or `gguf.GGUFReader`."""
    if isinstance(source, (str, os.PathLike)):
        import gguf
        source = gguf.GGUFReader(os.fspath(source))
    reader = source
    model = _contents(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise NotImplementedError(
            f"GGUF tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = list(_contents(reader, "tokenizer.ggml.tokens"))
    merges = list(_contents(reader, "tokenizer.ggml.merges", []))
    types = _contents(reader, "tokenizer.ggml.token_type")
    types = None if types is None else [int(t) for t in types]
    pre = _contents(reader, "tokenizer.ggml.pre")
    text = build_tokenizer_json(tokens, merges, types, pre)

    def tok(key):
        i = _contents(reader, key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    config = {
        "add_bos_token": bool(_contents(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_contents(reader, "tokenizer.ggml.add_eos_token", False)),
        "bos_token": tok("tokenizer.ggml.bos_token_id"),
        "eos_token": tok("tokenizer.ggml.eos_token_id"),
        "pad_token": tok("tokenizer.ggml.padding_token_id"),
        "unk_token": tok("tokenizer.ggml.unknown_token_id"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_contents(
            reader, f"{_contents(reader, 'general.architecture')}.context_length", 0) or 0),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template = _contents(reader, "tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return text, config


def special_tokens_map(config: dict) -> dict:
    """special_tokens_map.json contents from a tokenizer_config dict."""
    return {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")
            if config.get(k) is not None}
