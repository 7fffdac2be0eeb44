"""SIGHUP reloads weights and terms under load without failing a request; a bad file is refused.
The gateway runs as a real `llm-gateway` process here, since signals go to a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import yaml
from gwtest import JWT_ENV, auth_headers, chat_body, wait_for


def _write_config(path: Path, sim_a: str, sim_b: str, weights: tuple[int, int], terms: list[str]) -> None:
    config = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "internal": {"host": "127.0.0.1", "port": 0},
        "auth": {"mode": "jwt", "hs256_secret_env": JWT_ENV},
        "models": {
            "m": {
                "upstreams": [
                    {"name": "a", "url": sim_a, "served_model": "m", "weight": weights[0]},
                    {"name": "b", "url": sim_b, "served_model": "m", "weight": weights[1]},
                ]
            }
        },
        "safety": {"terms": terms, "action": "mask"},
        "audit": {"path": str(path.parent / "audit.jsonl")},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config))
    tmp.replace(path)


def test_sighup_reload_under_load(make_sim: Any, tmp_path: Path) -> None:
    reply = ["alpha ", "beta ", "gamma ", "delta ", "omega"]
    sim_a = make_sim(reply=reply, itl_s=0.02)
    sim_b = make_sim(reply=reply, itl_s=0.02)
    config_path = tmp_path / "gateway.yaml"
    port_file = tmp_path / "ports.json"
    _write_config(config_path, sim_a.url, sim_b.url, (100, 0), [])
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llm_gateway.cli",
            "--config",
            str(config_path),
            "--port-file",
            str(port_file),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert wait_for(port_file.exists, timeout=30), "gateway did not start"
        url = f"http://127.0.0.1:{json.loads(port_file.read_text())['listen']}/v1/chat/completions"
        failures: list[str] = []
        done = 0
        stop = threading.Event()
        lock = threading.Lock()

        def load(worker: int) -> None:
            nonlocal done
            with httpx.Client(timeout=20) as client:
                i = 0
                while not stop.is_set():
                    i += 1
                    stream = i % 2 == 0
                    headers = auth_headers(f"user-{worker}-{i}")
                    try:
                        response = client.post(url, json=chat_body(stream=stream), headers=headers)
                        ok = response.status_code == 200 and "x-llm-gateway-fallback" not in response.headers
                        if stream:
                            ok = (
                                ok
                                and response.text.rstrip().endswith("data: [DONE]")
                                and '"error"' not in response.text
                            )
                        if not ok:
                            failures.append(f"{response.status_code} {response.text[:200]}")
                    except httpx.HTTPError as exc:
                        failures.append(repr(exc))
                    with lock:
                        done += 1

        threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(4)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: done >= 20, timeout=30)
        for round_ in range(4):
            weights = (0, 100) if round_ % 2 == 1 else (100, 0)
            _write_config(config_path, sim_a.url, sim_b.url, weights, ["gamma"] if round_ % 2 == 1 else [])
            before = done
            process.send_signal(signal.SIGHUP)
            assert wait_for(lambda before=before: done >= before + 10, timeout=30)
        # the last reload sent everyone to b and masks "gamma"
        with httpx.Client(timeout=20) as client:
            assert wait_for(
                lambda: (
                    client.post(url, json=chat_body(), headers=auth_headers("probe")).headers.get(
                        "x-llm-gateway-upstream"
                    )
                    == "b"
                )
            )
            answer = client.post(url, json=chat_body(), headers=auth_headers("probe"))
            assert answer.json()["choices"][0]["message"]["content"] == "alpha beta ***** delta omega"
            # a broken file is refused; the running config stays
            config_path.write_text("models: {m: {upstreams: []}}\naudit: {path: '-'}\nbogus: 1\n")
            process.send_signal(signal.SIGHUP)
            before = done
            assert wait_for(lambda: done >= before + 10, timeout=30)
            answer = client.post(url, json=chat_body(), headers=auth_headers("probe"))
            assert answer.headers["x-llm-gateway-upstream"] == "b"
        stop.set()
        for thread in threads:
            thread.join(30)
        assert failures == [], failures[:5]
        assert done >= 60
        assert sim_a.stats()["finished"] > 0 and sim_b.stats()["finished"] > 0
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
    assert process.returncode == 0, stderr[-2000:]
    assert "config reload refused" in stderr and "bogus: unknown key" in stderr
