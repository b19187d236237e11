"""`oga build` (oga.models.build) of every architecture of the registry (oga.models.architectures) from
the tiny random Hugging Face checkpoints of architecture_models.py, the same checkpoints
onnxruntime-genai 0.18's builder builds for the static path:

- fp32 (the fused CPU graph and the standard-op one): the greedy tokens of three prompts run together
  in oga's engine equal those 0.18's Generator gives on 0.18's own fp32 build of the same checkpoint
  (prompts past the sliding window and past and across LongRoPE's switch);
- int4 / int8 (round-to-nearest, int8 activations): oga's own quantization, so the reference is oga's
  numpy decoder on exactly the weights the graph computes with (dequantized): the engine's greedy
  tokens equal the reference's up to a near-tie within the int8 activations' noise;
- the CUDA graph, which does not implement the architectures' features yet, refuses them by name.
"""
import pytest

import oga as og
from architecture_models import ARCHITECTURES, architecture_dir, checkpoint_dir
from greedy_runs import begin_all, drain, equal_to_the_reference_up_to_a_near_tie
from oga.models import architectures, build
from oga.models.safetensors_loader import load_safetensors
from test_convert_architectures import _generator_018, _prompts
from test_quantized_decoders import INT8_ACTIVATION_TOL, _effective

BUILT = [name for name in ARCHITECTURES if name in architectures.REGISTRY
         or ARCHITECTURES[name].hf_architecture in {a for arch in architectures.REGISTRY.values()
                                                     for a in arch.hf_architectures}]
MAX_NEW = 12


def _build(name, out, **kwargs):
    window = ARCHITECTURES[name].sliding_window
    return build(checkpoint_dir(name), out, context_length=128, max_batch_size=4,
                 chunk_size=16 if window else None, **kwargs)


def _engine_tokens(model_dir, prompts):
    engine = og.Engine(og.Model(str(model_dir)))
    return drain(og, engine, begin_all(og, engine, prompts, MAX_NEW))


def test_every_registry_architecture_has_a_checkpoint_here():
    """The registry and the test checkpoints agree: each registry architecture is built below."""
    covered = {architectures.for_hf_config({"architectures": [ARCHITECTURES[n].hf_architecture]}).name
               for n in BUILT}
    assert covered == set(architectures.REGISTRY)


@pytest.mark.parametrize("graph", ["fused", "standard"])
@pytest.mark.parametrize("name", BUILT)
def test_fp32_build_equals_018s_build_of_the_checkpoint(tmp_path_factory, tmp_path, name, graph):
    reference_dir = architecture_dir(tmp_path_factory, name, "fp32")
    model_dir = _build(name, tmp_path / "oga", graph=graph, precision="fp32" if graph == "fused" else None)
    prompts = _prompts()
    want = [_generator_018(reference_dir, p, MAX_NEW) for p in prompts]
    assert _engine_tokens(model_dir, prompts) == want


@pytest.mark.parametrize("precision", ["int4", "int8"])
@pytest.mark.parametrize("name", BUILT)
def test_quantized_build_equals_the_reference_on_its_weights(tmp_path, name, precision):
    loaded = load_safetensors(checkpoint_dir(name))
    effective = _effective(loaded, precision)
    model_dir = _build(name, tmp_path / "oga", precision=precision)
    prompts = _prompts()
    for prompt, have in zip(prompts, _engine_tokens(model_dir, prompts)):
        equal_to_the_reference_up_to_a_near_tie(effective, prompt, have, MAX_NEW, INT8_ACTIVATION_TOL)


# the architectures whose tiny checkpoints use features beyond the Llama layout
FEATURED = ["qwen3", "phi3.5-longrope", "phi4-mini", "gemma", "gemma2", "gemma3", "granite"]


@pytest.mark.parametrize("name", FEATURED)
def test_the_cuda_graph_refuses_features_it_lacks(tmp_path, name):
    spec = load_safetensors(checkpoint_dir(name)).spec
    assert spec.features()
    with pytest.raises(NotImplementedError, match=f"the CUDA graph does not implement .* for {spec.architecture}"):
        _build(name, tmp_path / "cuda", target="cuda")
    assert not (tmp_path / "cuda").exists()


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3", "qwen3"])
def test_random_builds_of_registry_architectures(tmp_path, architecture):
    """`oga build --random --architecture NAME` gives the architecture's features (the defaults its
    config would have) on the command's shape: the engine's greedy tokens equal the numpy reference's on
    the same random weights."""
    from oga.models.__main__ import main, make_parser, random_spec_from_args
    from oga.models.random_weights import random_model
    from oga.models.reference import greedy

    argv = ["build", "--random", "--architecture", architecture, "--layers", "3", "--hidden", "64", "--heads", "4",
            "--kv-heads", "2", "--vocab", "97", "--sliding-window", "8", "--sliding-window-layers", "0,1",
            "--context-length", "64", "--output", str(tmp_path / "out")]
    spec = random_spec_from_args(make_parser().parse_args(argv))
    assert spec.architecture == architecture and spec.features() and spec.ring_layers() == [0, 1]
    assert main(argv) == 0
    prompt = [5, 6, 7, 8, 9] * 3                      # past the window of 8
    assert _engine_tokens(tmp_path / "out", [prompt]) == [greedy(random_model(spec, seed=0), prompt, MAX_NEW)]
