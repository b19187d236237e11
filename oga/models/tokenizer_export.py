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

Also handles llama.cpp's SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`: Llama 2,
Mistral v0.1-0.3, Phi-3, Gemma, ...), which carry tokens, scores and token types but no merges. The
tokenizer.json reproduces llama.cpp's SPM tokenizer (`llm_tokenizer_spm` in llama-vocab.cpp):

- text is split around control, user-defined and unknown tokens first (added tokens, matched on the
  raw text); each remaining piece gets a "\u2581" prepended when `tokenizer.ggml.add_space_prefix`
  says so (llama.cpp's default for SPM: true), as llama.cpp prefixes a space to the first piece and
  to every piece after a special token, and its spaces become "\u2581" (a `Prepend` + `Replace`
  normalizer, which `tokenizers` runs on each piece between added tokens);
- llama.cpp then merges, repeatedly, the adjacent pair whose concatenation is the vocabulary entry
  with the highest score. A BPE model whose merges are every split of every token into two
  vocabulary entries, ranked by the token's score, merges the same pairs;
- a character left over that is no token becomes its UTF-8 bytes' `<0xNN>` tokens (BPE
  `byte_fallback`), else the unknown token;
- decoding maps "\u2581" back to spaces, byte tokens to their bytes, and drops the one leading space
  the prefix added (the `Strip` decoder, as Hugging Face's Llama tokenizer does; llama.cpp's
  detokenizer strips it from the first token unless that token is a BOS it skips);
- BOS / EOS are added by a TemplateProcessing post-processor from `add_bos_token` /
  `add_eos_token` (llama.cpp's defaults for SPM: BOS yes, EOS no; ids 1, 2, unknown 0);
- llama.cpp strips the whitespace after Phi-3's special tokens (it recognises the model by
  `general.name`); those added tokens get `rstrip` then.
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


_SPACE = "\u2581"   # SentencePiece's space marker
_BYTE_TOKEN = "<0x{:02X}>"
# llama.cpp's defaults for a SentencePiece vocabulary whose file does not say
_SPM_DEFAULT_IDS = {"bos": 1, "eos": 2, "unknown": 0}


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges that make `tokenizers` merge like llama.cpp's SPM tokenizer: every split of every
    vocabulary entry into two vocabulary entries, best score first (ties: lower id first, then the
    longer left part). Splits fall on character boundaries, as llama.cpp's symbols are characters."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    ranked = []
    for i, tok in enumerate(tokens):
        if vocab.get(tok) != i:
            continue                                # a duplicated text: llama.cpp keeps the last id
        for cut in range(len(tok) - 1, 0, -1):
            left, right = tok[:cut], tok[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, -cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_spm_tokenizer_json(tokens: list[str], scores: list[float] | None,
                             token_types: list[int] | None, *, bos_id: int | None = 1,
                             eos_id: int | None = 2, unk_id: int | None = 0, add_bos: bool = True,
                             add_eos: bool = False, add_space_prefix: bool = True,
                             rstrip_special: bool = False) -> str:
    """tokenizer.json text for a llama.cpp SentencePiece ("llama") vocabulary (module docstring)."""
    tokens = [tok if tok else f"[EMPTY_{i}]" for i, tok in enumerate(tokens)]  # llama.cpp's rename
    n = len(tokens)
    scores = [0.0] * n if scores is None else [float(x) for x in scores]
    types = [TOKEN_NORMAL] * n if token_types is None else list(token_types)
    vocab = {tok: i for i, tok in enumerate(tokens)}

    def valid(i):
        return i is not None and 0 <= i < n

    # llama.cpp partitions the text on control, user-defined and unknown tokens before tokenizing.
    # For Phi-3 it strips the whitespace after each of them, except after <unk>, <s>, <|endoftext|>.
    added = []
    for i, tok in enumerate(tokens):
        kind = types[i]
        if kind not in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN):
            continue
        rstrip = rstrip_special and tok not in ("<unk>", "<s>", "<|endoftext|>")
        added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                      "rstrip": rstrip, "normalized": False, "special": kind != TOKEN_USER_DEFINED})

    replace = {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE}
    normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": _SPACE}, replace]}
                  if add_space_prefix else replace)
    decoders = [{"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if add_space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})

    # BOS A EOS (and BOS A EOS BOS B EOS for pairs), each of BOS / EOS when the file adds it
    bos = tokens[bos_id] if add_bos and valid(bos_id) else None
    eos = tokens[eos_id] if add_eos and valid(eos_id) else None

    def template(sequence, type_id):
        return ([{"SpecialToken": {"id": bos, "type_id": type_id}}] if bos else []) + \
            [{"Sequence": {"id": sequence, "type_id": type_id}}] + \
            ([{"SpecialToken": {"id": eos, "type_id": type_id}}] if eos else [])

    special = {tok: {"id": tok, "ids": [i], "tokens": [tok]}
               for tok, i in ((bos, bos_id), (eos, eos_id)) if tok}
    post_processor = ({"type": "TemplateProcessing", "single": template("A", 0),
                       "pair": template("A", 0) + template("B", 1), "special_tokens": special}
                      if special else None)

    has_bytes = any(_BYTE_TOKEN.format(b) in vocab for b in range(256))
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": None,       # llama.cpp tokenizes each piece between specials as one word
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": None,
            "unk_token": tokens[unk_id] if valid(unk_id) else None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
            "byte_fallback": has_bytes, "ignore_merges": False,
            "vocab": vocab,
            "merges": [list(m) for m in spm_merges(tokens, scores)],
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
    if model not in ("gpt2", "llama"):
        raise NotImplementedError(
            f"GGUF tokenizer model {model!r} is not supported (byte-level BPE 'gpt2' and "
            "SentencePiece 'llama' are)")
    tokens = list(_contents(reader, "tokenizer.ggml.tokens"))
    types = _contents(reader, "tokenizer.ggml.token_type")
    types = None if types is None else [int(t) for t in types]
    spm = model == "llama"

    def token_id(kind):
        i = _contents(reader, f"tokenizer.ggml.{kind}_token_id")
        if i is None:
            return _SPM_DEFAULT_IDS.get(kind) if spm else None
        return int(i) if 0 <= int(i) < len(tokens) else None

    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says not to
    add_bos = bool(_contents(reader, "tokenizer.ggml.add_bos_token", spm))
    add_eos = bool(_contents(reader, "tokenizer.ggml.add_eos_token", False))
    if spm:
        name = str(_contents(reader, "general.name", "") or "").lower()
        scores = _contents(reader, "tokenizer.ggml.scores")
        text = build_spm_tokenizer_json(
            tokens, None if scores is None else list(scores), types,
            bos_id=token_id("bos"), eos_id=token_id("eos"), unk_id=token_id("unknown"),
            add_bos=add_bos, add_eos=add_eos,
            add_space_prefix=bool(_contents(reader, "tokenizer.ggml.add_space_prefix", True)),
            rstrip_special="phi-3" in name or "phi3" in name)
        tokens = [tok if tok else f"[EMPTY_{i}]" for i, tok in enumerate(tokens)]
    else:
        merges = list(_contents(reader, "tokenizer.ggml.merges", []))
        text = build_tokenizer_json(tokens, merges, types, _contents(reader, "tokenizer.ggml.pre"))

    def tok(kind):
        i = token_id(kind)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    config = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": tok("bos"),
        "eos_token": tok("eos"),
        "pad_token": tok("padding"),
        "unk_token": tok("unknown"),
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
