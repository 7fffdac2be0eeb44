"""The GPU gates' script (playbooks/files/model_gpu_gates.py): the parts that need no GPU.

The soak runs for real against a small local HTTP server standing in for vLLM's OpenAI server (loopback
only, about a second); the fp16 load, context and MMLU subcommands need vLLM on a GPU and are exercised by
the playbook on a GPU node (docs/models.md, "GPU gates").
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "playbooks" / "files" / "model_gpu_gates.py"


@pytest.fixture(scope="module")
def gates() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_gpu_gates", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeVllm(ThreadingHTTPServer):
    waiting = 0.0
    status = 200
    completions = 0


class Handler(BaseHTTPRequestHandler):
    server: FakeVllm

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="gate-model"}} {self.server.waiting}\n'
            'vllm:num_requests_running{model_name="gate-model"} 4.0\n'
        )
        self._send(200, text.encode(), "text/plain")

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        request = json.loads(self.rfile.read(length))
        self.server.completions += 1
        body = {"choices": [{"text": "ok"}], "model": request["model"]}
        self._send(self.server.status, json.dumps(body).encode(), "application/json")


@pytest.fixture
def server() -> Iterator[FakeVllm]:
    httpd = FakeVllm(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def soak(gates: ModuleType, server: FakeVllm, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    argv = ["soak", f"--url={url}", "--model-name=gate-model", "--concurrency=4", "--seconds=1"]
    assert gates.main([*argv, "--sample-interval=0.1", "--max-waiting=5"]) == 0
    return json.loads(capsys.readouterr().out)


def test_soak_passes_with_a_short_queue(gates: ModuleType, server: FakeVllm, capsys: Any) -> None:
    server.waiting = 3.0
    result = soak(gates, server, capsys)
    assert result["passed"], result
    assert result["requests"] == server.completions > 0 and result["errors"] == 0
    assert result["max_waiting"] == 3.0 and result["samples"] > 0


def test_soak_fails_when_requests_wait(gates: ModuleType, server: FakeVllm, capsys: Any) -> None:
    server.waiting = 7.0
    result = soak(gates, server, capsys)
    assert not result["passed"] and result["max_waiting"] == 7.0


def test_soak_fails_on_errors(gates: ModuleType, server: FakeVllm, capsys: Any) -> None:
    server.status = 503
    result = soak(gates, server, capsys)
    assert not result["passed"] and result["errors"] > 0 and "503" in result["first_errors"][0]


def test_mmlu_prompt_layout(gates: ModuleType) -> None:
    shot = ["1+1?", "1", "2", "3", "4", "B"]
    row = ["2+2?", "3", "4", "5", "6", "B"]
    prompt = gates._mmlu_prompt("high_school_mathematics", [shot], row)
    assert prompt.startswith("The following are multiple choice questions (with answers) about high school")
    assert "1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n2+2?\nA. 3" in prompt
    assert prompt.endswith("D. 6\nAnswer:")
