"""The executor's side of the model-executor interface (include/oga/oga_ext.h): the status and
logits-type codes an executor returns, how ONNX Runtime's failures map to them, the load error, and
oga's naming convention for per-token fixed-state capture outputs."""

from .._core import ExecutionStatus, LogitsType, _raised_by_signal_handler

STATUS_OK = ExecutionStatus.OK
STATUS_CAPACITY_EXCEEDED = ExecutionStatus.CAPACITY_EXCEEDED
STATUS_FATAL = ExecutionStatus.FATAL
LOGITS_FLOAT32 = LogitsType.FLOAT32
LOGITS_FLOAT16 = LogitsType.FLOAT16

# Fragments of ONNX Runtime's allocation failures: the step is rolled back and the engine stays
# healthy (ExecutionCapacityExceeded); every other failure is fatal.
# "out of memory" covers the CUDA provider's "CUDA failure 2: out of memory", "failed to allocate
# memory" its BFC arena's "Failed to allocate memory for requested buffer of size N"; cuBLAS and
# cuDNN report their own workspace failures.
_OUT_OF_MEMORY_MARKERS = ("bad_alloc", "failed to allocate memory", "out of memory", "cudaerrormemoryallocation",
                          "cuda_error_out_of_memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


class ModelLoadError(RuntimeError):
    """A decoder the executor cannot run: the graph contradicts the configuration, or a tensor has the
    wrong type or shape (the message names the file, the tensor and what was expected)."""


# oga's graphs whose LM head is oga.LogitsHead declare this output: [rows, ceil(vocab / LOGITS_BLOCK)]
# float, each row's largest logit in every block of LOGITS_BLOCK logits, bound beside the logits and
# handed to the engine (OgaExtStepOutputs.logits_block_maxima) so greedy selection reads one block
# of a row instead of all of it.
LOGITS_BLOCK_MAXIMA = "logits_block_maxima"
LOGITS_BLOCK = 1024  # OGA_EXT_LOGITS_BLOCK

# fixed state output X -> X + CAPTURE_SUFFIX: its per-token capture output (see decoder.py)
CAPTURE_SUFFIX = ".per_token"


def classify_failure(error):
    """Maps an ONNX Runtime exception to an OgaExtExecutionStatus. Only Exceptions are classified:
    a BaseException that is not one (KeyboardInterrupt from a signal handler, SystemExit) is left to
    propagate out of the executor to the _core.pyx trampoline, which reports the step Interrupted
    (rolled back, the engine healthy) and has Engine.run raise it once the core returns. An
    exception the caller's own signal handler raised while the step ran (a RuntimeError from a
    SIGALRM timeout handler, say) is the caller's too: it is raised again, to take the same way."""
    if _raised_by_signal_handler(error):
        raise error
    text = str(error).lower()
    if isinstance(error, MemoryError) or any(marker in text for marker in _OUT_OF_MEMORY_MARKERS):
        return STATUS_CAPACITY_EXCEEDED
    return STATUS_FATAL
