"""Tokenizer and TokenizerStream with onnxruntime-genai 0.18's Python surface.

0.18 tokenizes with onnxruntime-extensions and renders chat templates with minja; oga reads the
same model-directory files with the ``tokenizers`` package (``tokenizer.json``) and jinja2
(``chat_template`` of ``tokenizer_config.json``), configured to behave like 0.18 where the two
differ from Hugging Face conventions: ``None`` renders as an empty string, no ``trim_blocks`` /
``lstrip_blocks``, ``tojson`` without HTML escaping, ``add_generation_prompt`` defaults to True,
only ``bos_token`` / ``eos_token`` carry values among the special-token variables.

The engine never tokenizes; the tokenizer exists for applications (the CLI, examples) written
against ``onnxruntime_genai``.
"""
import codecs as _codecs
import datetime as _datetime
import json as _json
import operator as _operator
import os as _os
import re as _re

import numpy as _np

from .tensor import Tensor

__all__ = ["Tokenizer", "TokenizerStream"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_UNSET = object()

# update_options keys (0.18: onnxruntime-extensions' tokenizer options).
_OPTION_KEYS = ("add_special_tokens", "skip_special_tokens")

# Token-id properties that exist on 0.18's Tokenizer for tool-calling / reasoning models; they raise
# unless genai_config.json names them.
_OPTIONAL_TOKEN_IDS = ("bot_token_id", "eot_token_id", "bor_token_id", "eor_token_id")


def _model_directory(model):
    """The directory a Tokenizer reads: a path (str / os.PathLike, as 0.18's ``Tokenizer(str)``) or
    an object with a ``path`` attribute (``og.Model``, ``og.Config``)."""
    if isinstance(model, (str, _os.PathLike)):
        return _os.fspath(model)
    if not hasattr(model, "path"):
        raise TypeError(
            "Tokenizer(): expected an og.Model, an og.Config or a model directory path, "
            f"got {type(model).__name__}")
    path = model.path
    if path is None:
        raise RuntimeError(
            "Tokenizer: this model has no directory to read tokenizer files from (models from "
            "oga.testing.create_test_model have none); use a model loaded with og.Model(path), "
            "or og.Tokenizer(path) with a directory that holds tokenizer.json")
    return _os.fspath(path)


def _token_content(value):
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _load_chat_template(directory, config):
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template:
        return template
    jinja_path = _os.path.join(directory, "chat_template.jinja")
    if _os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    json_path = _os.path.join(directory, "chat_template.json")
    if _os.path.isfile(json_path):
        with open(json_path, encoding="utf-8") as f:
            return _json.load(f).get("chat_template")
    return None


class _TemplateError(Exception):
    pass


def _raise_exception(message):
    raise _TemplateError(message)


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    return _json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                       sort_keys=sort_keys)


def _strftime_now(format):
    return _datetime.datetime.now().strftime(format)


_jinja_environment = None


def _environment():
    """One sandboxed jinja2 environment shared by all tokenizers (compiled templates are cached)."""
    global _jinja_environment
    if _jinja_environment is None:
        import jinja2.ext
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            extensions=[jinja2.ext.loopcontrols],
            finalize=lambda value: "" if value is None else value,
            cache_size=64)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        _jinja_environment = env
    return _jinja_environment


def _parse_json_argument(value, what):
    if isinstance(value, (str, bytes)):
        try:
            return _json.loads(value)
        except ValueError as e:
            raise RuntimeError(f"apply_chat_template: {what} is not valid JSON: {e}") from None
    return value


def _as_token_list(tokens):
    """Token ids as a list of Python ints; any shape is flattened as 0.18 does."""
    array = _np.asarray(tokens)
    if array.size == 0:
        return []
    if array.dtype.kind not in "iu":
        if array.dtype.kind == "b" or not _np.all(_np.equal(_np.mod(array, 1), 0)):
            raise TypeError("decode(): token ids must be integers")
        array = array.astype(_np.int64)
    return array.reshape(-1).tolist()


