"""The model_sync role's own verdict on what its one read (tasks/prepare-nodes.yml, files_in_place) found, for
a task whose module runs whole to decide that it changes nothing: "in place" only where that task would change
nothing, so the task runs everywhere else and decides there. Run on the controller; kept in Python so the unit
tests hold the verdict to the module it stands for (tests/unit/test_model_sync_reads.py). The verdicts on
the sync account's known_hosts and authorized_keys are the project's shared ones
(plugins/filter/ssh_key_files.py).

- ``gunzipped_sha1``: the SHA-1 of what community.general.decompress writes from a gzip file (rrsync's
  documentation copy, a few KiB, slurped by the read), compared with stat's checksum of the installed copy.
  Jinja has no gzip, and its b64decode gives text.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import io
import zlib
from typing import Any


def _decoded(content: str) -> bytes | None:
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return None


def gunzipped_sha1(content: Any) -> str:
    """The SHA-1 (hex) of the decompressed content of CONTENT, a gzip file in base64 (slurp's answer), read as
    community.general.decompress reads it (gzip.open); '' where CONTENT is empty or not base64 gzip, which
    equals no checksum."""
    if not isinstance(content, str) or not content:
        return ""
    data = _decoded(content)
    if not data:
        return ""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as unpacked:
            return hashlib.sha1(unpacked.read()).hexdigest()
    except (OSError, EOFError, zlib.error):
        return ""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gunzipped_sha1": gunzipped_sha1,
        }
