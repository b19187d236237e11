"""`oga serve`: the command line of the OpenAI-compatible server (wired into oga/cli.py).

    oga serve                                    # SmolLM2-135M-Instruct on http://127.0.0.1:8000
    oga serve --model path/to/model_dir --port 9000
    oga serve --replicas 2                       # two engines behind Ray Serve

Without --model the command serves SmolLM2-135M-Instruct, built for the CPU on first use into the
same cache as `oga generate` (see oga/model_loading.py). Routes: POST /v1/chat/completions, POST
/v1/completions, GET /v1/models, GET /health, GET /metrics (Prometheus). SIGTERM or Ctrl-C drains:
no new requests (503), in-flight ones get --shutdown-timeout seconds to finish, then the rest are
cancelled and the command exits 0.
"""
import argparse

from .settings import DEFAULT_SERVED_MODEL_NAME, default_model_settings


def _positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _port(text):
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (0-65535), got {value}")
    return value


def _non_negative_float(text):
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser, precisions):
    parser.add_argument("-m", "--model", metavar="DIR",
                        help="oga model directory (default: SmolLM2-135M-Instruct, built on first use as "
                             "`oga generate` does)")
    parser.add_argument("--precision", choices=precisions,
                        help="weights of the default model's build (default: the GGUF's own blocks); not with --model")
    parser.add_argument("--served-model-name", metavar="NAME",
                        help="the model id clients send and /v1/models lists (default: the directory's name; "
                             f"{DEFAULT_SERVED_MODEL_NAME} for the default model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000,
                        help="port to listen on (default: 8000; 0 picks a free one, standalone only)")
    parser.add_argument("--max-batch-size", type=_positive_int,
                        help="rows per model step (overrides the model's engine.dynamic_batching.max_batch_size)")
    parser.add_argument("--max-waiting", type=_positive_int, default=256,
                        help="requests accepted without a first token yet, beyond which requests are answered "
                             "503 with Retry-After (default: 256)")
    parser.add_argument("--max-body-bytes", type=_positive_int, default=1 << 20,
                        help="largest request body accepted; larger ones get 413 (default: 1 MiB)")
    parser.add_argument("--shutdown-timeout", type=_non_negative_float, default=30.0, metavar="SECONDS",
                        help="on SIGTERM, how long in-flight requests may run before they are cancelled (default: 30)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn's log level (default: info)")
    ray = parser.add_argument_group("scale-out with Ray Serve")
    ray.add_argument("--replicas", type=_positive_int,
                     help="run N replicas, each owning one engine, behind Ray Serve (needs the serve extra's ray)")
    ray.add_argument("--replica-cpus", type=_non_negative_float, default=1.0,
                     help="CPUs Ray reserves per replica (default: 1)")
    ray.add_argument("--replica-gpus", type=_non_negative_float, default=0.0,
                     help="GPUs Ray reserves per replica (1: one replica per GPU; default: 0)")
    ray.add_argument("--ray-address", help="join this Ray cluster (default: start a local Ray instance)")


def keep_ray_on_loopback():
    """A local Ray instance behind a loopback server talks to itself over 127.0.0.1: Ray otherwise
    addresses its own node by the machine's outward-facing IP. The switch is read when `ray` is
    first imported, and Ray's child processes inherit it (it turns off multi-node clustering, which
    a single local instance does not use)."""
    import os
    import sys

    if "ray" in sys.modules:
        raise RuntimeError("keep_ray_on_loopback() must run before ray is imported")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def run(args) -> int:
    """Runs `oga serve` with parsed arguments; raises oga.model_loading.CommandError for a bad set-up."""
    import os

    from oga.model_loading import CommandError

    if args.replicas is not None and args.ray_address is None and args.host in ("127.0.0.1", "localhost"):
        keep_ray_on_loopback()
    try:
        from .settings import ServeSettings
        if args.replicas is None:
            from .http_server import serve_http
        else:
            from .ray_deployment import serve_replicas
    except ImportError as e:
        raise CommandError(f"oga serve needs the serve extra (pip install 'oga[serve]'): {e}") from None
    if args.model is not None and args.precision is not None:
        raise CommandError("--precision chooses how the default model is built; a --model directory runs as it "
                           "was built")
    if args.model is not None:
        if not os.path.isfile(os.path.join(args.model, "genai_config.json")):
            raise CommandError(f"{args.model} is not an oga model directory (no genai_config.json)")
        fields = {"model_dir": os.path.abspath(args.model), "model_name": args.served_model_name or ""}
    else:
        fields = default_model_settings(args.served_model_name, args.precision)
    settings = ServeSettings(**fields, max_batch_size=args.max_batch_size, max_waiting=args.max_waiting,
                             max_body_bytes=args.max_body_bytes, shutdown_timeout_s=args.shutdown_timeout)
    if args.replicas is None:
        try:
            return serve_http(settings, args.host, args.port, args.log_level)
        except RuntimeError as e:
            raise CommandError(str(e)) from None
    if args.port == 0:
        raise CommandError("--port 0 is not supported with --replicas (Ray Serve's proxy needs a fixed port)")
    return serve_replicas(settings, args.replicas, args.host, args.port, num_cpus=args.replica_cpus,
                          num_gpus=args.replica_gpus, ray_address=args.ray_address)
