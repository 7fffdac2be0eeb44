"""Chat completions through the gateway's NodePort while a lab test changes the cluster under it (a driver
upgrade, a containerd upgrade): what a client would have seen, counted (docs/benchmarks.md's failed-request
figures)."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request

import jwt
import yaml
from labrun import ROOT

LAB_K8S_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())
MODEL = LAB_K8S_VARS["vllm_serving_models"][0]
JWT_SECRET = LAB_K8S_VARS["llm_gateway_jwt_secret"]
NODE_PORT = int(
    yaml.safe_load((ROOT / "roles/llm_gateway/defaults/main.yml").read_text())["llm_gateway_node_port"]
)
INVENTORY = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())
REQUEST_TIMEOUT_S = 30
REQUEST_PAUSE_S = 0.2  # between two requests: a steady client, not a load test on two cores


def node_ips() -> dict[str, str]:
    """Each node's node_ip (the lab inventory's), where the NodePort listens."""
    groups = INVENTORY["all"]["children"]["k8s_cluster"]["children"]
    return {name: host["node_ip"] for group in groups.values() for name, host in group["hosts"].items()}


def chat_url(address: str) -> str:
    return f"http://{address}:{NODE_PORT}/v1/chat/completions"


# what urllib raises when the request did not reach the server whole: refused, no route, the connect timed
# out, the connection gone while sending (an answer never began)
NOT_REACHED = "not reached: "


class Traffic:
    """Chat completions to the gateway's NodePort of every node in turn, one at a time, each on a new
    connection (urllib keeps none alive), from a thread, while the upgrade runs. A request fails when it gets
    no answer (refused, reset, timed out), an HTTP error, the gateway's fallback (no upstream answered) or an
    answer without choices; each failure is kept with its time and target.

    REBOOTING names a node the test powers through a reboot: a load balancer in front of the NodePorts takes
    a node that is down out by its health check, so a request that could not reach that node (nothing was
    sent whole: no request runs twice) goes to the next node instead, counted in turned_away, not failed. A
    request that reached it and then failed is a failure."""

    def __init__(self, client: str, rebooting: str | None = None) -> None:
        ips = node_ips()
        self.urls = [chat_url(address) for address in sorted(ips.values())]
        self._rebooting_url = chat_url(ips[rebooting]) if rebooting else None
        self.turned_away: list[str] = []  # when, and why, as failures are kept
        self.token = jwt.encode(
            {"sub": client, "exp": int(time.time()) + 7200}, JWT_SECRET, algorithm="HS256"
        )
        self.body = json.dumps(
            {
                "model": MODEL.get("served_model_name", MODEL["name"]),
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            }
        ).encode()
        self.sent = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chat-traffic", daemon=True)
        self._began = 0.0

    def ask(self, url: str) -> str | None:
        """None when the model answered; else what went wrong."""
        request = urllib.request.Request(
            url,
            data=self.body,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
                headers = {k.lower(): v for k, v in answer.headers.items()}
                document = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return f"HTTP {error.code}: {error.read()[:200]!r}"
        except urllib.error.URLError as error:  # raised by the connect and the send, not by the answer
            return f"{NOT_REACHED}{error.reason}"
        except (
            OSError,
            http.client.HTTPException,
            ValueError,
        ) as error:  # refused, reset, timeout, cut short
            return f"{type(error).__name__}: {error}"
        if "x-llm-gateway-fallback" in headers:
            return f"the gateway's fallback ({headers['x-llm-gateway-fallback']})"
        if not document.get("choices"):
            return f"an answer without choices: {str(document)[:200]}"
        return None

    def _run(self) -> None:
        turn = 0
        while not self._stop.is_set():
            url = self.urls[turn % len(self.urls)]
            turn += 1
            what = self.ask(url)
            if what is not None and what.startswith(NOT_REACHED) and url == self._rebooting_url:
                self.turned_away.append(self._stamp(what))  # the same request to the next node, at once
                continue
            self.sent += 1
            if what is not None:
                self.failures.append(self._stamp(f"{url}: {what}"))
            self._stop.wait(REQUEST_PAUSE_S)

    def _stamp(self, what: str) -> str:
        """WHAT with the time since the start and the clock time (to be matched with the gateway's logs and
        the cluster's events)."""
        return f"{time.monotonic() - self._began:7.1f} s ({time.strftime('%H:%M:%S')}) {what}"

    def __enter__(self) -> Traffic:
        self._began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S + 5)
