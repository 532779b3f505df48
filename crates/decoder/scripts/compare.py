#!/usr/bin/env python3
"""cuhal-decoder against PyTorch/transformers on the same model (run on the GPU machine).

Builds `LlamaForCausalLM` from the model directory's config.json and safetensors (local files
only, no network), then:

1. Teacher forcing over POSITIONS (default 128) positions of deterministic token ids: the
   decoder binary dumps its logits (`--teacher-force FILE --dump-logits FILE`), transformers
   computes its own in one forward pass, and every position's logits must agree within

       tol = 8 * u * (2 L + 2) * max(1, max |logit|)

   where u is the unit roundoff of the model's dtype (2^-11 for float16, 2^-8 for bfloat16) and
   L the number of layers. Why: transformers rounds every matmul's output and the residual
   stream to the dtype (two residual adds per layer, plus the final norm and the output
   projection: 2 L + 2 roundings of relative size u along the path to the logits), while the
   decoder keeps activations in f32 and rounds only its key/value cache; their differences are
   first order in u times the size of the values, and 8 is the headroom for the summation
   orders and the logits' own rounding to the dtype. The argmax must agree on at least 99% of
   the positions. Where the two differ at a near tie (transformers' two logits closer than
   tol, so its own rounding can decide the order), the same model in float32 settles it: the
   position agrees if cuhal's argmax is float32's. Strict agreement is reported beside it.
2. Greedy generation of GENERATE (default 64) tokens from a short prompt on both sides,
   reporting where they first diverge (and whether that is at a near tie).
3. Per-token decode time: transformers' decode step over a StaticCache replayed as a CUDA
   graph, against the decoder binary's mean time per token (one recorded cuhal graph
   replayed per token). The graph is taken the first way that works, and the line says which:
   a manual capture (`torch.cuda.CUDAGraph`), else `torch.compile(mode="reduce-overhead")`
   (transformers' documented way to decode with CUDA graphs), else eager decode (no graph).

Exit status 0 when the logits and the argmax agree, 1 otherwise.

    python3 compare.py --model DIR --decoder PATH/TO/cuhal-decoder
"""

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import AutoConfig, LlamaForCausalLM


def load_model(directory, dtype, attention="eager"):
    """The model with `attention` as its attention implementation: "eager" (plain matmuls and
    softmax, the reference for the logits) or "sdpa" (transformers' default, what the timings
    use: the one a user runs for speed)."""
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    kwargs = dict(local_files_only=True, attn_implementation=attention)
    try:
        model = LlamaForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    except TypeError:
        model = LlamaForCausalLM.from_pretrained(directory, torch_dtype=dtype, **kwargs)
    return config, model.cuda().eval()


