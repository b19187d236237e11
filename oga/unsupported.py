"""onnxruntime-genai 0.18 names that oga does not implement (yet).

Each one is importable, so code written for ``onnxruntime_genai`` imports, annotates
(``def f(images: og.Images)``) and checks ``isinstance`` with ``import oga as og`` unchanged; using
one (constructing it, or calling one of its methods or static methods) raises
``NotImplementedError`` (a ``RuntimeError``, as 0.18's errors are) made by ``not_supported``. The
classes keep the method names 0.18 exposes, so introspection sees the same shape. README "Not
supported by oga" lists them.
"""

__all__ = [
    "Adapters",
    "Audios",
    "Images",
    "MtpGenerator",
    "MultiModalProcessor",
    "NamedTensors",
    "StreamingProcessor",
]

README_SECTION = "Not supported by oga"


def not_supported(name: str, what: str) -> NotImplementedError:
    """The one error every unsupported name raises on use; ``name`` is what was used (``"Images"``,
    ``"Images.open"``), ``what`` says what it is in 0.18."""
    return NotImplementedError(
        f"og.{name} is not supported by oga yet ({what} in onnxruntime-genai 0.18); "
        f"see README '{README_SECTION}'.")


def _raiser(qualname: str, what: str):
    def unsupported(*args, **kwargs):
        raise not_supported(qualname, what)

    unsupported.__name__ = qualname.rpartition(".")[2]
    unsupported.__qualname__ = qualname
    unsupported.__doc__ = f"Not supported by oga: raises NotImplementedError ({what} in onnxruntime-genai 0.18)."
    return unsupported


def _unsupported_class(name: str, what: str, methods=(), static_methods=()):
    """A class named like 0.18's whose construction, methods and static methods raise
    ``not_supported(name, what)``; importing, annotating and ``isinstance`` work."""

    def __new__(cls, *args, **kwargs):
        raise not_supported(name, what)

    namespace = {
        "__module__": __name__.rpartition(".")[0] or __name__,
        "__qualname__": name,
        "__doc__": f"onnxruntime-genai 0.18's {name} ({what}); not supported by oga: using it raises "
                   "NotImplementedError.",
        "__new__": __new__,
        "__slots__": (),
    }
    for method in methods:
        namespace[method] = _raiser(f"{name}.{method}", what)
    for method in static_methods:
        namespace[method] = staticmethod(_raiser(f"{name}.{method}", what))
    return type(name, (), namespace)


# What each name is in 0.18, and its public instance and static methods there.
Adapters = _unsupported_class("Adapters", "LoRA adapters loaded for a model", ("load", "unload"))
Audios = _unsupported_class("Audios", "audio inputs for multimodal models", static_methods=("open", "open_bytes"))
Images = _unsupported_class("Images", "image inputs for multimodal models", static_methods=("open", "open_bytes"))
MtpGenerator = _unsupported_class("MtpGenerator", "the multi-token-prediction generation loop", (
    "append_tokens", "generate_next_token", "get_sequence", "get_stats", "is_done", "reset"))
MultiModalProcessor = _unsupported_class(
    "MultiModalProcessor", "the prompt, image and audio processor of multimodal models", ("create_stream", "decode"))
NamedTensors = _unsupported_class("NamedTensors", "named model inputs for Generator.set_inputs", ("keys",))
StreamingProcessor = _unsupported_class(
    "StreamingProcessor", "streaming audio input processing", ("flush", "get_option", "process", "set_option"))

UNSUPPORTED = {name: globals()[name] for name in __all__}
