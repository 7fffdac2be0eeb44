"""`vllm-sim-openai-api-server`: `python3 -m vllm.entrypoints.openai.api_server` of vLLM 0.4.2 (the image the
serving stage runs) as far as its command line and start-up checks go, then the simulator.

The lab's model server (serve/tools/Containerfile.lab) runs the product's StatefulSet unchanged with it:
- the arguments are parsed as 0.4.2's argparse parses them: the same names, short forms, types, defaults and
  choices, so an unknown or malformed one exits 2 with argparse's message;
- what 0.4.2 refuses before it serves is refused in the same order with the same exception: Python's last
  stderr line `<exception>: <message>` and exit status 1, vLLM's log lines on stdout in its logger's format.

Read from the vllm 0.4.2 wheel: vllm/entrypoints/openai/{cli_args,api_server}.py, vllm/engine/arg_utils.py,
vllm/config.py (ModelConfig, CacheConfig, ParallelConfig, SchedulerConfig, EngineConfig), vllm/utils.py
(find_nccl_library, find_library), vllm/distributed/device_communicators/pynccl{,_utils}.py, vllm/executor/
ray_utils.py (initialize_ray_cluster), vllm/worker/worker_base.py; the config.json messages from transformers
4.40 (utils/hub.py cached_file, configuration_utils.py), and "No CUDA GPUs are available" from torch's
c10/cuda/CUDAFunctions.cpp. The `where` of each log line is 0.4.2's file and line.

Not simulated: what 0.4.2 checks only once it loads the tokenizer, the weights or the GPUs (an unsupported
architecture, unreadable shards, out of memory), the CPU swap-space check (it reads the host's memory), LoRA,
speculative decoding and quantization settings (parsed, not checked), and `--host` unset binds 0.0.0.0 only
(0.4.2 binds every IPv4 and IPv6 address).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from .cli import serve_until_stopped
from .engine import VLLM_METRICS_VERSION, SimConfig

# The release whose command line and start-up checks these are: the one whose metrics the simulator serves.
VLLM_VERSION = VLLM_METRICS_VERSION

# vllm/model_executor/layers/quantization/__init__.py's QUANTIZATION_METHODS at 0.4.2, in its order
QUANTIZATION_METHODS = ("aqlm", "awq", "fp8", "gptq", "squeezellm", "gptq_marlin", "marlin")

# The config.json keys 0.4.2 derives a model's length from (config.py, _get_and_verify_max_len); the smallest
# wins.
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)

# torch 2.3.0, which 0.4.2 pins, is built for CUDA 12.1: vllm-nccl-cu12's copy is looked for under cu12.
CUDA_MAJOR = "12"

# huggingface_hub's rule for a repo id; a model path that breaks it is refused before any lookup.
_REPO_ID = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]+\b$")


class Refusal(Exception):
    """The exception 0.4.2 ends with at start (`name` is its type): uncaught, so Python prints it last."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


@dataclass(frozen=True)
class Plan:
    """What the simulator serves once every check passed."""

    served_model_names: list[str]
    max_model_len: int
    max_num_seqs: int
    host: str
    port: int
    uvicorn_log_level: str


def log(level: str, where: str, message: str) -> None:
    """A line as 0.4.2's logger writes it (vllm/logger.py: level, %m-%d %H:%M:%S, file:line, on stdout)."""
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} {where}] {message}", flush=True)


def nullable_str(value: str) -> str | None:
    """0.4.2's type for optional text arguments: empty or "None" means none."""
    return None if not value or value == "None" else value


