"""`vllm-sim-openai-api-server`: vLLM 0.4.2's OpenAI server command line and what it refuses at start, then
the simulator. Each refusal is checked for its exit status and its last stderr line (the exception as
Python prints it); the product's command line is accepted and served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from gwtest import wait_for
from vllm_sim import openai_api_server

GPUS = "GPU-0b7f4c2e-5a1d-4e8f-9c3b-000000000001,GPU-0b7f4c2e-5a1d-4e8f-9c3b-000000000002"
NCCL_NOT_FOUND = "Cannot find libnccl.so.2 in the system."


def product_args(model: Path) -> list[str]:
    """The container args of roles/vllm_serving/templates/statefulset.yml.j2 as the role renders them with its
    defaults (2 GPUs per replica) for a model with served_model_name qwen2-7b-instruct; only --model points at
    the test's directory instead of the pod's /model mount. Keep in step with that template."""
    return [
        f"--model={model}",
        "--served-model-name=qwen2-7b-instruct",
        "--tensor-parallel-size=2",
        "--max-model-len=8192",
        "--max-num-batched-tokens=8192",
        "--max-num-seqs=256",
        "--gpu-memory-utilization=0.9",
        "--host=0.0.0.0",
        "--port=8000",
        "--disable-log-requests",
    ]


def qwen2_config(**changes: Any) -> dict[str, Any]:
    """The parts of a Qwen2-7B-Instruct config.json that vLLM 0.4.2 reads at start."""
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(qwen2_config()))
    return directory


@pytest.fixture
def nccl(tmp_path: Path) -> Path:
    """A readable file where VLLM_NCCL_SO_PATH points (the lab image's stand-in for torch's NCCL)."""
    path = tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"stand-in")
    return path


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nccl: Path) -> dict[str, str]:
    """The product's pod: two GPUs allocated, HOME=/tmp-like, VLLM_NCCL_SO_PATH set; no NCCL anywhere else."""
    for name in ("NVIDIA_VISIBLE_DEVICES", "VLLM_NCCL_SO_PATH", "VLLM_CONFIG_ROOT", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    values = {"NVIDIA_VISIBLE_DEVICES": GPUS, "VLLM_NCCL_SO_PATH": str(nccl), "HOME": str(home)}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(openai_api_server, "ldconfig_listing", lambda: "")
    return values


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """Run the entrypoint, which must refuse: (its last stderr line, its stdout: vLLM's log lines)."""
    assert openai_api_server.main(argv) == 1
    captured = capsys.readouterr()
    return captured.err.strip().splitlines()[-1], captured.out


def test_the_product_command_line_is_accepted(model: Path, env: dict[str, str]) -> None:
    args = openai_api_server.make_arg_parser().parse_args(product_args(model))
    plan = openai_api_server.start_up(args)
    assert plan.served_model_names == ["qwen2-7b-instruct"]
    assert (plan.max_model_len, plan.max_num_seqs, plan.host, plan.port) == (8192, 256, "0.0.0.0", 8000)


def test_the_0_4_2_defaults_and_names(model: Path) -> None:
    parser = openai_api_server.make_arg_parser()
    args = parser.parse_args([])
    assert (args.model, args.served_model_name, args.max_model_len, args.max_num_batched_tokens) == (
        "facebook/opt-125m",
        None,
        None,
        None,
    )
    assert (args.tensor_parallel_size, args.gpu_memory_utilization, args.max_num_seqs) == (1, 0.9, 256)
    assert (args.host, args.port, args.uvicorn_log_level, args.swap_space) == (None, 8000, "info", 4)
    # names exactly as 0.4.2 spells them, its short forms and its odd underscore included
    short = parser.parse_args(["-tp", "2", "-pp", "1", "--max-seq_len-to-capture", "4096", "-q", "awq"])
    assert (short.tensor_parallel_size, short.max_seq_len_to_capture, short.quantization) == (2, 4096, "awq")
    two = parser.parse_args(["--served-model-name", "a", "b", "--host", "None"])
    assert two.served_model_name == ["a", "b"] and two.host is None


def test_an_unknown_argument_exits_2_as_argparse_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        openai_api_server.main(["--model=/model", "--max-model-length=4096"])
    assert exit_.value.code == 2
    assert "api_server.py: error: unrecognized arguments: --max-model-length=4096" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        openai_api_server.main(["--max-model-len=8k"])
    assert exit_.value.code == 2
    assert "argument --max-model-len: invalid int value: '8k'" in capsys.readouterr().err


def test_no_config_json_is_refused(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (model / "config.json").unlink()
    line, _ = refused(product_args(model), capsys)
    assert line == (
        f"OSError: {model} does not appear to have a file named config.json. "
        f"Checkout 'https://huggingface.co/{model}/tree/None' for available files."
    )


def test_a_missing_model_directory_is_refused(
    tmp_path: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    line, _ = refused(product_args(tmp_path / "absent"), capsys)
    assert line == (
        f"OSError: Incorrect path_or_model_id: '{tmp_path / 'absent'}'. Please provide either the path to a "
        "local folder or the repo_id of a model on the Hub."
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 0000")
def test_an_unreadable_config_json_is_refused_non_root(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (model / "config.json").chmod(0)
    line, _ = refused(product_args(model), capsys)
    assert line == f"PermissionError: [Errno 13] Permission denied: '{model / 'config.json'}'"


def test_an_unreadable_config_json_is_refused(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same as the non-root test above, on machines where the tests run as root (CI): the read fails the
    way it does for uid 1001."""
    real_open = open

    def open_as_uid_1001(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(model / "config.json"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", open_as_uid_1001)
    line, _ = refused(product_args(model), capsys)
    assert line == f"PermissionError: [Errno 13] Permission denied: '{model / 'config.json'}'"


def test_a_config_json_that_is_not_json_is_refused(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (model / "config.json").write_text("{not json")
    line, _ = refused(product_args(model), capsys)
    assert (
        line
        == f"OSError: It looks like the config file at '{model / 'config.json'}' is not a valid JSON file."
    )


def test_max_model_len_above_the_model_s_is_refused(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (model / "config.json").write_text(json.dumps(qwen2_config(max_position_embeddings=4096)))
    line, _ = refused(product_args(model), capsys)
    assert line == (
        "ValueError: User-specified max_model_len (8192) is greater than the derived max_model_len "
        "(max_position_embeddings=4096 or model_max_length=None in model's config.json). This may lead to "
        "incorrect model outputs or CUDA errors. Make sure the value is correct and within the model context "
        "size."
    )


def test_max_model_len_within_rope_scaling_or_model_max_length_is_accepted(
    model: Path, env: dict[str, str]
) -> None:
    parser = openai_api_server.make_arg_parser()
    scaled = qwen2_config(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 2.0})
    (model / "config.json").write_text(json.dumps(scaled))
    assert openai_api_server.start_up(parser.parse_args(product_args(model))).max_model_len == 8192
    (model / "config.json").write_text(
        json.dumps(qwen2_config(max_position_embeddings=4096, model_max_length=8192))
    )
    assert openai_api_server.start_up(parser.parse_args(product_args(model))).max_model_len == 8192
    # without --max-model-len (and --max-num-batched-tokens), the model's own length
    (model / "config.json").write_text(json.dumps(qwen2_config(max_position_embeddings=2048)))
    args = parser.parse_args([f"--model={model}", "-tp", "2"])
    assert openai_api_server.start_up(args).max_model_len == 2048


@pytest.mark.parametrize(
    ("batched", "seqs", "message"),
    [
        (
            4096,
            256,
            "ValueError: max_num_batched_tokens (4096) is smaller than max_model_len (8192). This "
            "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
            "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.",
        ),
        (
            8192,
            10000,
            "ValueError: max_num_batched_tokens (8192) must be greater than or equal to max_num_seqs "
            "(10000).",
        ),
    ],
    ids=["below-max-model-len", "below-max-num-seqs"],
)
def test_max_num_batched_tokens_too_small_is_refused(
    model: Path,
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    batched: int,
    seqs: int,
    message: str,
) -> None:
    line, _ = refused(
        [*product_args(model), f"--max-num-batched-tokens={batched}", f"--max-num-seqs={seqs}"], capsys
    )
    assert line == message


def test_gpu_memory_utilization_above_1_is_refused(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    line, _ = refused([*product_args(model), "--gpu-memory-utilization=1.5"], capsys)
    assert line == "ValueError: GPU memory utilization must be less than 1.0. Got 1.5."


def test_attention_heads_not_divisible_by_tensor_parallelism_are_refused(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (model / "config.json").write_text(json.dumps(qwen2_config(num_attention_heads=7)))
    line, _ = refused(product_args(model), capsys)
    assert (
        line
        == "ValueError: Total number of attention heads (7) must be divisible by tensor parallel size (2)."
    )


@pytest.mark.parametrize("value", [None, "", "void", "none"], ids=["unset", "empty", "void", "none"])
def test_no_gpu_is_refused(
    model: Path,
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str | None,
) -> None:
    if value is None:
        monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES")
    else:
        monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", value)
    single = [*product_args(model), "--tensor-parallel-size=1"]
    line, _ = refused(single, capsys)
    assert line == "RuntimeError: No CUDA GPUs are available"
    # with tensor parallelism, Ray finds no GPU for its placement group first
    line, _ = refused(product_args(model), capsys)
    assert line == (
        "ValueError: The number of required GPUs exceeds the total number of available GPUs in the cluster."
    )


def test_more_tensor_parallelism_than_visible_gpus_is_refused(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", GPUS.split(",")[0])
    line, _ = refused(product_args(model), capsys)
    assert line == (
        "ValueError: The number of required GPUs exceeds the total number of available GPUs in the cluster."
    )


def test_without_vllm_nccl_so_path_uid_1001_finds_no_nccl(
    model: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm-project/vllm#4312: vllm-nccl-cu12 left NCCL under the installing user's ~/.config, which uid 1001
    (HOME=/tmp) does not look in and could not read; libnccl.so.2 is in no library path of the image."""
    monkeypatch.delenv("VLLM_NCCL_SO_PATH")
    line, out = refused(product_args(model), capsys)
    assert line == "NameError: name 'ncclGetVersion' is not defined"
    assert f"Failed to import NCCL library: {NCCL_NOT_FOUND}" in out
    assert "Error executing method init_device. This might cause deadlock in distributed execution." in out
    # one GPU needs no NCCL: the same message is only logged
    single = [*product_args(model), "--tensor-parallel-size=1"]
    plan = openai_api_server.start_up(openai_api_server.make_arg_parser().parse_args(single))
    assert plan.served_model_names == ["qwen2-7b-instruct"]
    assert f"Failed to import NCCL library: {NCCL_NOT_FOUND}" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_vllm_nccl_so_path_must_name_a_readable_file(
    model: Path,
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    where: str,
) -> None:
    path = tmp_path / "no-such-libnccl.so.2" if where == "missing" else tmp_path
    monkeypatch.setenv("VLLM_NCCL_SO_PATH", str(path))
    line, out = refused(product_args(model), capsys)
    assert line == "NameError: name 'ncclGetVersion' is not defined"
    assert f"Found nccl from environment variable VLLM_NCCL_SO_PATH={path}" in out
    assert f"Failed to import NCCL library: Failed to load NCCL library from {path} ." in out


def test_nccl_under_the_running_user_s_config_root_or_a_library_path_is_found(
    model: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """How 0.4.2 finds NCCL without VLLM_NCCL_SO_PATH: vllm-nccl-cu12's copy under $VLLM_CONFIG_ROOT,
    $XDG_CONFIG_HOME or ~/.config (what root, the installing user, finds), else ldconfig's cache or
    LD_LIBRARY_PATH."""
    monkeypatch.delenv("VLLM_NCCL_SO_PATH")
    args = openai_api_server.make_arg_parser().parse_args(product_args(model))
    managed = Path(env["HOME"]) / ".config" / "vllm" / "nccl" / "cu12" / "libnccl.so.2.18.1"
    managed.parent.mkdir(parents=True)
    managed.write_bytes(b"stand-in")
    assert openai_api_server.find_nccl_library() == str(managed)
    openai_api_server.start_up(args)
    managed.unlink()
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "libnccl.so.2").write_bytes(b"stand-in")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{libs}")
    assert openai_api_server.find_nccl_library() == str(libs / "libnccl.so.2")
    monkeypatch.delenv("LD_LIBRARY_PATH")
    listing = "\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2\n"
    monkeypatch.setattr(openai_api_server, "ldconfig_listing", lambda: listing)
    assert openai_api_server.find_nccl_library() == "/usr/lib/x86_64-linux-gnu/libnccl.so.2"


def test_the_product_command_line_serves_the_simulator(model: Path, nccl: Path, tmp_path: Path) -> None:
    """The console script's module in its own process, as the lab image runs it: the product's args (then a
    free port on loopback for the test), its pod's environment; /health, /v1/models, completions, /metrics."""
    env = {
        **os.environ,
        "NVIDIA_VISIBLE_DEVICES": GPUS,
        "VLLM_NCCL_SO_PATH": str(nccl),
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    argv = [*product_args(model), "--host=127.0.0.1", "--port=0"]
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_sim.openai_api_server", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    assert process.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or []), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("listening on" in line for line in lines), timeout=30), lines
        url = next(line for line in lines if "listening on" in line).split()[-1]
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/health").status_code == 200
            assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["qwen2-7b-instruct"]
            body = {"model": "qwen2-7b-instruct", "prompt": "hello", "max_tokens": 4}
            assert client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 4
            too_long = client.post("/v1/completions", json={**body, "max_tokens": 8193})
            assert too_long.status_code == 400
            assert 'vllm:num_requests_running{model_name="qwen2-7b-instruct"}' in client.get("/metrics").text
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    assert "vLLM API server version 0.4.2" in out
