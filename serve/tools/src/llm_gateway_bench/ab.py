"""`python -m llm_gateway_bench.ab --other-src DIR`: paired A/B runs on a shared machine.

Comparisons, each in many short rounds whose order alternates, so that load from other work
on the machine falls on both sides alike; the medians of the per-round pairs are the result:

- p50 and the gateway process's CPU time per request at 200 req/s (non-streaming), and stream
  chunks/s (32 streams of 512 tokens), through the gateway installed here against a gateway run
  from another source tree (`DIR`, e.g. `git archive REV serve | tar -x -C /tmp/old` then
  `/tmp/old/serve/src`): same simulator, same configuration;
- p50 at 200 req/s straight to the simulator through the gateway's own upstream client and
  through aiohttp's.

Prints the figures; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from .bench import SECRET, Bench, Target, _wait_port_file


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _rounds(
    bench: Bench,
    arms: dict[str, Target],
    rounds: int,
    stream: bool,
    pids: dict[str, int] | None = None,
    cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Per round and arm: p50 (ms) or chunks/s; with `pids`, `cpu` gets each arm's CPU µs per unit."""
    results: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            before = _cpu_s(pids[name]) if pids else 0.0
            if stream:
                figures = await bench.closed_loop(
                    arms[name], 32, 4 * bench.scale, stream=True, max_tokens=512
                )
                results[name].append(figures["chunks_per_s"])
            else:
                figures = await bench.open_loop(arms[name], 200, 4 * bench.scale)
                results[name].append(figures["p50"])
            if pids and cpu is not None:
                # per request (p50 rounds) or per chunk (stream rounds), in microseconds
                units = (
                    figures["chunks_per_s"] * figures["n"] / figures["requests_per_s"]
                    if stream
                    else figures["n"]
                )
                cpu.setdefault(name, []).append((_cpu_s(pids[name]) - before) * 1e6 / max(units, 1))
        print(f"  round {r}: " + ", ".join(f"{n} {results[n][-1]:.3f}" for n in names), file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llm_gateway_bench.ab", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--other-src", type=Path, required=True, help="a source tree's src/ with llm_gateway")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    bench = Bench(args.scale)
    try:
        direct, gateway, aio, sim_port = bench.start()
        ports_file = bench.tmp / "other.json"
        other = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llm_gateway.cli",
                "--config",
                str(bench.tmp / "gateway.json"),
                "--port-file",
                str(ports_file),
                "--log-level",
                "warning",
            ],
            env={**os.environ, "BENCH_JWT_SECRET": SECRET, "PYTHONPATH": str(args.other_src.resolve())},
        )
        bench.processes.append(other)
        other_target = Target("other", _wait_port_file(ports_file, other)["listen"], gateway.headers)
        pids = {"this": bench.processes[1].pid, "other": other.pid}  # processes: simulator, gateway
        cpu_ms: dict[str, list[float]] = {}  # µs per request
        cpu_chunk: dict[str, list[float]] = {}  # µs per streamed chunk
        import uvloop

        async def run() -> tuple[dict[str, list[float]], ...]:
            await bench.configure_sim(sim_port, ttft_s=0.0, itl_s=0.0, reply=None, default_max_tokens=16)
            print("p50 at 200 req/s, this gateway against the other", file=sys.stderr)
            gateways = await _rounds(
                bench, {"this": gateway, "other": other_target}, args.rounds, False, pids, cpu_ms
            )
            print("stream chunks/s, this gateway against the other", file=sys.stderr)
            chunks = await _rounds(
                bench, {"this": gateway, "other": other_target}, args.rounds, True, pids, cpu_chunk
            )
            print("p50 at 200 req/s, own client against aiohttp", file=sys.stderr)
            p50 = await _rounds(bench, {"own": direct, "aiohttp": aio}, args.rounds, stream=False)
            return gateways, chunks, p50

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            gateways, chunks, p50 = runner.run(run())
    finally:
        bench.stop()
    ratio = statistics.median(t / o for t, o in zip(chunks["this"], chunks["other"], strict=True))
    gap = statistics.median(a - o for a, o in zip(p50["aiohttp"], p50["own"], strict=True))
    added = statistics.median(t - o for t, o in zip(gateways["this"], gateways["other"], strict=True))
    figures = {
        "gateway_p50_ms": gateways,
        "gateway_cpu_us_per_request": cpu_ms,
        "chunks_per_s": chunks,
        "gateway_cpu_us_per_chunk": cpu_chunk,
        "client_p50_ms": p50,
    }
    print(json.dumps(figures))
    print(
        f"gateway CPU per request at 200 req/s median: this {statistics.median(cpu_ms['this']):.0f} µs, "
        f"other {statistics.median(cpu_ms['other']):.0f} µs (its probes and timers included); per "
        f"streamed chunk: this {statistics.median(cpu_chunk['this']):.1f} µs, "
        f"other {statistics.median(cpu_chunk['other']):.1f} µs"
    )
    print(
        f"gateway p50 at 200 req/s median: this {statistics.median(gateways['this']):.3f} ms, "
        f"other {statistics.median(gateways['other']):.3f} ms; paired difference {added:+.3f} ms"
    )
    print(
        f"stream chunks/s median: this {statistics.median(chunks['this']):,.0f}, "
        f"other {statistics.median(chunks['other']):,.0f}; paired ratio this/other {ratio:.3f}"
    )
    print(
        f"p50 at 200 req/s median: own {statistics.median(p50['own']):.3f} ms, "
        f"aiohttp {statistics.median(p50['aiohttp']):.3f} ms; paired difference {gap:+.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
