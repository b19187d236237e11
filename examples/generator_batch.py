"""Generates answers to several prompts at once with the Generator API, the way onnxruntime-genai's
own example programs do (one GeneratorParams, a right-padded batch from encode_batch, the
generate_next_token loop, then decoding every sequence). Written for onnxruntime-genai 0.18: only
the import line says oga.

    python examples/generator_batch.py -m MODEL_DIR "What is the capital of France?" "Say hello."
"""
import argparse
import json
import time

import oga as og


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True, help="model directory (genai_config.json)")
    parser.add_argument("prompts", nargs="+", help="questions, one per sequence of the batch")
    parser.add_argument("--max_length", type=int, default=128, help="prompt plus generated tokens")
    parser.add_argument("--do_sample", action="store_true", help="sample instead of greedy search")
    parser.add_argument("--top_k", type=int, default=50)
    parser.add_argument("--top_p", type=float, default=0.9)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=-1)
    parser.add_argument("--timings", action="store_true", help="print tokens per second")
    args = parser.parse_args()

    model = og.Model(args.model)
    tokenizer = og.Tokenizer(model)
    texts = [tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": prompt}]),
                                           add_generation_prompt=True) for prompt in args.prompts]
    input_tokens = tokenizer.encode_batch(texts)

    params = og.GeneratorParams(model)
    options = {"max_length": args.max_length, "batch_size": len(args.prompts)}
    if args.do_sample:
        options.update(do_sample=True, top_k=args.top_k, top_p=args.top_p, temperature=args.temperature,
                       random_seed=args.seed)
    params.set_search_options(**options)

    generator = og.Generator(model, params)
    started = time.perf_counter()
    generator.append_tokens(input_tokens)
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    elapsed = time.perf_counter() - started

    prompt_length = input_tokens.shape()[1]
    for i, prompt in enumerate(args.prompts):
        answer = tokenizer.decode(generator.get_sequence(i)[prompt_length:])
        print(f"[{i}] {prompt}\n{answer.strip()}\n")
    if args.timings:
        print(f"{steps * len(args.prompts) / elapsed:.1f} tokens/s over {steps} steps")


if __name__ == "__main__":
    main()
