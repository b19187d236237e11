"""Programs written the way OGA's public examples are (examples/generator_batch.py,
generator_chat.py, step_api_producer.py), run as scripts: the Generator programs print exactly what
the same script prints with `import onnxruntime_genai as og` on the same directory (OGA's own CPU
build of SmolLM2); the step-API program, whose API 0.18 no longer has, prints for every request the
answer a Generator gives for that prompt alone."""
import json
import os
import subprocess
import sys

import oga
from helpers import subprocess_env
from static_models import smollm2_static_dir  # noqa: F401

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
ORIGINAL_IMPORT = "import oga as og\n"


def _run(script, *args, stdin=None):
    completed = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=subprocess_env(),
                               timeout=600, input=stdin)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def _with_onnxruntime_genai(name, tmp_path):
    """The example with the one line a user of onnxruntime_genai would have written instead."""
    import onnxruntime_genai  # noqa: F401  (a test dependency)

    with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
        source = f.read()
    assert source.count(ORIGINAL_IMPORT) == 1
    code = source.split('"""', 2)[2]
    assert "oga" not in code.replace(ORIGINAL_IMPORT, ""), "the example may differ from 0.18 code only in its import"
    path = tmp_path / name.replace(".py", "_onnxruntime_genai.py")
    path.write_text(source.replace(ORIGINAL_IMPORT, "import onnxruntime_genai as og\n"), encoding="utf-8")
    return str(path)


def test_the_batch_program_prints_what_0_18_prints(smollm2_static_dir, tmp_path):
    args = ["-m", smollm2_static_dir, "--max_length", "96", "What is the capital of France?", "Say hello.",
            "Name three colours of the rainbow."]
    ours = _run(os.path.join(EXAMPLES, "generator_batch.py"), *args)
    theirs = _run(_with_onnxruntime_genai("generator_batch.py", tmp_path), *args)
    assert ours == theirs
    assert "Paris" in ours.split("[1]")[0]


def test_the_chat_program_prints_what_0_18_prints(smollm2_static_dir, tmp_path):
    conversation = "What is the capital of France?\nAnd of Italy?\n"
    args = ["-m", smollm2_static_dir, "--max_length", "400", "--max_answer", "120"]
    ours = _run(os.path.join(EXAMPLES, "generator_chat.py"), *args, stdin=conversation)
    theirs = _run(_with_onnxruntime_genai("generator_chat.py", tmp_path), *args, stdin=conversation)
    assert ours == theirs
    first, second = ours.strip().split("\n", 1)
    assert "Paris" in first and second.strip()  # a second answer, from the conversation's cache


def test_the_step_api_program_with_a_producer_thread(smollm2_dir):
    questions = ["What is the capital of France?", "Say hello.", "What is 2+2?", "Name a planet."]
    out = _run(os.path.join(EXAMPLES, "step_api_producer.py"), "-m", smollm2_dir, "--max_length", "80", *questions)
    model = oga.Model(smollm2_dir)
    tokenizer = oga.Tokenizer(model)
    for index, question in enumerate(questions):
        prompt = tokenizer.encode(tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": question}]),
                                                                add_generation_prompt=True))
        params = oga.GeneratorParams(model)
        params.set_search_options(max_length=80)
        generator = oga.Generator(model, params)
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
        answer = tokenizer.decode(generator.get_sequence(0)[len(prompt):]).strip()
        assert f"[{index}] {question}\n{answer}\n" in out
