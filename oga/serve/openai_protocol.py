"""The OpenAI wire format `oga serve` speaks: request validation, errors, response bodies.

Requests are checked field by field against OpenAI's chat completions and completions request
schemas (the `openai` client's `completion_create_params` types). Every field oga implements is
applied; a field that asks for nothing that changes the answer (`user`, `metadata`, prompt-cache
hints, ...) is accepted with its type checked and ignored; a field oga does not implement is
accepted only at the value that asks for what oga does anyway (``n: 1``, ``logprobs: false``,
``presence_penalty: 0``, ...) and otherwise refused with a 400 that names it as unsupported, as is
any field OpenAI itself does not know (OpenAI answers unknown fields the same way). Three non-OpenAI
sampling fields that engines commonly accept are implemented: ``top_k``, ``repetition_penalty`` and
``min_tokens``. The README's Serving section lists every field and what oga does with it.
"""
import dataclasses
import json
import math
import time
import uuid


class OpenAIError(Exception):
    """An error answered as OpenAI does: HTTP `status` with {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


# Fields oga does not implement, with the values that ask for nothing beyond what oga does.
_CHAT_ONLY_AT = {
    "n": (1,), "logprobs": (False,), "top_logprobs": (0,), "presence_penalty": (0,), "frequency_penalty": (0,),
    "logit_bias": ({},), "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "store": (False,), "service_tier": ("auto", "default"), "modalities": (["text"],), "audio": (),
    "reasoning_effort": ("none",), "verbosity": ("medium",), "web_search_options": (), "moderation": (),
}
_COMPLETION_ONLY_AT = {
    "n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (0,), "suffix": ("",), "presence_penalty": (0,),
    "frequency_penalty": (0,), "logit_bias": ({},),
}
# Fields accepted whatever their value (its type checked) and ignored: nothing they ask for changes
# the answer. End-user ids for OpenAI's abuse monitoring and labels of stored completions (oga has
# neither); prompt-cache hints (oga's prefix cache reuses any shared prefix, with no key);
# predicted output (only a speed-up at OpenAI; the answer is the model's either way); and
# parallel_tool_calls, which concerns tool calls (oga makes none: tools must be empty).
_CHAT_IGNORED = {"user": str, "safety_identifier": str, "metadata": dict, "prompt_cache_key": str,
                 "prompt_cache_retention": str, "prompt_cache_options": dict, "prediction": dict,
                 "parallel_tool_calls": bool}
_COMPLETION_IGNORED = {"user": str}
_TYPE_NAMES = {str: "a string", dict: "an object", bool: "a boolean"}
_SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
                    "top_k", "repetition_penalty", "min_tokens")
_CHAT_FIELDS = frozenset(("model", "messages", "max_completion_tokens", "response_format") + _SAMPLING_FIELDS)
_COMPLETION_FIELDS = frozenset(("model", "prompt") + _SAMPLING_FIELDS)
_MESSAGE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_UNSUPPORTED_ROLES = ("tool", "function")   # tool results: oga makes no tool calls
# Message keys of the schema oga does not implement, accepted only absent or null (tool_calls also
# empty): an assistant's tool calls, refusal text and audio, a tool message's call id.
_MESSAGE_ONLY_NULL = {"tool_calls": ([],), "function_call": (), "refusal": (), "audio": (), "tool_call_id": ()}
_MAX_STOP_STRINGS = 4


@dataclasses.dataclass
class GenerationRequest:
    """A validated chat or completion request. Exactly one of `messages` (chat), `prompt_text` and
    `prompt_tokens` (completions) is set."""
    kind: str                                 # "chat" or "completion"
    model: str
    messages: list | None = None              # [{"role", "content"}] with text content
    prompt_text: str | None = None
    prompt_tokens: list | None = None
    max_tokens: int | None = None             # None: chat, what the context leaves; completions, 16
    min_tokens: int = 0
    stop: list = dataclasses.field(default_factory=list)    # the engine's stop strings first, then the rest
    engine_stops: int = 0                     # stop[:engine_stops] go to the engine; the server matches the rest
    stream: bool = False
    include_usage: bool = False
    policy: dict = dataclasses.field(default_factory=dict)   # og.TurnOptions setter -> argument tuple


def parse_json_body(body: bytes):
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as e:
        # ValueError: malformed JSON, bytes that are not UTF-8, an integer literal past Python's
        # digit limit; RecursionError: nesting deeper than the parser's recursion allows.
        raise bad_request(f"The request body is not valid JSON: {type(e).__name__}: {e}") from None
    if not isinstance(document, dict):
        raise bad_request("The request body must be a JSON object.")
    return document


def parse_chat_request(document: dict) -> GenerationRequest:
    _check_fields(document, _CHAT_FIELDS, _CHAT_ONLY_AT, _CHAT_IGNORED)
    request = GenerationRequest("chat", _model(document))
    request.messages = _messages(document.get("messages"))
    max_tokens = document.get("max_tokens")
    max_completion_tokens = document.get("max_completion_tokens")
    if max_tokens is not None and max_completion_tokens is not None:
        raise bad_request("Pass either 'max_tokens' or 'max_completion_tokens', not both.", "max_tokens")
    if max_completion_tokens is not None:
        request.max_tokens = _positive_int(max_completion_tokens, "max_completion_tokens")
    _sampling(document, request)
    _response_format(document.get("response_format"), request)
    return request


def parse_completion_request(document: dict) -> GenerationRequest:
    _check_fields(document, _COMPLETION_FIELDS, _COMPLETION_ONLY_AT, _COMPLETION_IGNORED)
    request = GenerationRequest("completion", _model(document))
    _prompt(document.get("prompt"), request)
    _sampling(document, request)   # max_tokens absent: OpenAI's 16, applied where the context is known
    return request


# ---- field checks ---------------------------------------------------------------------------------


def _check_fields(document, known, only_at, ignored):
    for name, value in document.items():
        if name in known:
            continue
        if name in ignored:
            if value is not None and not isinstance(value, ignored[name]):
                raise bad_request(f"Invalid type for '{name}': expected {_TYPE_NAMES[ignored[name]]}.", name,
                                  "invalid_type")
            continue
        _only_at(name, value, only_at)


def _only_at(name, value, only_at, where=None):
    """Accepts `value` of the field `name` when it is null or one of only_at[name]; refuses it as
    unsupported otherwise, and refuses a name outside the schema as OpenAI does."""
    where = where or name
    if name in only_at:
        if value is None or any(_same(value, allowed) for allowed in only_at[name]):
            return
        raise bad_request(f"'{where}' is not supported by oga serve (only {_describe(only_at[name])}).", where,
                          "unsupported_parameter")
    raise bad_request(f"Unrecognized request argument supplied: {where}", where, "unrecognized_parameter")


def _same(value, allowed):
    # bool is an int in Python: `logprobs: 0` must not pass for `False`, nor `n: true` for 1; but a
    # JSON number is one type, so `presence_penalty: 0.0` is the allowed 0.
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    if isinstance(allowed, (int, float)):
        return isinstance(value, (int, float)) and value == allowed
    return type(value) is type(allowed) and value == allowed


def _describe(values):
    shown = ["null"] + [json.dumps(v) for v in values]
    return " or ".join(shown)


def _model(document):
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string.", "model")
    return model


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _positive_int(value, name):
    if not _is_int(value):
        raise bad_request(f"Invalid type for '{name}': expected an integer.", name, "invalid_type")
    if value < 1:
        raise bad_request(f"Invalid '{name}': {value}; it must be at least 1.", name, "invalid_value")
    return value


def _number(value, name, low, high, *, low_open=False):
    if not _is_number(value):
        raise bad_request(f"Invalid type for '{name}': expected a number.", name, "invalid_type")
    if value > high or value < low or (low_open and value == low):
        bound = f"({low}" if low_open else f"[{low}"
        raise bad_request(f"Invalid '{name}': {value}; it must be in {bound}, {high}].", name, "invalid_value")
    return float(value)


def _sampling(document, request):
    if document.get("max_tokens") is not None:
        request.max_tokens = _positive_int(document["max_tokens"], "max_tokens")
    policy = request.policy
    temperature = document.get("temperature")
    top_p = document.get("top_p")
    top_k = document.get("top_k")
    if temperature is not None:
        temperature = _number(temperature, "temperature", 0.0, 2.0)
    if top_p is not None:
        top_p = _number(top_p, "top_p", 0.0, 1.0, low_open=True)
    if top_k is not None:
        # Any size: the server clamps it to the vocabulary (a top_k beyond it keeps every token).
        if not _is_int(top_k) or top_k < 0:
            raise bad_request("Invalid 'top_k': expected a non-negative integer (0: no limit).", "top_k")
    # temperature 0 and top_k 1 ask for greedy decoding (the engine refuses a temperature or top_p
    # set beside a greedy policy, so they are dropped here); any other sampling field asks for
    # sampling. Without any of them the model's own search defaults (genai_config.json "search") apply.
    if temperature == 0.0 or top_k == 1:
        policy["do_sample"] = (False,)
    elif temperature is not None or top_p is not None or top_k:
        policy["do_sample"] = (True,)
        if temperature is not None:
            policy["temperature"] = (temperature,)
        if top_p is not None:
            policy["top_p"] = (top_p,)
        if top_k:
            policy["top_k"] = (top_k,)
    seed = document.get("seed")
    if seed is not None:
        if not _is_int(seed) or not 0 <= seed < 2 ** 64:
            raise bad_request("Invalid 'seed': expected an integer in [0, 2**64).", "seed")
        policy["seed"] = (seed,)
    penalty = document.get("repetition_penalty")
    if penalty is not None:
        policy["repetition_penalty"] = (_number(penalty, "repetition_penalty", 0.0, 10.0, low_open=True),)
    min_tokens = document.get("min_tokens")
    if min_tokens is not None:
        if not _is_int(min_tokens) or min_tokens < 0:
            raise bad_request("Invalid 'min_tokens': expected a non-negative integer.", "min_tokens")
        if request.max_tokens is not None and min_tokens > request.max_tokens:
            raise bad_request("'min_tokens' must not exceed 'max_tokens'.", "min_tokens")
        request.min_tokens = min_tokens
        if min_tokens:
            policy["min_generated_tokens"] = (min_tokens,)
    stops = _stop(document.get("stop"))
    # The engine takes stop strings as C strings; one holding a NUL character is matched by the
    # server on the answer's text instead (TurnText), which then ends the turn.
    engine_stops = [s for s in stops if "\0" not in s]
    request.stop = engine_stops + [s for s in stops if "\0" in s]
    request.engine_stops = len(engine_stops)
    if engine_stops:
        policy["stop_strings"] = (engine_stops,)
    stream = document.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("Invalid type for 'stream': expected a boolean.", "stream", "invalid_type")
    request.stream = bool(stream)
    options = document.get("stream_options")
    if options is not None:
        if not request.stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        if not isinstance(options, dict):
            raise bad_request("Invalid type for 'stream_options': expected an object.", "stream_options",
                              "invalid_type")
        for name, value in options.items():
            if name != "include_usage":
                # include_obfuscation pads stream chunks against length side channels: not done.
                _only_at(name, value, {"include_obfuscation": (False,)}, f"stream_options.{name}")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad_request("Invalid type for 'stream_options.include_usage': expected a boolean.",
                              "stream_options.include_usage", "invalid_type")
        request.include_usage = include_usage


def _stop(value):
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("Invalid 'stop': expected a string or an array of strings.", "stop", "invalid_type")
    if len(stops) > _MAX_STOP_STRINGS:
        raise bad_request(f"Invalid 'stop': at most {_MAX_STOP_STRINGS} stop sequences.", "stop")
    if any(s == "" for s in stops):
        raise bad_request("Invalid 'stop': stop sequences must not be empty.", "stop")
    for s in stops:
        unicode_text(s, "stop")
    return list(dict.fromkeys(stops))


def unicode_text(text: str, field: str) -> str:
    """`text`, refused when it is not valid Unicode: JSON's \\ud800 escapes decode to lone
    surrogates, which no tokenizer encodes and no answer can contain."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"Invalid '{field}': the text holds a lone UTF-16 surrogate, which is not valid Unicode.",
                          field) from None
    return text


