#!/usr/bin/python3
"""The control plane's own metrics for Prometheus (role control_plane_metrics): what no exporter of the
cluster knows, written by timers on the control plane as files in Prometheus's text format and served here.

    control_plane_metrics.py serve --listen ADDRESS --port PORT --dir DIR
        GET /metrics: every DIR/*.prom file (the etcd backup's, the certificate check's), each followed by
        control_plane_metrics_file_mtime_seconds{file=...}; GET /healthz: ok. Nothing else is served.
    control_plane_metrics.py certificates --out FILE [--kubeadm kubeadm] [--timeout SECONDS]
        `kubeadm certs check-expiration -o json` (kubeadm's own list: the PKI's certificates, the ones in
        the kubeconfig files, the authorities) as kubeadm_certificate_expiration_timestamp_seconds, written
        atomically to FILE; kubeadm_certificate_check_success says whether kubeadm answered.

The same kind of file as node_exporter's textfile collector reads, but the product runs no node_exporter:
this serves only those files, on the control plane's node address, to Prometheus (NetworkPolicy
monitoring/prometheus). Python 3.10 standard library only (the node's python3).
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import http.server
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

FILE_SUFFIX = ".prom"
MAX_FILE_BYTES = 1 << 20  # a file this size is not one of ours: not served whole


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_atomically(path: str, text: str) -> None:
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


# ------------------------------------------------------------------------------------------- exporter


def exposition(directory: str) -> str:
    """Every *.prom file of DIRECTORY, then each file's modification time (a timer that stopped shows)."""
    parts = []
    mtimes = []
    for path in sorted(glob.glob(os.path.join(directory, "*" + FILE_SUFFIX))):
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(MAX_FILE_BYTES)
            mtime = os.stat(path).st_mtime
        except OSError:
            continue  # replaced while read: the next scrape has it
        parts.append(text if text.endswith("\n") else text + "\n")
        mtimes.append((os.path.basename(path), mtime))
    parts.append(
        "# HELP control_plane_metrics_file_mtime_seconds When each metrics file served here was last "
        "written.\n"
        "# TYPE control_plane_metrics_file_mtime_seconds gauge\n"
    )
    parts += [f'control_plane_metrics_file_mtime_seconds{{file="{label(n)}"}} {m:.3f}\n' for n, m in mtimes]
    return "".join(parts)


class Handler(http.server.BaseHTTPRequestHandler):
    directory = ""
    timeout = 10  # seconds a client may take to send its request

    def do_GET(self) -> None:  # the http.server interface
        if self.path == "/metrics":
            body, kind = exposition(self.directory).encode(), "text/plain; version=0.0.4; charset=utf-8"
        elif self.path == "/healthz":
            body, kind = b"ok\n", "text/plain; charset=utf-8"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # the http.server interface
        pass  # a scrape every 15 s is not worth a journal line


def serve(args: argparse.Namespace) -> int:
    Handler.directory = args.dir
    server = http.server.ThreadingHTTPServer((args.listen, args.port), Handler)
    server.daemon_threads = True
    print(f"serving {args.dir}/*{FILE_SUFFIX} on http://{args.listen}:{args.port}/metrics", flush=True)
    server.serve_forever()
    return 0


# --------------------------------------------------------------------------------------- certificates


def unix(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def certificate_metrics(report: dict[str, Any] | None, error: str, now: float) -> str:
    """The metrics of one `kubeadm certs check-expiration -o json` REPORT (None: kubeadm failed, ERROR)."""
    lines = [
        "# HELP kubeadm_certificate_expiration_timestamp_seconds When each certificate kubeadm manages on "
        "the control plane ends (kind certificate, or authority for a CA).",
        "# TYPE kubeadm_certificate_expiration_timestamp_seconds gauge",
    ]
    for key, kind in (("certificates", "certificate"), ("certificateAuthorities", "authority")):
        for entry in (report or {}).get(key) or []:
            if entry.get("missing") or entry.get("externallyManaged") or not entry.get("expirationDate"):
                continue  # nothing of kubeadm's to renew there
            lines.append(
                f'kubeadm_certificate_expiration_timestamp_seconds{{certificate="{label(entry["name"])}",'
                f'kind="{kind}"}} {unix(entry["expirationDate"]):.0f}'
            )
    lines += [
        "# HELP kubeadm_certificate_check_success 1 when kubeadm certs check-expiration answered.",
        "# TYPE kubeadm_certificate_check_success gauge",
        f"kubeadm_certificate_check_success {0 if report is None else 1}",
        "# HELP kubeadm_certificate_check_timestamp_seconds When the check last ran.",
        "# TYPE kubeadm_certificate_check_timestamp_seconds gauge",
        f"kubeadm_certificate_check_timestamp_seconds {now:.3f}",
    ]
    if error:
        lines.insert(0, "# " + " ".join(error.split())[:500])
    return "\n".join(lines) + "\n"


def certificates(args: argparse.Namespace) -> int:
    report, error = None, ""
    try:
        done = subprocess.run(
            [args.kubeadm, "certs", "check-expiration", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=args.timeout,
            check=False,
        )
        if done.returncode != 0:
            error = f"kubeadm certs check-expiration exited {done.returncode}: {done.stderr.strip()[-400:]}"
        else:
            report = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        error = f"kubeadm certs check-expiration: {exc}"
    write_atomically(args.out, certificate_metrics(report, error, time.time()))
    if error:
        print(error, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="control_plane_metrics.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve", help="serve the metrics files")
    serving.add_argument("--listen", required=True)
    serving.add_argument("--port", type=int, required=True)
    serving.add_argument("--dir", required=True)
    checking = commands.add_parser("certificates", help="write the kubeadm certificates' expiry")
    checking.add_argument("--out", required=True)
    checking.add_argument("--kubeadm", default="kubeadm")
    checking.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    return serve(args) if args.command == "serve" else certificates(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
