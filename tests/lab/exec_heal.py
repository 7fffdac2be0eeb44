"""A `podman exec` into a lab node that runc refuses because the node's name=systemd cgroup is gone.

On this machine's cgroup v1 (hybrid) host, a node's systemd moves itself out of its container's name=systemd
cgroup (it lands at that hierarchy's /init.scope), which is left empty and is sometimes removed: seen when the
three nodes are created one after another. runc's exec joins every cgroup the container recorded and then
fails with "error adding pid N to cgroups: failed to write N: openat2 /sys/fs/cgroup/systemd/libpod_parent/
libpod-<id>/cgroup.procs: no such file or directory", while SSH into the node works. Making that directory
again (on cgroupfs, mkdir makes a cgroup) lets the exec join it: it holds nothing else. The lab's own podman
calls do that once and retry. Test equipment only: the product never runs nodes in containers.
"""

from __future__ import annotations

import re
from pathlib import Path

# only the containers' own cgroups under podman's parent are ever made again
LIBPOD_PARENT = Path("/sys/fs/cgroup/systemd/libpod_parent")
_MISSING = re.compile(r"openat2 (/\S+?)/cgroup\.procs: no such file or directory")


def heal(stderr: str | None, parent: Path = LIBPOD_PARENT) -> bool:
    """True when stderr is runc's missing-cgroup refusal for a container under `parent` and the cgroup was
    made again (the exec may be retried); False for any other failure."""
    found = _MISSING.search(stderr or "")
    if not found:
        return False
    path = Path(found[1])
    if path.parent != parent or not path.name.startswith("libpod-"):
        return False
    path.mkdir(exist_ok=True)
    return True
