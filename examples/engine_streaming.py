"""Continuous batching with streamed text, written for onnxruntime-genai 0.18's Engine API.

This is the shape of OGA's own engine examples: a Config with the chosen execution provider, a
Model, a Tokenizer and an Engine; prompts rendered with the chat template; one TokenizerStream per
request turning tokens into text as they arrive; new requests joining while others are still
generating; finished requests closed so waiting ones get their batch rows. The only line that
differs from the onnxruntime_genai version is the import.

Run: python examples/engine_streaming.py -m MODEL_DIR [-e cpu] [-n 8] [--initial 4] [--max-new-tokens 64]
(MODEL_DIR: e.g. `python -m oga.models build --input SmolLM2-135M-Instruct.Q4_1.gguf --output MODEL_DIR`.)
Answers go to stdout as each request finishes; timing goes to stderr.
"""
import argparse
import json
import sys
import time

import oga as og

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn rain.",
    "Explain what a hash table is in one sentence.",
    "List three primary colors.",
    "What is 12 times 12?",
    "Give me a synonym for 'happy'.",
    "Why is the sky blue? Answer briefly.",
    "Translate 'good morning' into Spanish.",
    "Name a famous physicist.",
    "What does CPU stand for?",
    "Suggest a name for a pet turtle.",
    "What is the boiling point of water in Celsius?",
]


class Conversation:
    """Client-side state of one request: its prompt, the text streamed so far, how it ended."""

    def __init__(self, index, prompt, engine, tokenizer, max_new_tokens):
        self.index = index
        self.prompt = prompt
        messages = json.dumps([
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": prompt},
        ])
        input_ids = tokenizer.encode(tokenizer.apply_chat_template(messages=messages, add_generation_prompt=True))

        request_options = og.RequestOptions()
        request_options.set_max_session_tokens(len(input_ids) + max_new_tokens)
        self.request = engine.create_request(options=request_options)
        turn_options = og.TurnOptions(self.request)
        turn_options.set_max_generated_tokens(max_new_tokens)
        self.turn_id = self.request.begin_turn(input_ids, turn_options)

        self.stream = tokenizer.create_stream()
        self.text = ""
        self.prompt_tokens = len(input_ids)
        self.generated_tokens = 0
        self.finish_reason = None


def run(args):
    config = og.Config(args.model_path)
    config.clear_providers()
    if args.execution_provider != "cpu":
        config.append_provider(args.execution_provider)
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    engine = og.Engine(model)
    event_buffer = engine.create_event_buffer(64)

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.num_requests)]
    conversations = {}
    next_prompt = 0

    def submit():
        nonlocal next_prompt
        conversation = Conversation(next_prompt, prompts[next_prompt], engine, tokenizer, args.max_new_tokens)
        conversations[conversation.request] = conversation
        next_prompt += 1

    # Some requests start at once; the rest arrive one by one as earlier ones finish, and join the
    # running batch without waiting for it to drain.
    while next_prompt < min(args.initial, len(prompts)):
        submit()

    start = time.perf_counter()
    tokens_decoded = 0
    while engine.has_pending_requests():
        finished = []
        for event in engine.run(event_buffer):
            if event.request is None:
                if event.flags & (og.EngineEventFlags.CAPACITY_BLOCKED | og.EngineEventFlags.RETRYABLE):
                    continue  # nothing committed; the engine is healthy and retries on the next run
                raise RuntimeError(f"Engine-level event: flags={event.flags}, error_code={event.error_code}")
            conversation = conversations[event.request]
            if event.flags & og.EngineEventFlags.TOKEN:
                conversation.text += conversation.stream.decode(event.token)
                tokens_decoded += 1
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                conversation.finish_reason = event.finish_reason
                conversation.generated_tokens = event.usage.generated_tokens
                finished.append(conversation)

        for conversation in finished:
            conversation.request.close()
            del conversations[conversation.request]
            print(f"[{conversation.index}] {conversation.prompt}")
            print(f"    -> {conversation.text!r} ({conversation.finish_reason.name}, "
                  f"{conversation.generated_tokens} tokens)", flush=True)
            if next_prompt < len(prompts):
                submit()
    elapsed = time.perf_counter() - start
    print(f"{args.num_requests} requests, {tokens_decoded} tokens in {elapsed:.2f} s: "
          f"{tokens_decoded / elapsed:.1f} tokens/s", file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Continuous batching with streamed text")
    parser.add_argument("-m", "--model_path", required=True,
                        help="model folder (genai_config.json, model.onnx, tokenizer files)")
    parser.add_argument("-e", "--execution_provider", default="cpu", choices=["cpu", "cuda"],
                        help="execution provider to run the model with")
    parser.add_argument("-n", "--num_requests", type=int, default=8, help="number of requests")
    parser.add_argument("--initial", type=int, default=4, help="requests submitted before the first run")
    parser.add_argument("--max_new_tokens", "--max-new-tokens", type=int, default=32,
                        help="most tokens generated per request")
    run(parser.parse_args())
