"""`vllm-sim`: serve the simulator."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path

import orjson

from .engine import STREAM_ENDS, SimConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-sim", description="vLLM OpenAI server simulator (no GPU)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port-file)")
    parser.add_argument("--port-file", type=Path, help="write {'port': N} here once listening")
    parser.add_argument("--served-model-name", nargs="+", default=["sim-model"], dest="served_models")
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    parser.add_argument("--itl-ms", type=float, default=0.0, help="inter-token latency")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="sequences running at once")
    parser.add_argument("--max-queue", type=int, default=1024, help="waiting requests before 503")
    parser.add_argument(
        "--max-tokens", type=int, default=16, dest="default_max_tokens", help="default output length"
    )
    parser.add_argument("--max-model-len", type=int, default=4096, help="larger max_tokens is refused (400)")
    parser.add_argument("--reply", nargs="+", help="fixed output tokens, one per stream chunk")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of requests answered 500")
    parser.add_argument("--hang-rate", type=float, default=0.0, help="share of requests that never answer")
    parser.add_argument("--health-fail", action="store_true", help="/health answers 500")
    parser.add_argument(
        "--stream-end",
        choices=STREAM_ENDS,
        default="with_text",
        help="how a stream ends: finish reason with the last text (vLLM), in an empty delta (OpenAI), "
        "plus a usage chunk even when not asked for, or [DONE] right after the text",
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    config = SimConfig(
        served_models=args.served_models,
        ttft_s=args.ttft_ms / 1000,
        itl_s=args.itl_ms / 1000,
        max_num_seqs=args.max_num_seqs,
        max_queue=args.max_queue,
        default_max_tokens=args.default_max_tokens,
        max_model_len=args.max_model_len,
        reply=args.reply,
        error_rate=args.error_rate,
        hang_rate=args.hang_rate,
        health_fail=args.health_fail,
        stream_end=args.stream_end,
        seed=args.seed,
    )
    serve_until_stopped(config, args.host, args.port, args.log_level, args.port_file)
    return 0


def serve_until_stopped(
    config: SimConfig, host: str, port: int, log_level: str, port_file: Path | None = None
) -> None:
    """Serve the simulator on host:port (0: a free port, written to `port_file`) until the process is stopped.
    Shared by `vllm-sim` and `vllm-sim-openai-api-server`."""
    import uvicorn
    import uvloop

    from .app import create_app

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            lifespan="off",
            http="httptools",
            access_log=False,
            log_level=log_level,
            backlog=2048,
            timeout_keep_alive=30,
        )
    )

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if port_file is not None and server.started:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps({"port": port}))
            tmp.replace(port_file)
        print(f"vllm-sim listening on http://{host}:{port}", file=sys.stderr, flush=True)
        await task

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


if __name__ == "__main__":
    sys.exit(main())
