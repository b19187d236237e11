"""Execution providers named in genai_config.json (model.decoder.session_options.provider_options,
edited by Config.append_provider / set_provider_option), checked when the model loads as
onnxruntime-genai 0.18 checks them, with its texts where oga's situation is the same.

0.18 knows one set of names and matches some of them in any case (`cuda`, `CUDA`,
`CUDAExecutionProvider`), others only as spelled (`XNNPACK`, `XnnpackExecutionProvider`); anything
else is an unknown name. A known provider that is not there fails the load: CUDA without a usable
CUDA ("Cuda interface not available: ..."; 0.18 names its CUDA library, oga the reason), DML, and
the providers a build does not have ("<name> execution provider is not supported in this build. ").
oga runs decoders on ONNX Runtime's CPU and CUDA providers only, so every other provider is one this
build does not have, even where the onnxruntime package offers it. The CPU provider takes no
options, as in 0.18. AZURE (ONNX Runtime's remote-inference provider, which the CPU wheel has) is
accepted as 0.18 accepts it; oga's decoders have none of its operators, so the session is not given it.
"""
from .contract import ModelLoadError

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"

# name.lower() -> 0.18's canonical name, for the names 0.18 matches in any case
_ANY_CASE = {}
for _canonical, _long in (("CPU", "CPUExecutionProvider"), ("cuda", "CUDAExecutionProvider"),
                          ("NvTensorRtRtx", "NvTensorRTRTXExecutionProvider"), ("DML", "DmlExecutionProvider"),
                          ("QNN", "QNNExecutionProvider"), ("OpenVINO", "OpenVINOExecutionProvider"),
                          ("WebGPU", "WebGpuExecutionProvider"), ("VitisAI", "VitisAIExecutionProvider"),
                          ("RyzenAI", "RyzenAIExecutionProvider")):
    _ANY_CASE[_canonical.lower()] = _ANY_CASE[_long.lower()] = _canonical

# the names 0.18 matches only as spelled (its messages then repeat the name as given)
_EXACT = {"SNPE", "SNPEExecutionProvider", "XNNPACK", "XnnpackExecutionProvider", "WEBNN", "WebNNExecutionProvider",
          "AZURE", "AzureExecutionProvider", "JS", "JsExecutionProvider", "CoreML", "CoreMLExecutionProvider",
          "MIGraphX", "MIGraphXExecutionProvider"}

UNKNOWN = ("Unknown provider name '{}'. Currently supported values are 'DML'/'DmlExecutionProvider', "
           "'QNN'/'QNNExecutionProvider', 'OpenVINO'/'OpenVINOExecutionProvider', 'SNPE'/'SNPEExecutionProvider', "
           "'XNNPACK'/'XnnpackExecutionProvider', 'WEBNN'/'WebNNExecutionProvider', "
           "'WebGPU'/'WebGpuExecutionProvider', 'AZURE'/'AzureExecutionProvider', 'JS'/'JsExecutionProvider', "
           "'VitisAI'/'VitisAIExecutionProvider', 'CoreML'/'CoreMLExecutionProvider', "
           "'MIGraphX'/'MIGraphXExecutionProvider', and 'CPU'/'CPUExecutionProvider'.")
CPU_OPTIONS = ("CPU execution provider does not support provider options. CPU is always available as the default "
               "fallback and does not need to be explicitly registered. Remove the CPU provider entry and its "
               "options from your configuration.")
DML = "DML provider requested, but the installed GenAI has not been built with DML support"
NOT_IN_THIS_BUILD = "{} execution provider is not supported in this build. "
CUDA_UNAVAILABLE = "Cuda interface not available: {}"


def canonical_name(name):
    """0.18's name for a provider entry's key, or None when 0.18 does not know it."""
    if name in _EXACT:
        return name
    return _ANY_CASE.get(name.lower())


def session_providers(provider_options, cuda_reason, cuda_stand_in=False):
    """(providers, options) for the InferenceSession from the config's provider_options entries, in
    their order, with the CPU provider last as the fallback; ModelLoadError with 0.18's text for the
    first entry 0.18 would refuse. `cuda_reason`: why CUDA cannot run here ("" when it can), asked
    for only when an entry names CUDA (a callable). `cuda_stand_in` (test-only: oga.testing.device_path
    runs the device path on CPU): a cuda entry without CUDA is kept, and the caller drops it with a
    warning."""
    providers, options = [], []
    for entry in provider_options or []:
        for name, values in entry.items():
            values = {str(k): str(v) for k, v in (values or {}).items()}
            canonical = canonical_name(name)
            if canonical is None:
                raise ModelLoadError(UNKNOWN.format(name))
            if canonical == "CPU":
                if values:
                    raise ModelLoadError(CPU_OPTIONS)
                continue  # the fallback, appended below
            if canonical in ("cuda", "NvTensorRtRtx"):
                reason = cuda_reason()
                if reason and not cuda_stand_in:
                    raise ModelLoadError(CUDA_UNAVAILABLE.format(reason))
                if canonical == "NvTensorRtRtx":
                    raise ModelLoadError(NOT_IN_THIS_BUILD.format(canonical))
                if CUDA not in providers:
                    providers.append(CUDA)
                    options.append(values)
                continue
            if canonical == "DML":
                raise ModelLoadError(DML)
            if canonical in ("AZURE", "AzureExecutionProvider"):
                continue
            raise ModelLoadError(NOT_IN_THIS_BUILD.format(canonical))
    providers.append(CPU)
    options.append({})
    return providers, options