def make_arg_parser() -> argparse.ArgumentParser:
    """0.4.2's parser: the server's arguments (cli_args.py), then the engine's (arg_utils.py EngineArgs, then
    AsyncEngineArgs). prog is the module file's name, as `python3 -m` makes it."""
    parser = argparse.ArgumentParser(
        prog="api_server.py",
        description=f"vLLM OpenAI-Compatible RESTful API server (vllm-sim: vLLM {VLLM_VERSION}'s arguments "
        "and start-up checks, then the simulator).",
    )

    def text(name: str, default: str | None = None, **extra: Any) -> None:
        parser.add_argument(name, type=nullable_str, default=default, **extra)

    def number(*names: str, kind: type = int, default: float | None = None, **extra: Any) -> None:
        parser.add_argument(*names, type=kind, default=default, **extra)

    def choice(name: str, default: str, choices: list[str]) -> None:
        parser.add_argument(name, type=str, default=default, choices=choices)

    def flag(name: str) -> None:
        parser.add_argument(name, action="store_true")

    # the server
    text("--host")
    number("--port", default=8000)
    choice("--uvicorn-log-level", "info", ["debug", "info", "warning", "error", "critical", "trace"])
    flag("--allow-credentials")
    for name in ("--allowed-origins", "--allowed-methods", "--allowed-headers"):
        parser.add_argument(name, type=json.loads, default=["*"])
    text("--api-key")
    text("--lora-modules", nargs="+")  # name=path each; the simulator has no LoRA
    text("--chat-template")
    text("--response-role", "assistant")
    for name in ("--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs"):
        text(name)
    number("--ssl-cert-reqs", default=0)  # ssl.CERT_NONE
    text("--root-path")
    parser.add_argument("--middleware", type=nullable_str, action="append", default=[])
    # the model
    parser.add_argument("--model", type=str, default="facebook/opt-125m")
    text("--tokenizer")
    flag("--skip-tokenizer-init")
    for name in ("--revision", "--code-revision", "--tokenizer-revision"):
        text(name)
    choice("--tokenizer-mode", "auto", ["auto", "slow"])
    flag("--trust-remote-code")
    text("--download-dir")
    choice("--load-format", "auto", ["auto", "pt", "safetensors", "npcache", "dummy", "tensorizer"])
    choice("--dtype", "auto", ["auto", "half", "float16", "bfloat16", "float", "float32"])
    choice("--kv-cache-dtype", "auto", ["auto", "fp8"])
    text("--quantization-param-path")
    number("--max-model-len")
    choice("--guided-decoding-backend", "outlines", ["outlines", "lm-format-enforcer"])
    # parallelism
    flag("--worker-use-ray")
    number("--pipeline-parallel-size", "-pp", default=1)
    number("--tensor-parallel-size", "-tp", default=1)
    number("--max-parallel-loading-workers")
    flag("--ray-workers-use-nsight")
    # the KV cache and the scheduler
    number("--block-size", default=16, choices=[8, 16, 32])
    flag("--enable-prefix-caching")
    flag("--use-v2-block-manager")
    number("--num-lookahead-slots", default=0)
    number("--seed", default=0)
    number("--swap-space", default=4)
    number("--gpu-memory-utilization", kind=float, default=0.9)
    number("--num-gpu-blocks-override")
    number("--max-num-batched-tokens")
    number("--max-num-seqs", default=256)
    number("--max-logprobs", default=5)
    flag("--disable-log-stats")
    parser.add_argument("--quantization", "-q", type=nullable_str, choices=[*QUANTIZATION_METHODS, None])
    flag("--enforce-eager")
    number("--max-context-len-to-capture")
    number("--max-seq_len-to-capture", default=8192)  # sic: 0.4.2 spells it with an underscore
    flag("--disable-custom-all-reduce")
    number("--tokenizer-pool-size", default=0)
    parser.add_argument("--tokenizer-pool-type", type=str, default="ray")
    text("--tokenizer-pool-extra-config")
    # LoRA
    flag("--enable-lora")
    number("--max-loras", default=1)
    number("--max-lora-rank", default=16)
    number("--lora-extra-vocab-size", default=256)
    choice("--lora-dtype", "auto", ["auto", "float16", "bfloat16", "float32"])
    number("--max-cpu-loras")
    flag("--fully-sharded-loras")
    choice("--device", "auto", ["auto", "cuda", "neuron", "cpu"])
    # vision-language models
    text("--image-input-type", choices=["pixel_values", "image_features"])
    number("--image-token-id")
    text("--image-input-shape")
    number("--image-feature-size")
    number("--scheduler-delay-factor", kind=float, default=0.0)
    flag("--enable-chunked-prefill")
    # speculative decoding
    text("--speculative-model")
    number("--num-speculative-tokens")
    number("--speculative-max-model-len")
    number("--ngram-prompt-lookup-max")
    number("--ngram-prompt-lookup-min")
    text("--model-loader-extra-config")
    parser.add_argument("--served-model-name", nargs="+", type=str, default=None)
    # AsyncEngineArgs
    flag("--engine-use-ray")
    flag("--disable-log-requests")
    number("--max-log-len")
    return parser


