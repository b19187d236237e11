"""What one `oga serve` replica is configured with: the model, its name and the server's limits.

One frozen value object travels from the command line (or a Ray Serve application's arguments) to
every replica, so a replica started by Ray on another process builds exactly what `oga serve` would.
"""
import dataclasses
import os

# The name the default model (oga.model_loading's SmolLM2 build) is served under.
DEFAULT_SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    # The oga model directory the engine runs (resolved by the caller: `oga serve` builds its
    # default SmolLM2 first, so replicas never build models concurrently).
    model_dir: str
    # The id clients pass as "model" and /v1/models lists (default: the directory's name).
    model_name: str = ""
    # Rows per model step (engine.dynamic_batching.max_batch_size overlay); None keeps the model's.
    max_batch_size: int | None = None
    # Requests accepted but without a first token yet (queued, waiting for admission, prefilling):
    # one more is answered 503 with Retry-After.
    max_waiting: int = 256
    # Seconds a 503 asks the client to wait before retrying.
    retry_after_s: int = 1
    # Largest request body accepted (bytes); a larger one is answered 413.
    max_body_bytes: int = 1 << 20
    # Graceful shutdown: seconds in-flight turns get to finish before they are cancelled.
    shutdown_timeout_s: float = 30.0

    def __post_init__(self):
        if not self.model_dir:
            raise ValueError("ServeSettings.model_dir is required")
        if not self.model_name:
            object.__setattr__(self, "model_name", os.path.basename(os.path.normpath(self.model_dir)))
        if self.max_batch_size is not None and self.max_batch_size <= 0:
            raise ValueError(f"max_batch_size must be positive, got {self.max_batch_size}")
        if self.max_waiting <= 0:
            raise ValueError(f"max_waiting must be positive, got {self.max_waiting}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must not be negative, got {self.retry_after_s}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"shutdown_timeout_s must not be negative, got {self.shutdown_timeout_s}")


def default_model_settings(model_name=None, precision=None) -> dict:
    """ServeSettings fields of the default model, building it on first use."""
    from ..model_loading import ensure_default_model

    return {"model_dir": ensure_default_model(precision=precision),
            "model_name": model_name or DEFAULT_SERVED_MODEL_NAME}
