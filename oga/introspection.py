"""Read-only views of the core's state that production code reads, apart from oga.testing (which
is for tests only): the engine's counters (OgaExtEngineGetCounters: oga serve's /metrics) and what
the core resolves from a model's config for its loader (OgaExtConfigGetDecoderNames: the decoder's
names and sizes; oga serve reads the vocabulary size). oga.testing re-exports both."""
from . import _core


def engine_counters(engine):
    """OgaExtEngineGetCounters as a dict."""
    return _core._engine_counters(engine)


def decoder_names(config):
    """What the model loader receives for `config` (an og.Config, or a model directory): the decoder's
    tensor names, state groups and sizes as the core resolved them (OgaExtConfigGetDecoderNames), as
    the dict oga.executor.load_decoder takes."""
    if not isinstance(config, _core.OgaConfig):
        config = _core.OgaConfig(config)
    return _core._config_decoder_names(config)