def read_hf_config(model: str) -> dict[str, Any]:
    """config.json of the model directory, refused as transformers' AutoConfig.from_pretrained refuses it
    (HF_HUB_OFFLINE=1 in the product's pod: nothing is fetched)."""
    path = os.path.join(model, "config.json")
    if not os.path.isdir(model):
        if not _REPO_ID.match(model):
            raise Refusal(
                "OSError",
                f"Incorrect path_or_model_id: '{model}'. Please provide either the path to a local folder or "
                "the repo_id of a model on the Hub.",
            )
        raise Refusal(
            "OSError",
            "We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the "
            f"cached files and it looks like {model} is not the path to a directory containing a file named "
            "config.json.\nCheckout your internet connection or see how to run the library in offline mode "
            "at 'https://huggingface.co/docs/transformers/installation#offline-mode'.",
        )
    if not os.path.isfile(path):
        raise Refusal(
            "OSError",
            f"{model} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{model}/tree/None' for available files.",
        )
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError):
        config = None
    except OSError as exc:  # PermissionError for uid 1001 on a root-only file: transformers lets it through
        raise Refusal(type(exc).__name__, str(exc)) from exc
    if not isinstance(config, dict):
        raise Refusal("OSError", f"It looks like the config file at '{path}' is not a valid JSON file.")
    return config


def verify_max_model_len(config: dict[str, Any], requested: int | None) -> int:
    """The model's length from config.json (the smallest of LENGTH_KEYS, times a RoPE scaling factor), or the
    requested one if not above it (or not above config.json's model_max_length)."""
    derived: float = math.inf
    key = None
    for name in LENGTH_KEYS:
        value = config.get(name)
        if value is not None and value < derived:
            derived, key = value, name
    if derived == math.inf:
        if requested is not None:
            return requested
        derived = 2048  # 0.4.2's assumption for a config without any of the keys
    scaling = config.get("rope_scaling")
    if scaling is not None and scaling.get("type") != "su":
        if scaling.get("type") == "yarn":
            derived = scaling["original_max_position_embeddings"]
        derived *= scaling["factor"]
    if requested is None:
        return int(derived)
    model_max_length = config.get("model_max_length")
    if requested > derived and (model_max_length is None or requested > model_max_length):
        raise Refusal(
            "ValueError",
            f"User-specified max_model_len ({requested}) is greater than the derived max_model_len "
            f"({key}={derived} or model_max_length={model_max_length} in model's config.json). This may lead "
            "to incorrect model outputs or CUDA errors. Make sure the value is correct and within the model "
            "context size.",
        )
    return requested


def visible_gpus() -> int:
    """GPUs in the container: the ones the NVIDIA runtime was asked to inject, NVIDIA_VISIBLE_DEVICES (set
    from the device plugin's Allocate). Unset, empty, "void" or "none": none; "all": each /dev/nvidiaN."""
    value = os.environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value in ("", "void", "none"):
        return 0
    if value == "all":
        return len(glob.glob("/dev/nvidia[0-9]*"))
    return len([device for device in value.split(",") if device.strip()])


def ldconfig_listing() -> str:
    """The dynamic linker's cache, `/sbin/ldconfig -p`, where 0.4.2 looks for libnccl.so.2."""
    if not os.path.exists("/sbin/ldconfig"):
        return ""
    return subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, check=False).stdout


def find_library(name: str) -> str:
    """The first `name` in the linker's cache, else in LD_LIBRARY_PATH's directories."""
    for line in ldconfig_listing().splitlines():
        if name in line:
            return line.split()[-1]
    search_path = os.environ.get("LD_LIBRARY_PATH")
    for directory in search_path.split(":") if search_path else []:
        if os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    raise ValueError(f"Cannot find {name} in the system.")


def find_nccl_library() -> str:
    """The NCCL 0.4.2 loads: VLLM_NCCL_SO_PATH if set; else vllm-nccl-cu12's copy under the RUNNING user's
    config root ($VLLM_CONFIG_ROOT, $XDG_CONFIG_HOME or ~/.config; it is under the installing user's, root's,
    and glob sees nothing in a directory it cannot read); else libnccl.so.2 from the library paths."""
    configured = os.environ.get("VLLM_NCCL_SO_PATH")
    root = (
        os.environ.get("VLLM_CONFIG_ROOT")
        or os.environ.get("XDG_CONFIG_HOME")
        or os.path.expanduser("~/.config")
    )
    managed = sorted(glob.glob(os.path.expanduser(f"{root}/vllm/nccl/cu{CUDA_MAJOR}/libnccl.so.*")))
    if configured:
        log("INFO", "utils.py:650", f"Found nccl from environment variable VLLM_NCCL_SO_PATH={configured}")
        return configured
    found = managed[0] if managed else find_library("libnccl.so.2")
    log("INFO", "utils.py:660", f"Found nccl from library {found}")
    return found


