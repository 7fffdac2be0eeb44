"""`llm-gateway --config FILE`: validate the configuration, then serve."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from .config import ConfigError, load_config


def _openapi() -> dict[str, object]:
    from .app import build_openapi, create_public_app
    from .config import parse_config
    from .runtime import Gateway

    logging.disable(logging.WARNING)  # the placeholder config below runs without auth: no warning
    config = parse_config(
        {
            "auth": {"mode": "none"},
            "models": {"m": {"upstreams": [{"name": "a", "url": "http://127.0.0.1:1", "served_model": "m"}]}},
            "audit": {"path": "/dev/null"},
        }
    )
    return build_openapi(create_public_app(Gateway(config)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llm-gateway", description="OpenAI-compatible gateway in front of vLLM"
    )
    parser.add_argument("--config", type=Path, help="YAML configuration (see examples/gateway.yaml)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument("--print-openapi", action="store_true", help="print the OpenAPI document and exit")
    parser.add_argument("--port-file", type=Path, help="write the bound ports here as JSON once listening")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)

    if args.print_openapi:
        print(json.dumps(_openapi(), indent=2, ensure_ascii=False, sort_keys=False))
        return 0
    if args.config is None:
        parser.error("--config is required")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_config(args.config)
        if args.check:
            from .runtime import prepare

            prepare(config)
    except ConfigError as exc:
        print(f"llm-gateway: invalid configuration {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: configuration is valid")
        return 0

    import uvloop

    from .server import run

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(config, args.config.resolve(), args.port_file, args.log_level))
    except ConfigError as exc:
        print(f"llm-gateway: invalid configuration {args.config}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"llm-gateway: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