class Tokenizer:
    """``og.Tokenizer(model)``: tokenizes with the model directory's ``tokenizer.json``.

    ``model`` is an ``og.Model`` (its ``path``), an ``og.Config`` or a directory path. The special
    token ids come from ``genai_config.json`` when the directory has one (as in 0.18), otherwise
    from ``tokenizer_config.json``.
    """

    def __init__(self, model):
        directory = _model_directory(model)
        tokenizer_path = _os.path.join(directory, "tokenizer.json")
        if not _os.path.isfile(tokenizer_path):
            if not _os.path.isdir(directory):
                raise RuntimeError(f"Tokenizer: model directory {directory!r} does not exist")
            hint = (" (tokenizer.model / SentencePiece files are not supported; convert to tokenizer.json)"
                    if _os.path.isfile(_os.path.join(directory, "tokenizer.model")) else "")
            raise RuntimeError(f"Tokenizer: {tokenizer_path} not found{hint}")
        import tokenizers

        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(tokenizer_path)
        except Exception as e:  # the tokenizers package raises plain Exception subclasses
            raise RuntimeError(f"Tokenizer: cannot load {tokenizer_path}: {e}") from None
        self._directory = directory

        config = {}
        config_path = _os.path.join(directory, "tokenizer_config.json")
        if _os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as f:
                config = _json.load(f)
        self._bos_token = _token_content(config.get("bos_token"))
        self._eos_token = _token_content(config.get("eos_token"))
        self._chat_template = _load_chat_template(directory, config)

        model_config = {}
        genai_path = _os.path.join(directory, "genai_config.json")
        if _os.path.isfile(genai_path):
            with open(genai_path, encoding="utf-8") as f:
                model_config = _json.load(f).get("model", {})
        self._model_config = model_config
        self._bos_token_id = self._config_id(model_config, "bos_token_id", self._bos_token)
        eos = model_config.get("eos_token_id")
        if eos is None:
            eos = self._config_id({}, "eos_token_id", self._eos_token)
        self._eos_token_ids = _np.array(eos if isinstance(eos, list) else [eos], dtype=_np.int32)
        pad_token = _token_content(config.get("pad_token")) or self._eos_token
        self._pad_token_id = self._config_id(model_config, "pad_token_id", pad_token)

        self._vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self._add_special_tokens = True
        self._skip_special_tokens = True
        self._byte_table = _UNSET  # per-token bytes for streams (byte-level BPE only), built lazily

    @classmethod
    def from_directory(cls, directory):
        """oga addition: a tokenizer for a directory holding tokenizer.json (same as
        ``Tokenizer(directory)``)."""
        return cls(_os.fspath(directory))

    def _config_id(self, model_config, key, token):
        value = model_config.get(key)
        if isinstance(value, int):
            return value
        if token is not None:
            token_id = self._tokenizer.token_to_id(token)
            if token_id is not None:
                return token_id
        return -1 if key != "eos_token_id" else []

    # ---- encoding -------------------------------------------------------------------------------

    def encode(self, text):
        """encode(text: str) -> numpy int32 array of token ids (special tokens written in the text
        are recognised; post-processor tokens are added unless add_special_tokens is off)."""
        if not isinstance(text, str):
            raise TypeError(f"encode(): expected str, got {type(text).__name__}")
        ids = self._tokenizer.encode(text, add_special_tokens=self._add_special_tokens).ids
        return _np.array(ids, dtype=_np.int32)

    def encode_batch(self, texts):
        """encode_batch(texts: list[str]) -> og.Tensor int32 [len(texts), longest], right-padded
        with pad_token_id."""
        texts = list(texts)
        if not texts:
            raise RuntimeError("EncodeBatch: input strings must not be empty")
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"encode_batch(): expected a sequence of str, got {type(text).__name__}")
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=self._add_special_tokens)
        width = max(len(e.ids) for e in encodings)
        batch = _np.full((len(texts), width), self._pad_token_id, dtype=_np.int32)
        for row, encoding in enumerate(encodings):
            batch[row, :len(encoding.ids)] = encoding.ids
        return Tensor(batch)

    def to_token_id(self, token):
        """to_token_id(token: str) -> int: the vocabulary id of one token string (as the vocabulary
        spells it, e.g. 'Ġworld' for byte-level BPE), -1 when absent."""
        if not isinstance(token, str):
            raise TypeError(f"to_token_id(): expected str, got {type(token).__name__}")
        token_id = self._tokenizer.token_to_id(token)
        return -1 if token_id is None else token_id

    # ---- decoding -------------------------------------------------------------------------------

    def _decode_ids(self, ids):
        # Ids outside the vocabulary are skipped. (0.18 maps them to the unknown token, and returns
        # U+FFFD whenever non-empty input decodes to nothing, e.g. a lone EOS.)
        valid = [i for i in ids if 0 <= i < self._vocab_size]
        return self._tokenizer.decode(valid, skip_special_tokens=self._skip_special_tokens)

    def decode(self, tokens):
        """decode(tokens: array-like of int) -> str (special tokens skipped unless
        skip_special_tokens is off; multi-dimensional input is flattened; ids outside the
        vocabulary are skipped)."""
        return self._decode_ids(_as_token_list(tokens))

    def decode_batch(self, tokens):
        """decode_batch(tokens: og.Tensor or 2-D array) -> list[str], one string per row."""
        if isinstance(tokens, Tensor):
            tokens = tokens.as_numpy()
        array = _np.asarray(tokens)
        if array.ndim != 2:
            raise TypeError("decode_batch(): expected a 2-D og.Tensor of token ids")
        return [self._decode_ids(_as_token_list(row)) for row in array]

    def create_stream(self):
        """create_stream() -> TokenizerStream: incremental decoding of generated tokens."""
        return TokenizerStream._create(self)

    def _stream_table(self):
        if self._byte_table is _UNSET:
            self._byte_table = _byte_level_table(self)
        return self._byte_table

    # ---- chat template --------------------------------------------------------------------------

    def apply_chat_template(self, messages, *, template_str=None, tools=None, add_generation_prompt=True):
        """apply_chat_template(messages: str, *, template_str: str = None, tools: str = None,
        add_generation_prompt: bool = True) -> str

        ``messages`` and ``tools`` are JSON strings as in 0.18 (oga also accepts the parsed Python
        lists). ``template_str`` overrides the directory's chat template."""
        import jinja2

        template = template_str if template_str is not None else self._chat_template
        if not template:
            raise RuntimeError(
                f"Empty chat template. ({self._directory} has no chat_template in "
                "tokenizer_config.json; pass template_str=)")
        messages = _parse_json_argument(messages, "messages")
        tools = _parse_json_argument(tools, "tools") if tools not in (None, "") else None
        try:
            compiled = _environment().from_string(template)
            return compiled.render(
                messages=messages, tools=tools, add_generation_prompt=bool(add_generation_prompt),
                bos_token=self._bos_token or "", eos_token=self._eos_token or "",
                pad_token="", unk_token="", date_string="")
        except _TemplateError as e:
            raise RuntimeError(str(e)) from None
        except jinja2.TemplateError as e:
            raise RuntimeError(f"chat template: {type(e).__name__}: {e}") from None

    # ---- options and ids ------------------------------------------------------------------------

    def update_options(self, **kwargs):
        """update_options(**kwargs) -> None: ``add_special_tokens`` / ``skip_special_tokens``,
        each a bool or the string 'true' / 'false'."""
        parsed = {}
        for key, value in kwargs.items():
            if key not in _OPTION_KEYS:
                raise RuntimeError(f"Invalid tokenizer option key: {key}")
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise RuntimeError(f"Invalid value for tokenizer option {key}: {value!r}")
                value = value.lower() in ("true", "1")
            parsed[key] = bool(value)
        for key, value in parsed.items():
            setattr(self, "_" + key, value)

    @property
    def chat_template(self):
        """oga addition: the directory's chat template (str), or None when it has none."""
        return self._chat_template

    @property
    def bos_token_id(self):
        return self._bos_token_id

    @property
    def eos_token_ids(self):
        return self._eos_token_ids.copy()

    @property
    def pad_token_id(self):
        return self._pad_token_id

    def _optional_id(name):  # noqa: N805 - property factory used in the class body
        def getter(self):
            value = self._model_config.get(name)
            if not isinstance(value, int):
                raise RuntimeError(f"{name} is not defined for this model")
            return value
        return property(getter)

    bot_token_id = _optional_id("bot_token_id")
    eot_token_id = _optional_id("eot_token_id")
    bor_token_id = _optional_id("bor_token_id")
    eor_token_id = _optional_id("eor_token_id")
    del _optional_id

    def __repr__(self):
        return f"<oga.Tokenizer {self._directory!r} vocab={self._vocab_size}>"