def run_decoder(binary, args):
    result = subprocess.run([binary] + args, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"cuhal-decoder {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def float32_logits(directory, tokens):
    """Teacher-forced logits of the model loaded in float32, or None if it cannot run."""
    try:
        _, model = load_model(directory, torch.float32)
        with torch.no_grad():
            ids = torch.tensor([tokens], device="cuda")
            logits = model(input_ids=ids).logits[0].float().cpu().numpy()
        del model
        torch.cuda.empty_cache()
        return logits
    except Exception as error:  # report, do not fail the comparison
        print(f"  transformers in float32 could not run: {type(error).__name__}: {error}")
        return None


def teacher_forcing(binary, directory, model, config, tokens, unit):
    with tempfile.TemporaryDirectory() as scratch:
        token_file = os.path.join(scratch, "tokens.txt")
        logits_file = os.path.join(scratch, "logits.f32")
        with open(token_file, "w") as f:
            f.write(",".join(map(str, tokens)))
        run_decoder(binary, ["--model", directory, "--teacher-force", token_file,
                             "--dump-logits", logits_file])
        ours = np.fromfile(logits_file, dtype="<f4").reshape(len(tokens), config.vocab_size)
    with torch.no_grad():
        ids = torch.tensor([tokens], device="cuda")
        theirs = model(input_ids=ids).logits[0].float().cpu().numpy()
    layers = config.num_hidden_layers
    ok = True
    strict = 0
    near_ties = []
    worst = (0.0, 0)
    for p in range(len(tokens)):
        scale = max(1.0, float(np.abs(theirs[p]).max()))
        tol = 8 * unit * (2 * layers + 2) * scale
        diff = float(np.abs(ours[p] - theirs[p]).max())
        if not np.isfinite(diff) or diff > tol:
            print(f"  position {p}: logits differ by {diff:.4g} > tolerance {tol:.4g}")
            ok = False
        if diff / tol > worst[0]:
            worst = (diff / tol, p)
        a, b = int(ours[p].argmax()), int(theirs[p].argmax())
        if a == b:
            strict += 1
        elif theirs[p][b] - theirs[p][a] <= tol:
            near_ties.append(p)
    print(f"teacher forcing, {len(tokens)} positions: worst logit error {worst[0]:.3f} of the "
          f"tolerance (position {worst[1]}); argmax agrees strictly on {strict} "
          f"({100 * strict / len(tokens):.1f}%), {len(near_ties)} more differ at near ties")
    # The arbiter of near ties: the same model in float32 (activations rounded to float32
    # only, as the decoder's are).
    settled = 0
    reference = float32_logits(directory, tokens)
    if reference is not None:
        truth = reference.argmax(axis=1)
        settled = sum(1 for p in near_ties if int(ours[p].argmax()) == int(truth[p]))
        print(f"  against transformers in float32: argmax agrees with cuhal on "
              f"{int((ours.argmax(axis=1) == truth).sum())} of {len(tokens)}, with transformers "
              f"in {model.dtype} on {int((theirs.argmax(axis=1) == truth).sum())}; "
              f"{settled} of the {len(near_ties)} near ties settled for cuhal")
    share = (strict + settled) / len(tokens)
    print(f"  argmax agreement {strict + settled} of {len(tokens)} ({100 * share:.1f}%)")
    if share < 0.99:
        print("  argmax agreement below 99%")
        ok = False
    return ok, tol


def greedy(binary, directory, model, prompt, count):
    result = run_decoder(binary, ["--model", directory, "--prompt-tokens",
                                  ",".join(map(str, prompt)), "--tokens", str(count)])
    ours = [int(t) for t in result.stdout.splitlines()[0].split(",")]
    theirs = []
    with torch.no_grad():
        ids = torch.tensor([prompt], device="cuda")
        out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        for _ in range(count):
            token = int(out.logits[0, -1].argmax())
            theirs.append(token)
            out = model(input_ids=torch.tensor([[token]], device="cuda"),
                        past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    first = next((i for i in range(count) if ours[i] != theirs[i]), None)
    if first is None:
        print(f"greedy generation of {count} tokens: identical")
    else:
        print(f"greedy generation of {count} tokens: first divergence at token {first} "
              f"(cuhal {ours[first]}, transformers {theirs[first]})")
    return ours, theirs, result.stderr


def make_static_cache(model, max_len):
    from transformers import StaticCache
    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": model.config, "max_cache_len": max_len}
    if "max_batch_size" in params:
        kwargs["max_batch_size"] = 1
    if "batch_size" in params:
        kwargs["batch_size"] = 1
    if "device" in params:
        kwargs["device"] = "cuda"
    if "dtype" in params:
        kwargs["dtype"] = model.dtype
    return StaticCache(**kwargs)


def graph_decode_time(model, prompt, steps):
    """Per-token time of transformers' decode step over a StaticCache, captured in one CUDA
    graph by hand and replayed (the step feeds its argmax back into its own input)."""
    max_len = len(prompt) + steps + 32
    cache = make_static_cache(model, max_len)
    with torch.no_grad():
        ids = torch.tensor([prompt], device="cuda")
        positions = torch.arange(len(prompt), device="cuda")
        out = model(input_ids=ids, past_key_values=cache, cache_position=positions, use_cache=True)
        token = out.logits[0, -1].argmax().view(1, 1).clone()
        position = torch.tensor([len(prompt)], device="cuda")

        def step():
            logits = model(input_ids=token, past_key_values=cache, cache_position=position,
                           use_cache=True).logits
            token.copy_(logits[0, -1].argmax().view(1, 1))
            position.add_(1)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        # The warm-up advanced the position by 3 (a capture runs nothing).
        position.fill_(len(prompt) + 3)
        for _ in range(4):
            graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        count = steps - 8
        start.record()
        for _ in range(count):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / count


def compiled_decode_time(model, prompt, steps):
    """Per-token time of transformers' decode step over a StaticCache under
    `torch.compile(mode="reduce-overhead")`, which replays CUDA graphs (the recipe of
    transformers' own documentation for static-cache decoding), host loop included."""
    max_len = len(prompt) + steps + 32
    cache = make_static_cache(model, max_len)

    def decode_one(token, cache_position):
        logits = model(input_ids=token, past_key_values=cache, cache_position=cache_position,
                       use_cache=True, return_dict=False)[0]
        return torch.argmax(logits[:, -1], dim=-1)[:, None]

    compiled = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        ids = torch.tensor([prompt], device="cuda")
        positions = torch.arange(len(prompt), device="cuda")
        out = model(input_ids=ids, past_key_values=cache, cache_position=positions, use_cache=True)
        token = out.logits[:, -1].argmax(dim=-1)[:, None]
        position = torch.tensor([len(prompt)], device="cuda")
        # Compilation and the graphs' recording.
        for _ in range(6):
            token = compiled(token.clone(), position)
            position += 1
        torch.cuda.synchronize()
        count = steps - 16
        started = time.perf_counter()
        for _ in range(count):
            token = compiled(token.clone(), position)
            position += 1
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / count * 1e3


def eager_decode_time(model, prompt):
    """Per-token time of transformers' eager decode (a dynamic cache, no graph)."""
    with torch.no_grad():
        ids = torch.tensor([prompt], device="cuda")
        out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        token = out.logits[0, -1].argmax().view(1, 1)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(64):
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = out.logits[0, -1].argmax().view(1, 1)
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / 64 * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--decoder", required=True, help="the cuhal-decoder binary")
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--generate", type=int, default=64)
    parser.add_argument("--time-steps", type=int, default=256)
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile timing (it compiles for a minute or two)")
    args = parser.parse_args()

    config = AutoConfig.from_pretrained(args.model, local_files_only=True)
    name = str(getattr(config, "torch_dtype", None) or getattr(config, "dtype", "float16"))
    dtype = torch.bfloat16 if "bfloat16" in name else torch.float16
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    config, model = load_model(args.model, dtype)
    print(f"model {args.model}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"vocab {config.vocab_size}, {dtype}; torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")

    rng = np.random.default_rng(1234)
    tokens = [int(t) for t in rng.integers(3, config.vocab_size, size=args.positions)]
    ok, _ = teacher_forcing(args.decoder, args.model, model, config, tokens, unit)

    prompt = tokens[:8]
    _, _, stderr = greedy(args.decoder, args.model, model, prompt, args.generate)

    result = run_decoder(args.decoder, ["--model", args.model, "--prompt-tokens",
                                        ",".join(map(str, prompt)), "--tokens",
                                        str(args.time_steps)])
    match = re.search(r"median ([0-9.]+) us, p99 ([0-9.]+) us", result.stderr)
    rate = re.search(r"([0-9.]+) tokens/s", result.stderr)
    if match and rate:
        print(f"cuhal-decoder: {1e3 / float(rate.group(1)):.4f} ms per token (mean over the "
              f"decode; per-step latency median {float(match.group(1)) / 1e3:.4f} ms, p99 "
              f"{float(match.group(2)) / 1e3:.4f} ms)")
    else:
        print(f"cuhal-decoder: no latency line in its output:\n{result.stderr}")
    # The timings run transformers' default attention (sdpa), the reference above eager's.
    del model
    torch.cuda.empty_cache()
    _, model = load_model(args.model, dtype, "sdpa")
    ways = [("CUDA graph captured by hand over a StaticCache, sdpa attention",
             lambda: graph_decode_time(model, prompt, args.time_steps))]
    if not args.no_compile:
        ways.append(('torch.compile(mode="reduce-overhead") over a StaticCache (CUDA graphs), '
                     'sdpa attention',
                     lambda: compiled_decode_time(model, prompt, args.time_steps)))
    ways.append(("eager decode (no graph), sdpa attention",
                 lambda: eager_decode_time(model, prompt)))
    for how, measure in ways:
        try:
            ms = measure()
        except Exception as error:  # report, try the next way; never fail the comparison
            print(f"transformers, {how}: could not be timed: {type(error).__name__}: "
                  f"{str(error).splitlines()[0] if str(error) else ''}")
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            continue
        print(f"transformers, {how}: {ms:.4f} ms per token")
        break

    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
