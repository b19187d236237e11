"""oga.serve: the OpenAI-compatible server (`oga serve`) and its Ray Serve scale-out.

The server is a client of oga's public Python API: one og.Engine per replica, owned by one thread
(engine_owner), an OpenAI wire format (openai_protocol, turn_text), a FastAPI application
(app) with Prometheus metrics (metrics), run by uvicorn with a graceful shutdown (http_server) or as
Ray Serve replicas (ray_deployment), from the command line (command). It needs the `serve` extra
(fastapi, uvicorn, prometheus_client; ray[serve] for replicas); importing this package needs none
of them.

`ray_app` is the Ray Serve application builder: `serve run oga.serve:ray_app model_dir=DIR replicas=2`.
"""


def ray_app(args: dict):
    """Ray Serve application builder (see oga.serve.ray_deployment.application_from_arguments)."""
    from .ray_deployment import application_from_arguments

    return application_from_arguments(args)


__all__ = ["ray_app"]