def encode_rendered_chat(tokenizer, text):
    """The ids of a rendered chat template (oga generate / oga serve): the template writes the special
    tokens it wants, BOS included, so the tokenizer's post-processor adds none (a tokenizer.json that
    prepends BOS, such as a SentencePiece one, would otherwise give two), as transformers tokenizes an
    applied chat template."""
    return _np.array(tokenizer._tokenizer.encode(text, add_special_tokens=False).ids, dtype=_np.int32)


def _bytes_to_unicode():
    """GPT-2's byte <-> printable-character map that byte-level BPE vocabularies are written in."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _byte_level_bytes(tokenizer, vocab_size):
    """The bytes each token id decodes to under a plain ByteLevel decoder (GPT-2 style BPE, which
    SmolLM, Llama 3 and Qwen use). Each character of a token maps to one byte through GPT-2's table;
    characters outside it (in added tokens) stand for their own UTF-8 bytes, as in the tokenizers
    package's ByteLevel decoder."""
    byte_of = _bytes_to_unicode()
    table = []
    for token_id in range(vocab_size):
        token = tokenizer.id_to_token(token_id)
        if token is None:
            table.append(b"")
            continue
        pieces = []
        for char in token:
            byte = byte_of.get(char)
            pieces.append(bytes((byte,)) if byte is not None else char.encode("utf-8"))
        table.append(b"".join(pieces))
    return table