def import_pynccl() -> str | None:
    """What importing 0.4.2's pynccl (every worker does) logs; returns why NCCL could not be loaded, or
    None. A stand-in library loads when it is a file this user can read (0.4.2 runs `ldd` on it, then
    dlopens it)."""
    try:
        so_file = find_nccl_library()
    except ValueError as exc:
        reason = str(exc)
    else:
        if os.path.isfile(so_file) and os.access(so_file, os.R_OK):
            return None
        reason = f"Failed to load NCCL library from {so_file} ."
        log(
            "ERROR",
            "pynccl.py:45",
            f"Failed to load NCCL library from {so_file} .It is expected if you are not running on "
            "NVIDIA/AMD GPUs.Otherwise, the nccl library might not exist, be corrupted or it does not "
            f"support the current platform {platform.platform()}.One solution is to download libnccl2 "
            "version 2.18 from https://developer.download.nvidia.com/compute/cuda/repos/ and extract the "
            "libnccl.so.2 file. If you already have the library, please set the environment variable "
            "VLLM_NCCL_SO_PATH to point to the correct nccl library path.",
        )
    log("INFO", "pynccl_utils.py:17", f"Failed to import NCCL library: {reason}")
    log("INFO", "pynccl_utils.py:18", "It is expected if you are not running on NVIDIA GPUs.")
    return reason


def start_up(args: argparse.Namespace) -> Plan:
    """0.4.2's start, in its order, up to where it would load the model: raises the Refusal it ends with."""
    log("INFO", "api_server.py:160", f"vLLM API server version {VLLM_VERSION}")
    log("INFO", "api_server.py:161", f"args: {args}")
    # ModelConfig
    if args.max_context_len_to_capture is not None:
        raise Refusal(
            "ValueError", "`max_context_len_to_capture` is deprecated. Use `max_seq_len_to_capture` instead."
        )
    config = read_hf_config(args.model)
    max_model_len = verify_max_model_len(config, args.max_model_len)
    # CacheConfig
    if args.gpu_memory_utilization > 1.0:
        raise Refusal(
            "ValueError", f"GPU memory utilization must be less than 1.0. Got {args.gpu_memory_utilization}."
        )
    # ParallelConfig: more than one GPU always runs the workers on Ray
    if args.pipeline_parallel_size > 1:
        raise Refusal("NotImplementedError", "Pipeline parallelism is not supported yet.")
    world_size = args.pipeline_parallel_size * args.tensor_parallel_size
    # SchedulerConfig
    batched = args.max_num_batched_tokens
    if batched is None:
        batched = 512 if args.enable_chunked_prefill else max(max_model_len, 2048)
    if batched < max_model_len and not args.enable_chunked_prefill:
        raise Refusal(
            "ValueError",
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}). This "
            "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
            "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.",
        )
    if batched < args.max_num_seqs:
        raise Refusal(
            "ValueError",
            f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
            f"({args.max_num_seqs}).",
        )
    # EngineConfig
    heads = config.get("num_attention_heads")
    if isinstance(heads, int) and heads % args.tensor_parallel_size != 0:
        raise Refusal(
            "ValueError",
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel size "
            f"({args.tensor_parallel_size}).",
        )
    # the executor: Ray counts the GPUs for its placement group before the workers start; one GPU without
    # Ray fails in torch when the worker selects its device. Each worker imports pynccl; with more than one
    # GPU the workers then set up NCCL, which is not defined if the import failed.
    gpus = visible_gpus()
    if args.worker_use_ray or world_size > 1:
        if world_size > gpus:
            raise Refusal(
                "ValueError",
                "The number of required GPUs exceeds the total number of available GPUs in the cluster.",
            )
        if import_pynccl() is not None and world_size > 1:
            log(
                "ERROR",
                "worker_base.py:145",
                "Error executing method init_device. This might cause deadlock in distributed execution.",
            )
            raise Refusal("NameError", "name 'ncclGetVersion' is not defined")
    else:
        import_pynccl()
        if gpus == 0:
            raise Refusal("RuntimeError", "No CUDA GPUs are available")
    return Plan(
        served_model_names=args.served_model_name or [args.model],
        max_model_len=max_model_len,
        max_num_seqs=args.max_num_seqs,
        host=args.host or "0.0.0.0",
        port=args.port,
        uvicorn_log_level=args.uvicorn_log_level,
    )


def main(argv: list[str] | None = None) -> int:
    args = make_arg_parser().parse_args(argv)
    try:
        plan = start_up(args)
    except Refusal as refusal:
        print(f"{refusal.name}: {refusal.message}", file=sys.stderr, flush=True)
        return 1
    config = SimConfig(
        served_models=plan.served_model_names,
        max_model_len=plan.max_model_len,
        max_num_seqs=plan.max_num_seqs,
    )
    serve_until_stopped(config, plan.host, plan.port, plan.uvicorn_log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