def _messages(value):
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty array.", "messages")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"Invalid '{where}': expected an object.", where)
        role = message.get("role")
        if role in _UNSUPPORTED_ROLES:
            raise bad_request(f"'{where}.role' {json.dumps(role)} is not supported by oga serve (it makes no tool "
                              "calls).", f"{where}.role", "unsupported_parameter")
        if role not in _MESSAGE_ROLES:
            raise bad_request(f"Invalid '{where}.role': {json.dumps(role)}; oga serve supports "
                              f"{', '.join(sorted(_MESSAGE_ROLES))}.", f"{where}.role")
        for key, field in message.items():
            if key in ("role", "content"):
                continue
            if key == "name":
                if field is not None:
                    raise bad_request(f"'{where}.name' is not supported by oga serve (the chat template has no "
                                      "place for participant names).", f"{where}.name", "unsupported_parameter")
                continue
            _only_at(key, field, _MESSAGE_ONLY_NULL, f"{where}.{key}")
        messages.append({"role": _MESSAGE_ROLES[role], "content": _message_text(message.get("content"), where)})
    return messages


def _message_text(content, where):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(part, dict):
                raise bad_request(f"Invalid '{at}': expected an object.", at)
            kind = part.get("type")
            if kind != "text":
                raise bad_request(f"'{at}' of type {json.dumps(kind)} is not supported by oga serve (text parts "
                                  'only: {"type": "text", "text": ...}).', at, "unsupported_parameter")
            if not isinstance(part.get("text"), str):
                raise bad_request(f"Invalid '{at}.text': expected a string.", f"{at}.text", "invalid_type")
            for key in part:
                # prompt_cache_breakpoint: a prompt-cache hint, ignored (oga's prefix cache needs none)
                if key not in ("type", "text", "prompt_cache_breakpoint"):
                    raise bad_request(f"Unrecognized request argument supplied: {at}.{key}", f"{at}.{key}",
                                      "unrecognized_parameter")
            pieces.append(part["text"])
        return "".join(pieces)
    raise bad_request(f"Invalid '{where}.content': expected a string or an array of text parts.", f"{where}.content")