def _special_ids(tokenizer):
    return frozenset(i for i, added in tokenizer.get_added_tokens_decoder().items() if added.special)


def _byte_level_table(tokenizer):
    """(per-token bytes, special ids) for og.TokenizerStream when the decoder is plain ByteLevel,
    else None."""
    decoder = _json.loads(tokenizer._tokenizer.to_str()).get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        return None
    return _byte_level_bytes(tokenizer._tokenizer, tokenizer._vocab_size), _special_ids(tokenizer._tokenizer)


def _decoder_steps(decoder):
    """A decoder configuration as a flat list of steps (Sequence decoders unrolled)."""
    if not decoder:
        return []
    if decoder.get("type") == "Sequence":
        return [step for inner in decoder.get("decoders", []) for step in _decoder_steps(inner)]
    return [decoder]


_BYTE_FALLBACK_TOKEN = _re.compile(r"<0x([0-9A-Fa-f]{2})>")

def _load_engine_tokenizer(directory):
    """The directory's tokenizer.json through the tokenizers package (cached per directory)."""
    import tokenizers

    tokenizer = _engine_tokenizers.get(directory)
    if tokenizer is None:
        path = _os.path.join(directory, "tokenizer.json")
        if not _os.path.isfile(path):
            raise FileNotFoundError(f"{path} not found")
        tokenizer = tokenizers.Tokenizer.from_file(path)
        _engine_tokenizers[directory] = tokenizer
    return tokenizer


_engine_tokenizers = {}


def _engine_tokenize(directory, data):
    """OgaExtTokenizeFunction: ids of UTF-8 `data` under the directory's tokenizer (no special tokens)."""
    text = data.decode("utf-8", errors="replace")
    return _load_engine_tokenizer(directory).encode(text, add_special_tokens=False).ids


