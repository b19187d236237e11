"""Continuous batching with OGA's earlier step API (onnxruntime-genai 0.10-0.15): a producer thread
creates requests and adds them to the engine while the owner thread steps it and streams each
request's tokens as they come. Written the way that era's engine examples were; only the import
line says oga (0.18 dropped this API; oga runs it on its engine).

    python examples/step_api_producer.py -m MODEL_DIR "Hi!" "Name a colour." "What is 2+2?"
"""
import argparse
import json
import threading
import time

import numpy as np

import oga as og


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True, help="model directory (genai_config.json)")
    parser.add_argument("prompts", nargs="+", help="questions; each becomes a request")
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between two new requests")
    args = parser.parse_args()

    model = og.Model(args.model)
    tokenizer = og.Tokenizer(model)
    engine = og.Engine(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=args.max_length)

    answers = {}
    produced = threading.Event()

    def producer():
        for index, question in enumerate(args.prompts):
            text = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": question}]),
                                                 add_generation_prompt=True)
            request = og.Request(params)
            request.add_tokens(np.asarray(tokenizer.encode(text), dtype=np.int32))
            request.set_opaque_data({"index": index, "stream": tokenizer.create_stream()})
            answers[index] = []
            engine.add_request(request)
            time.sleep(args.interval)
        produced.set()

    thread = threading.Thread(target=producer)
    thread.start()
    while not produced.is_set() or engine.has_pending_requests():
        request = engine.step()
        if request is None:
            time.sleep(0.001)
            continue
        data = request.get_opaque_data()
        while request.has_unseen_tokens():
            answers[data["index"]].append(data["stream"].decode(request.get_unseen_token()))
    thread.join()
    for index, question in enumerate(args.prompts):
        print(f"[{index}] {question}\n{''.join(answers[index]).strip()}\n")


if __name__ == "__main__":
    main()