def _prompt(value, request):
    # One prompt per request: a string or token ids (also as a one-element array of either).
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        request.prompt_text = value
        return
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        request.prompt_tokens = list(value)
        return
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise bad_request("oga serve takes one prompt per request; send the prompts of a batch as separate "
                          "requests (they run concurrently).", "prompt", "unsupported_parameter")
    raise bad_request("Invalid 'prompt': expected a string or a non-empty array of token ids.", "prompt")


def _response_format(value, request):
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request("Invalid 'response_format': expected an object with a 'type'.", "response_format")
    kind = value["type"]
    if kind == "text" and set(value) == {"type"}:
        return
    if kind == "json_object" and set(value) == {"type"}:
        request.policy["guidance"] = ("json_schema", json.dumps({"type": "object"}))
        return
    if kind == "json_schema" and set(value) == {"type", "json_schema"}:
        spec = value["json_schema"]
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) \
                or set(spec) - {"name", "schema", "strict", "description"}:
            raise bad_request("Invalid 'response_format.json_schema': expected {name, schema, strict?, "
                              "description?}.", "response_format.json_schema")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise bad_request("Invalid 'response_format.json_schema.schema': expected an object.",
                              "response_format.json_schema.schema")
        if spec.get("strict") not in (None, True, False):
            raise bad_request("Invalid 'response_format.json_schema.strict': expected a boolean.",
                              "response_format.json_schema.strict")
        # Guidance enforces the schema on every token whether or not `strict` is set.
        request.policy["guidance"] = ("json_schema", json.dumps(schema))
        return
    raise bad_request("Invalid 'response_format': oga serve supports {\"type\": \"text\"}, {\"type\": "
                      "\"json_object\"} and {\"type\": \"json_schema\", \"json_schema\": {...}}.", "response_format")