def _engine_token_table(directory):
    """The token table the engine matches stop strings and compiles grammars with
    (OgaExtTokenTable): ``(bytes, offsets, special)`` for the directory's tokenizer.json.

    Each token's bytes are what the tokenizer's decoder makes of it in the middle of a text (as
    0.18's detokenizer reads a turn: a SentencePiece decoder's drop of a text's first space is not
    applied). Plain ByteLevel decoders map characters back to bytes exactly. Other decoder chains
    (SentencePiece style: Replace "\u2581" by " ", ByteFallback, Fuse, Strip) are run by the
    ``tokenizers`` package on the token after an anchor token, with ``<0xNN>`` byte tokens read as
    their byte. Special (added, special=True) tokens are flagged and carry their content.
    """
    tokenizer = _load_engine_tokenizer(directory)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    special_ids = _special_ids(tokenizer)
    steps = _decoder_steps(_json.loads(tokenizer.to_str()).get("decoder"))
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"]:
        pieces = _byte_level_bytes(tokenizer, vocab_size)
    else:
        byte_fallback = "ByteFallback" in kinds
        decoder = tokenizer.decoder
        anchor = "x"
        anchor_text = decoder.decode([anchor]) if decoder is not None else anchor
        pieces = []
        for token_id in range(vocab_size):
            token = tokenizer.id_to_token(token_id)
            if token is None:
                pieces.append(b"")
                continue
            match = _BYTE_FALLBACK_TOKEN.fullmatch(token) if byte_fallback else None
            if match is not None:
                pieces.append(bytes((int(match.group(1), 16),)))
            elif token_id in special_ids or decoder is None:
                pieces.append(token.encode("utf-8"))
            else:
                text = decoder.decode([anchor, token])
                pieces.append(text[len(anchor_text):].encode("utf-8") if text.startswith(anchor_text)
                              else token.encode("utf-8"))
    for token_id in special_ids:
        if token_id < vocab_size:
            pieces[token_id] = (tokenizer.id_to_token(token_id) or "").encode("utf-8")
    lengths = _np.fromiter((len(piece) for piece in pieces), dtype=_np.uintp, count=len(pieces))
    offsets = _np.zeros(len(pieces) + 1, dtype=_np.uintp)
    _np.cumsum(lengths, out=offsets[1:])
    special = _np.zeros(len(pieces), dtype=_np.uint8)
    for token_id in special_ids:
        if token_id < vocab_size:
            special[token_id] = 1
    return b"".join(pieces), offsets, special


# The generic stream re-decodes a short window of recent tokens: enough context that decoders which
# treat the first token of a sequence specially (Metaspace strips its leading space) give the same
# text as in the middle of a sequence, and bounded so each call costs the same however long the
# answer gets.
_STREAM_CONTEXT_TOKENS = 4
_STREAM_MAX_WINDOW = 16


class TokenizerStream:
    """Incremental detokenizer from ``Tokenizer.create_stream()``.

    ``decode(token)`` returns the text that token completes: an empty string while the token only
    contributes part of a multi-byte UTF-8 character (the bytes are held until the character is
    complete, so a piece never splits a character), and '' for special tokens while
    skip_special_tokens is on (the default), as in 0.18. Bytes that can never form a character
    become U+FFFD, as in ``Tokenizer.decode`` (0.18's stream drops them silently).
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("oga.TokenizerStream: No constructor defined!")

    @classmethod
    def _create(cls, tokenizer):
        stream = cls.__new__(cls)
        stream._tokenizer = tokenizer
        table = tokenizer._stream_table()
        if table is not None:
            stream._bytes, stream._special = table
            stream._utf8 = _codecs.getincrementaldecoder("utf-8")(errors="replace")
        else:
            stream._bytes = None
            stream._ids = []        # the decode window
            stream._emitted = 0     # characters of decode(window) already returned
        return stream

    def decode(self, token):
        """decode(token: int) -> str"""
        token = _operator.index(token)
        if not _INT32_MIN <= token <= _INT32_MAX:
            raise TypeError("decode(): token id out of the int32 range")
        tokenizer = self._tokenizer
        if not 0 <= token < tokenizer._vocab_size:
            return ""
        if self._bytes is not None:
            if token in self._special and tokenizer._skip_special_tokens:
                return ""
            return self._utf8.decode(self._bytes[token])
        return self._decode_window(token)

    def _decode_window(self, token):
        tokenizer = self._tokenizer
        ids = self._ids
        ids.append(token)
        text = tokenizer._tokenizer.decode(ids, skip_special_tokens=tokenizer._skip_special_tokens)
        # Trailing U+FFFD is an incomplete UTF-8 sequence still waiting for its next bytes.
        stable = len(text)
        while stable > self._emitted and text[stable - 1] == "\ufffd":
            stable -= 1
        piece = text[self._emitted:stable] if stable > self._emitted else ""
        self._emitted = max(self._emitted, stable)
        if stable == len(text) and len(ids) > _STREAM_MAX_WINDOW:
            del ids[:-_STREAM_CONTEXT_TOKENS]
            self._emitted = len(tokenizer._tokenizer.decode(
                ids, skip_special_tokens=tokenizer._skip_special_tokens))
        return piece
