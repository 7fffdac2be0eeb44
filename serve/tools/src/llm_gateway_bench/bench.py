"""`llm-gateway-bench`: the same load through the gateway and straight to the simulator, in one run.

Starts a vllm-sim and an llm-gateway (one worker process, every feature on: JWT auth, cleaning
with HTML stripping, a 1,000-term safety list, audit with hashed prompts, metrics, two weighted
upstreams with breakers and probes) on 127.0.0.1, drives them with the gateway's own asyncio
HTTP/1.1 client, and writes the figures, with the command that reproduces them, into
docs/benchmarks.md between the gateway-bench markers.

One more arm sends the direct load through aiohttp's client instead: the gateway's upstream hop
is one such client request, so the two direct figures side by side say what replacing the
gateway's own client with aiohttp would add to every request.

Latency is measured open loop: request i is due at t0 + i/rate and its latency counts from
then, so a stalled server cannot hide its queue (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import orjson
from llm_gateway.http_client import ConnectionPool

START = "<!-- gateway-bench:start -->"
END = "<!-- gateway-bench:end -->"
SECRET = "bench-secret-" + "x" * 40


@dataclass
class Target:
    name: str
    port: int
    headers: list[tuple[str, str]]
    client: str = "own"  # or "aiohttp"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(round(q * (len(ordered) - 1)), len(ordered) - 1)
    return ordered[index]


def _wait_port_file(path: Path, process: subprocess.Popen[bytes], timeout: float = 30) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{process.args!r} did not start in {timeout}s")


class Bench:
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.tmp = Path(tempfile.mkdtemp(prefix="llm-gateway-bench-"))
        self.processes: list[subprocess.Popen[bytes]] = []

    # --- set-up ------------------------------------------------------------------------------
    def start(self) -> tuple[Target, Target, Target, int]:
        sim_ports = self.tmp / "sim.json"
        sim = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm_sim.cli",
                "--port",
                "0",
                "--port-file",
                str(sim_ports),
                "--served-model-name",
                "qwen2-7b",
                "qwen2-14b",
                "--max-num-seqs",
                "4096",
                "--max-queue",
                "4096",
                "--max-tokens",
                "16",
            ],
        )
        self.processes.append(sim)
        sim_port = _wait_port_file(sim_ports, sim)["port"]
        terms = self.tmp / "terms.txt"
        terms.write_text("\n".join(f"blocked-term-{i:04d}" for i in range(1000)) + "\n内部机密\n")
        upstream = f"http://127.0.0.1:{sim_port}"
        config = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "internal": {"host": "127.0.0.1", "port": 0},
            "auth": {"mode": "jwt", "hs256_secret_env": "BENCH_JWT_SECRET"},
            "models": {
                "qwen2-7b": {
                    "upstreams": [
                        {"name": "stable", "url": upstream, "served_model": "qwen2-7b", "weight": 90},
                        {"name": "canary", "url": upstream, "served_model": "qwen2-14b", "weight": 10},
                    ]
                }
            },
            "limits": {"max_input_chars": 8192, "on_overlong": "reject"},
            "timeouts": {"connect_s": 2, "first_token_s": 30, "between_tokens_s": 10, "total_s": 120},
            "breaker": {"failures_to_open": 5, "open_s": 15, "probe_interval_s": 5},
            "sanitize": {"strip_html": True},
            "safety": {"terms_file": str(terms), "action": "mask"},
            "fallback": {"mode": "message"},
            "audit": {"path": str(self.tmp / "audit.jsonl"), "prompts": "hashed"},
        }
        config_path = self.tmp / "gateway.json"  # JSON is YAML
        config_path.write_text(json.dumps(config))
        gw_ports = self.tmp / "gw.json"
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llm_gateway.cli",
                "--config",
                str(config_path),
                "--port-file",
                str(gw_ports),
                "--log-level",
                "warning",
            ],
            env={**os.environ, "BENCH_JWT_SECRET": SECRET},
        )
        self.processes.append(gateway)
        ports = _wait_port_file(gw_ports, gateway)
        # one token per user would defeat the gateway's verified-token cache; services reuse theirs
        token = jwt.encode({"sub": "bench-user", "exp": int(time.time()) + 3600}, SECRET, algorithm="HS256")
        auth = [("Authorization", f"Bearer {token}"), ("X-App-Name", "bench")]
        json_headers = [("Content-Type", "application/json")]
        return (
            Target("direct", sim_port, json_headers),
            Target("gateway", ports["listen"], json_headers + auth),
            Target("direct_aiohttp", sim_port, json_headers, client="aiohttp"),
            sim_port,
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()

    # --- load ---------------------------------------------------------------------------------
    @staticmethod
    def _body(stream: bool, model: str, max_tokens: int = 16) -> bytes:
        payload: dict[str, Any] = {
            "model": model,
            "messages": [
                {"role": "system", "content": "You answer from the knowledge base."},
                {"role": "user", "content": "<p>How do I reset my password?</p> Please answer briefly."},
            ],
            "max_tokens": max_tokens,
            "temperature": 0.2,
        }
        if stream:
            payload["stream"] = True
        return orjson.dumps(payload)

    async def _one(self, pool: ConnectionPool, target: Target, body: bytes) -> bool:
        response = await pool.request(
            "POST", "/v1/chat/completions", headers=target.headers, body=body, connect_timeout_s=10
        )
        await response.read()
        return response.status == 200

    async def open_loop(self, target: Target, rate: float, seconds: float) -> dict[str, float]:
        pool = ConnectionPool("127.0.0.1", target.port, max_connections=512, max_idle=512)
        session = None
        if target.client == "aiohttp":
            connector = aiohttp.TCPConnector(limit=512, keepalive_timeout=4)
            session = aiohttp.ClientSession(
                f"http://127.0.0.1:{target.port}", connector=connector, headers=dict(target.headers)
            )
        model = "qwen2-7b"
        body = self._body(False, model)
        clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
        latencies: list[float] = []
        errors = 0
        count = int(rate * seconds)

        async def one() -> bool:
            if session is None:
                return await self._one(pool, target, body)
            async with session.post("/v1/chat/completions", data=body) as response:
                await response.read()
                return response.status == 200

        await one()  # warm the connection

        async def fire(due: float) -> None:
            nonlocal errors
            try:
                ok = await asyncio.wait_for(one(), 30)
            except Exception:
                ok = False
            latencies.append(clock() - due)
            if not ok:
                errors += 1

        tasks = []
        t0 = clock() + 0.05
        for i in range(count):
            due = t0 + i / rate
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(fire(due)))
        await asyncio.gather(*tasks)
        pool.close()
        if session is not None:
            await session.close()
        return {
            "n": len(latencies),
            "errors": errors,
            "p50": _percentile(latencies, 0.50) * 1000,
            "p90": _percentile(latencies, 0.90) * 1000,
            "p99": _percentile(latencies, 0.99) * 1000,
        }

    async def closed_loop(
        self, target: Target, concurrency: int, seconds: float, stream: bool, max_tokens: int = 16
    ) -> dict[str, float]:
        pool = ConnectionPool("127.0.0.1", target.port, max_connections=concurrency, max_idle=concurrency)
        body = self._body(stream, "qwen2-7b", max_tokens)
        clock = time.perf_counter
        done = errors = chunks = 0
        e2e: list[float] = []
        end = clock() + seconds

        async def worker() -> None:
            nonlocal done, errors, chunks
            while clock() < end:
                started = clock()
                try:
                    response = await pool.request(
                        "POST",
                        "/v1/chat/completions",
                        headers=target.headers,
                        body=body,
                        connect_timeout_s=10,
                    )
                    if stream:
                        while (piece := await response.next_chunk()) is not None:
                            chunks += piece.count(b'"content":"') - piece.count(b'"content":""')
                    else:
                        await response.read()
                    ok = response.status == 200
                except Exception:
                    ok = False
                e2e.append(clock() - started)
                done += 1
                errors += not ok

        started = clock()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = clock() - started
        pool.close()
        return {
            "requests_per_s": done / elapsed,
            "chunks_per_s": chunks / elapsed,
            "errors": errors,
            "n": done,
            "e2e_mean_ms": sum(e2e) / max(len(e2e), 1) * 1000,
        }

    async def configure_sim(self, port: int, **settings: Any) -> None:
        pool = ConnectionPool("127.0.0.1", port, max_connections=1)
        response = await pool.request(
            "POST",
            "/sim/config",
            headers=[("Content-Type", "application/json")],
            body=orjson.dumps(settings),
            connect_timeout_s=5,
        )
        await response.read()
        pool.close()

    async def run(self, direct: Target, gateway: Target, aio: Target, sim_port: int) -> dict[str, Any]:
        s = self.scale
        results: dict[str, Any] = {}

        async def alternate(
            label: str,
            rounds: int,
            fn: Callable[[Target], Awaitable[dict[str, float]]],
            targets: tuple[Target, ...] = (direct, gateway),
        ) -> None:
            runs: dict[str, list[dict[str, float]]] = {t.name: [] for t in targets}
            for _ in range(rounds):
                for target in targets:
                    runs[target.name].append(await fn(target))
                    print(f"  {label} {target.name}: {runs[target.name][-1]}", file=sys.stderr)
            results[label] = runs

        print("non-streaming latency at 200 req/s (open loop), three arms", file=sys.stderr)
        await self.configure_sim(sim_port, ttft_s=0.0, itl_s=0.0, reply=None, default_max_tokens=16)
        await alternate("latency_200", 5, lambda t: self.open_loop(t, 200, 6 * s), (direct, gateway, aio))

        print("non-streaming throughput (closed loop)", file=sys.stderr)
        await alternate("throughput", 2, lambda t: self.closed_loop(t, 64, 6 * s, stream=False))

        print("streaming chunk rate through the safety filter (closed loop)", file=sys.stderr)
        await self.configure_sim(sim_port, itl_s=0.0)
        await alternate("chunks", 2, lambda t: self.closed_loop(t, 32, 6 * s, stream=True, max_tokens=512))

        print("streaming end-to-end time, 100 tokens at 20 ms (closed loop)", file=sys.stderr)
        await self.configure_sim(sim_port, itl_s=0.02, ttft_s=0.05)
        await alternate(
            "stream_e2e", 2, lambda t: self.closed_loop(t, 16, 8 * s, stream=True, max_tokens=100)
        )
        await self.configure_sim(sim_port, itl_s=0.0, ttft_s=0.0)
        return results


def _median(values: list[float]) -> float:
    return _percentile(values, 0.5)


def render(
    results: dict[str, Any], command: str, wall_s: float, load: tuple[float, float] | None = None
) -> str:
    lat = results["latency_200"]
    p = {
        name: {q: _median([r[q] for r in runs]) for q in ("p50", "p90", "p99")} for name, runs in lat.items()
    }
    added = {q: p["gateway"][q] - p["direct"][q] for q in ("p50", "p90", "p99")}
    lat_errors = sum(r["errors"] for runs in lat.values() for r in runs)
    thr = {name: max(r["requests_per_s"] for r in runs) for name, runs in results["throughput"].items()}
    chunks = {name: max(r["chunks_per_s"] for r in runs) for name, runs in results["chunks"].items()}
    e2e = {name: _median([r["e2e_mean_ms"] for r in runs]) for name, runs in results["stream_e2e"].items()}
    e2e_added = (e2e["gateway"] / e2e["direct"] - 1) * 100
    errors = sum(
        r["errors"]
        for key in ("throughput", "chunks", "stream_e2e")
        for runs in results[key].values()
        for r in runs
    )

    # paired per round (the arms of a round run back to back), so drifting load cancels out
    pairs = list(zip(lat["direct_aiohttp"], lat["direct"], strict=True))
    gap = _median([a["p50"] - o["p50"] for a, o in pairs])
    gap99 = _median([a["p99"] - o["p99"] for a, o in pairs])
    if gap <= 0.1:
        client_verdict = (
            f"This run: aiohttp is {gap:+.2f} ms at p50 (median of the paired rounds), within the margin."
        )
    else:
        client_verdict = (
            f"This run: aiohttp adds {gap:.2f} ms at p50 ({gap99:+.2f} ms at p99; medians of the paired "
            "rounds), more than the margin: the gateway keeps its own client."
        )

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    cpu = platform.processor() or platform.machine()
    lines = [
        START,
        "## Gateway",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPU cores ({cpu}, "
        f"Python {platform.python_version()}), in {wall_s:.0f} s"
        + (f", load average {load[0]:.1f} before and {load[1]:.1f} after" if load else "")
        + ". The simulator, the gateway "
        "(one worker process) and the load generator all share these cores, so the gateway never "
        "has a core to itself: read the figures as a floor. Every gateway feature is on: JWT (HS256) "
        "auth, input cleaning with HTML stripping, a 1,000-term safety list (mask), audit lines with "
        "hashed prompts, metrics, two weighted upstreams (90/10) with breakers and probes. Direct and "
        "gateway runs alternate in the same run, against the same simulator (time to first token 0, "
        "16 tokens, unless stated).",
        "",
        "Reproduce (from the repository root, with serve/ and serve/tools/ installed):",
        "",
        "```",
        command,
        "```",
        "",
        "| Target (one gateway worker) | Goal | Measured | |",
        "|---|---|---|---|",
    ]
    goals = [
        (
            "added latency p50 at 200 req/s, non-streaming",
            "≤ 1 ms",
            f"{added['p50']:.2f} ms",
            added["p50"] <= 1,
        ),
        (
            "added latency p99 at 200 req/s, non-streaming",
            "≤ 5 ms",
            f"{added['p99']:.2f} ms",
            added["p99"] <= 5,
        ),
        (
            "non-streaming throughput before saturation",
            "≥ 1,500 req/s",
            f"{thr['gateway']:,.0f} req/s",
            thr["gateway"] >= 1500,
        ),
        (
            "streamed chunks through the safety filter",
            "≥ 20,000 chunks/s",
            f"{chunks['gateway']:,.0f} chunks/s",
            chunks["gateway"] >= 20000,
        ),
        (
            "added to a stream's end-to-end time (100 tokens, 20 ms apart)",
            "≤ 2 %",
            f"{e2e_added:.2f} %",
            e2e_added <= 2,
        ),
    ]
    lines += [f"| {what} | {goal} | {got} | {verdict(ok)} |" for what, goal, got, ok in goals]

    def trio(name: str) -> str:
        return " / ".join(f"{p[name][q]:.2f}" for q in ("p50", "p90", "p99")) + " ms"

    details = [
        ("latency p50 / p90 / p99 at 200 req/s", trio("direct"), trio("gateway")),
        (
            "throughput, 64 connections, closed loop",
            f"{thr['direct']:,.0f} req/s",
            f"{thr['gateway']:,.0f} req/s",
        ),
        (
            "stream chunks/s, 32 streams of 512 tokens",
            f"{chunks['direct']:,.0f}",
            f"{chunks['gateway']:,.0f}",
        ),
        (
            "stream end-to-end mean, 16 streams of 100 tokens at 20 ms",
            f"{e2e['direct']:.1f} ms",
            f"{e2e['gateway']:.1f} ms",
        ),
        ("failed requests (all phases)", "", str(errors + lat_errors)),
    ]
    lines += [
        "",
        "Details (medians over the alternating rounds; latency counted from each request's scheduled time):",
        "",
        "| Measure | Direct to simulator | Through gateway |",
        "|---|---|---|",
        *(f"| {what} | {direct} | {gateway} |" for what, direct, gateway in details),
        "",
        "Upstream client: the same direct load at 200 req/s sent with the gateway's own HTTP/1.1 "
        "client (`llm_gateway.http_client`) and with aiohttp's (`ClientSession`, keep-alive "
        f"connector), alternating. The rule: if aiohttp is within 0.1 ms at p50, the gateway uses "
        f"it and drops its own. {client_verdict}",
        "",
        "| Client for the upstream hop | p50 / p90 / p99 at 200 req/s |",
        "|---|---|",
        f"| own (httptools, keep-alive pool) | {trio('direct')} |",
        f"| aiohttp {aiohttp.__version__} | {trio('direct_aiohttp')} |",
        "",
        "Added latency is the gateway's percentile minus the direct one at the same arrival rate. "
        "Throughput is closed loop (64 connections, no pause) and stops where the shared cores do: "
        "the simulator and the load generator take most of them, so a gateway worker on its own "
        "core goes further. On a busy 2-core machine the p99 moves by a few milliseconds from run "
        "to run; rerun before drawing conclusions from a single tail figure.",
        "",
    ]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n\n"
    if START in text and END in text:
        before, rest = text.split(START, 1)
        after = rest.split(END, 1)[1].lstrip("\n")
        text = before + section + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every phase's duration")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args(argv)
    command = "llm-gateway-bench --out docs/benchmarks.md" + (
        f" --scale {args.scale}" if args.scale != 1 else ""
    )
    bench = Bench(args.scale)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    try:
        direct, gateway, aio, sim_port = bench.start()
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            results = runner.run(bench.run(direct, gateway, aio, sim_port))
    finally:
        bench.stop()
    section = render(results, command, time.monotonic() - started, (load_before, os.getloadavg()[0]))
    with contextlib.suppress(OSError):
        (bench.tmp / "results.json").write_text(json.dumps(results, indent=2))
    if args.no_write:
        print(section)
    else:
        write_section(args.out, section)
        print(f"wrote the Gateway section of {args.out}", file=sys.stderr)
    print(section, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