# ---- responses -------------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_body(kind, response_id, created, model, text, finish_reason, prompt_tokens, completion_tokens) -> dict:
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": response_id, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage_body(prompt_tokens, completion_tokens)}


class ChunkWriter:
    """Server-sent events of one streamed response, as OpenAI sends them: a chat stream opens with
    the assistant role, then one chunk per piece of text, then a chunk with the finish reason, a
    usage chunk when asked for (empty choices), and `data: [DONE]`."""

    def __init__(self, kind: str, response_id: str, model: str):
        self.kind = kind
        self.head = {"id": response_id, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                     "created": int(time.time()), "model": model}

    def _event(self, choices, **extra) -> bytes:
        return b"data: " + json.dumps({**self.head, "choices": choices, **extra}, ensure_ascii=False,
                                      separators=(",", ":")).encode("utf-8") + b"\n\n"

    def _choice(self, text, finish_reason, role=False):
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def opening(self) -> bytes:
        """The chat stream's first chunk (the role); completions streams have none."""
        return self._event([self._choice("", None, role=True)]) if self.kind == "chat" else b""

    def text(self, text: str) -> bytes:
        return self._event([self._choice(text, None)])

    def finish(self, finish_reason: str) -> bytes:
        return self._event([self._choice("", finish_reason)])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return self._event([], usage=usage_body(prompt_tokens, completion_tokens))

    @staticmethod
    def error(error: OpenAIError) -> bytes:
        return b"data: " + json.dumps(error.body()).encode("utf-8") + b"\n\n"

    DONE = b"data: [DONE]\n\n"
