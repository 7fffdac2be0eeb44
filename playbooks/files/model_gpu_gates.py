#!/usr/bin/env python3
"""The GPU-only admission gates of a model (playbooks/model-gpu-gates.yml; docs/models.md "GPU gates").

Runs under the Python of a virtualenv that has the serving vLLM version (and so torch); prints one JSON
object on stdout, which the playbook asserts on. Subcommands:

  offline  load the model in fp16 on the GPU(s), generate, then one request that fills the whole context
           (--context-tokens, prompt plus generated tokens): passes when neither fails nor runs out of memory
  mmlu     accuracy on an MMLU subset (the original CSV layout: DIR/test/<subject>_test.csv and, for the
           k-shot examples, DIR/dev/<subject>_dev.csv), scored on the next-token log-probabilities of A-D
  soak     --concurrency clients sending completions to a running vLLM OpenAI server for --seconds, sampling
           vllm:num_requests_waiting from its /metrics: passes when no request failed and the waiting queue
           never exceeded --max-waiting

Standard library only, apart from vllm and torch where the subcommand needs them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

FILLER = (
    "The weights of a large language model must arrive complete, verified and readable. "
    "大语言模型的权重必须完整、可验证、可读取。"
)


def _emit(result: dict[str, Any]) -> int:
    print(json.dumps(result))
    return 0


def _is_oom(exc: BaseException) -> bool:
    return "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"


def _generate_ids(llm: Any, ids: list[int], params: Any) -> Any:
    """vLLM >= 0.5 takes {"prompt_token_ids": ...}; 0.4 takes the prompt_token_ids keyword."""
    try:
        return llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    except (TypeError, ValueError, AttributeError):
        return llm.generate(prompt_token_ids=[ids], sampling_params=params, use_tqdm=False)


def cmd_offline(args: argparse.Namespace) -> int:
    import torch
    from vllm import LLM, SamplingParams

    result: dict[str, Any] = {"fp16_load": {"passed": False}, "context": {"passed": False}}
    started = time.monotonic()
    try:
        llm = LLM(
            model=args.model,
            dtype="float16",
            max_model_len=args.context_tokens,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
        )
        out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=16, temperature=0.0))
        text = out[0].outputs[0].text
        result["fp16_load"] = {
            "passed": bool(text.strip()),
            "seconds": round(time.monotonic() - started, 1),
            "sample": text[:200],
            "message": "loaded in fp16 and generated" if text.strip() else "loaded, but generated nothing",
        }
    except Exception as exc:
        result["fp16_load"] = {"passed": False, "message": f"{type(exc).__name__}: {exc}"[-2000:]}
        result["context"] = {"passed": False, "message": "not run: the model did not load"}
        return _emit(result)
    tokenizer = llm.get_tokenizer()
    generate = 16
    prompt_len = args.context_tokens - generate
    ids: list[int] = []
    while len(ids) < prompt_len:
        ids += tokenizer.encode(FILLER, add_special_tokens=False)
    ids = ids[:prompt_len]
    torch.cuda.reset_peak_memory_stats()
    try:
        out = _generate_ids(llm, ids, SamplingParams(max_tokens=generate, temperature=0.0, ignore_eos=True))
        produced = len(out[0].outputs[0].token_ids)
        result["context"] = {
            "passed": produced == generate,
            "prompt_tokens": len(ids),
            "generated_tokens": produced,
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "message": f"{len(ids)} + {produced} tokens without running out of memory",
        }
    except Exception as exc:
        what = "out of memory" if _is_oom(exc) else "failed"
        result["context"] = {"passed": False, "message": f"{what}: {type(exc).__name__}: {exc}"[-2000:]}
    return _emit(result)


def _mmlu_rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [row for row in csv.reader(f) if len(row) == 6]


def _mmlu_prompt(subject: str, shots: list[list[str]], row: list[str]) -> str:
    def block(r: list[str], answer: bool) -> str:
        text = r[0] + "".join(f"\n{letter}. {choice}" for letter, choice in zip("ABCD", r[1:5], strict=True))
        return text + "\nAnswer:" + (f" {r[5]}\n\n" if answer else "")

    head = (
        f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    )
    return head + "".join(block(s, True) for s in shots) + block(row, False)


def cmd_mmlu(args: argparse.Namespace) -> int:
    from vllm import LLM, SamplingParams

    root = Path(args.mmlu_dir)
    llm = LLM(
        model=args.model,
        dtype="float16",
        quantization=args.quantization or None,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    tokenizer = llm.get_tokenizer()
    letter_ids = {letter: tokenizer.encode(f" {letter}", add_special_tokens=False)[-1] for letter in "ABCD"}
    prompts, answers, subjects = [], [], []
    for subject in args.subjects:
        test = root / "test" / f"{subject}_test.csv"
        if not test.is_file():
            return _emit({"passed": False, "message": f"{test}: MMLU test file missing"})
        dev = root / "dev" / f"{subject}_dev.csv"
        shots = _mmlu_rows(dev)[: args.shots] if dev.is_file() else []
        for row in _mmlu_rows(test)[: args.per_subject]:
            prompts.append(_mmlu_prompt(subject, shots, row))
            answers.append(row[5].strip())
            subjects.append(subject)
    outputs = llm.generate(
        prompts, SamplingParams(max_tokens=1, temperature=0.0, logprobs=20), use_tqdm=False
    )
    correct = 0
    per_subject: dict[str, list[int]] = {}
    for output, answer, subject in zip(outputs, answers, subjects, strict=True):
        top = output.outputs[0].logprobs[0] if output.outputs[0].logprobs else {}

        def score(token_id: int, top: Any = top) -> float:
            value = top.get(token_id)
            return float(getattr(value, "logprob", value)) if value is not None else float("-inf")

        scores = {letter: score(token_id) for letter, token_id in letter_ids.items()}
        choice = max(scores, key=lambda k: scores[k])
        if scores[choice] == float("-inf"):
            choice = output.outputs[0].text.strip()[:1]
        hit = int(choice == answer)
        correct += hit
        per_subject.setdefault(subject, []).append(hit)
    accuracy = 100.0 * correct / max(1, len(answers))
    return _emit(
        {
            "passed": True,
            "model": args.model,
            "questions": len(answers),
            "accuracy": round(accuracy, 2),
            "per_subject": {s: round(100.0 * sum(h) / len(h), 1) for s, h in per_subject.items()},
        }
    )


def _waiting(metrics_url: str) -> float | None:
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    values = re.findall(r"^vllm:num_requests_waiting(?:\{[^}]*\})? ([0-9.eE+-]+)$", text, flags=re.M)
    return sum(float(v) for v in values) if values else None


def cmd_soak(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.seconds
    latencies: list[float] = []
    errors: list[str] = []
    waiting: list[float] = []
    lock = threading.Lock()
    body = json.dumps(
        {"model": args.model_name, "prompt": FILLER * 4, "max_tokens": args.max_tokens, "temperature": 0.7}
    ).encode()

    def client() -> None:
        while time.monotonic() < deadline:
            request = urllib.request.Request(
                args.url.rstrip("/") + "/v1/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=args.request_timeout) as response:
                    response.read()
                with lock:
                    latencies.append(time.monotonic() - started)
            except Exception as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")

    def sampler() -> None:
        while time.monotonic() < deadline:
            value = _waiting(args.url.rstrip("/") + "/metrics")
            if value is not None:
                waiting.append(value)
            time.sleep(args.sample_interval)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.concurrency)]
    threads.append(threading.Thread(target=sampler, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=args.seconds + args.request_timeout + 30)
    ordered = sorted(latencies)
    max_waiting = max(waiting) if waiting else None
    passed = bool(ordered) and not errors and max_waiting is not None and max_waiting <= args.max_waiting
    return _emit(
        {
            "passed": passed,
            "requests": len(ordered),
            "errors": len(errors),
            "first_errors": errors[:5],
            "max_waiting": max_waiting,
            "mean_waiting": round(statistics.fmean(waiting), 2) if waiting else None,
            "samples": len(waiting),
            "p50_s": round(ordered[len(ordered) // 2], 3) if ordered else None,
            "p99_s": round(ordered[int(len(ordered) * 0.99)], 3) if ordered else None,
            "message": (
                "no vllm:num_requests_waiting samples from /metrics"
                if max_waiting is None
                else f"{len(ordered)} requests, {len(errors)} errors, at most {max_waiting:g} waiting"
            ),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("offline", "mmlu"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True)
        p.add_argument("--tensor-parallel-size", type=int, default=1)
        p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    offline, mmlu = sub.choices["offline"], sub.choices["mmlu"]
    offline.add_argument("--context-tokens", type=int, default=2048)
    mmlu.add_argument("--mmlu-dir", required=True)
    mmlu.add_argument("--subjects", nargs="+", required=True)
    mmlu.add_argument("--per-subject", type=int, default=50)
    mmlu.add_argument("--shots", type=int, default=5)
    mmlu.add_argument("--quantization", default="", help="e.g. gptq; empty: what the model's config says")
    mmlu.add_argument("--max-model-len", type=int, default=4096)
    soak = sub.add_parser("soak")
    soak.add_argument("--url", required=True)
    soak.add_argument("--model-name", required=True)
    soak.add_argument("--concurrency", type=int, default=100)
    soak.add_argument("--seconds", type=int, default=1800)
    soak.add_argument("--max-tokens", type=int, default=128)
    soak.add_argument("--max-waiting", type=float, default=5)
    soak.add_argument("--request-timeout", type=float, default=300)
    soak.add_argument("--sample-interval", type=float, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return {"offline": cmd_offline, "mmlu": cmd_mmlu, "soak": cmd_soak}[args.command](args)
    except Exception as exc:  # one JSON answer for the playbook, whatever happened
        return _emit(
            {"passed": False, "message": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        )


if __name__ == "__main__":
    sys.exit(main())
