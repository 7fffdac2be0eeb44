"""Fixtures: simulators and gateways on loopback, torn down after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gwtest import BackgroundLoop, Gateway, Scripted, Sim, gateway_config
from hypothesis import settings
from vllm_sim.engine import SimConfig

# Property tests explore the same examples on every run: a failure reproduces, a pass is stable.
settings.register_profile("serve", derandomize=True, database=None, deadline=None)
settings.load_profile("serve")


@pytest.fixture(scope="session")
def bg() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


@pytest.fixture
def make_sim(bg: BackgroundLoop) -> Iterator[Callable[..., Sim]]:
    sims: list[Sim] = []

    def make(tls: tuple[Path, Path] | None = None, **settings: Any) -> Sim:
        settings.setdefault("served_models", ["m"])
        sim = Sim(bg, SimConfig(**settings), tls)
        sims.append(sim)
        return sim

    yield make
    for sim in sims:
        sim.stop()


@pytest.fixture
def make_scripted(bg: BackgroundLoop) -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def make(body: bytes, content_type: bytes = b"application/json") -> Scripted:
        server = Scripted(bg, body, content_type)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def make_gateway(bg: BackgroundLoop, tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    gateways: list[Gateway] = []

    def make(upstreams: dict[str, list[dict[str, Any]]], **sections: Any) -> Gateway:
        gateway = Gateway(bg, gateway_config(upstreams, tmp_path, **sections))
        gateways.append(gateway)
        return gateway

    yield make
    for gateway in gateways:
        gateway.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c
