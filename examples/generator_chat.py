"""A chat loop on the Generator API, the way onnxruntime-genai's chat examples are written: one
Generator for the whole conversation, each user turn appended to it (the model keeps the history
in its cache), the answer streamed token by token. Written for onnxruntime-genai 0.18: only the
import line says oga.

    python examples/generator_chat.py -m MODEL_DIR                 # interactive
    echo -e "Hi!\\nWhat did I just say?" | python examples/generator_chat.py -m MODEL_DIR
"""
import argparse
import json
import sys

import oga as og


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True, help="model directory (genai_config.json)")
    parser.add_argument("--max_length", type=int, default=1024, help="the whole conversation, in tokens")
    parser.add_argument("--max_answer", type=int, default=256, help="tokens per answer at most")
    parser.add_argument("--system", default="You are a helpful assistant.", help="the system prompt")
    args = parser.parse_args()

    model = og.Model(args.model)
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=args.max_length)
    generator = og.Generator(model, params)

    first = True
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        question = line.strip()
        if not question:
            continue
        messages = [{"role": "user", "content": question}]
        if first:
            messages.insert(0, {"role": "system", "content": args.system})
        prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
        generator.append_tokens(tokenizer.encode(prompt))
        first = False

        stream = tokenizer.create_stream()
        answered = 0
        while not generator.is_done() and answered < args.max_answer:
            generator.generate_next_token()
            print(stream.decode(generator.get_next_tokens()[0]), end="", flush=True)
            answered += 1
        print()
        if generator.token_count() >= args.max_length:
            print("(the conversation reached max_length)")
            break


if __name__ == "__main__":
    main()
