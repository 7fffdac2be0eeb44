"""Stand-in for the Kubernetes control plane used by the lab (stdlib-only, Python 3.11).

See docs/CONTRACTS.md ("Lab Kubernetes API") and docs/lab.md for what is real and what is stood in.
"""

SERVER_VERSION = "v1.36.3"
