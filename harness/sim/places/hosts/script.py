"""The job's script on a host whose spec says ``copy_script`` (the hosts file's field).

By default a node on a host runs the script at its absolute path, which must be there (a
shared checkout, the same image). A host that has no such checkout gets a copy: the
script's dir (what it imports beside itself), packed here once per job as a tar archive,
written into the connection's work dir (``SshHost.put``: on the channel's stdin) and
unpacked there by the host's interpreter; the node runs ``<work dir>/script/<name>``, and
the copy goes with the work dir. Hidden entries and ``__pycache__`` are left out, and a
dir of more than ``MAX_BYTES`` is refused in one line: a script's dir that large is a
checkout to put on the host, not to send with every job.
"""

from __future__ import annotations

import io
import os
import tarfile
import threading

from harness.errors import ConfigError
from harness.hosts import SshHost

__all__ = ["MAX_BYTES", "ScriptCopy"]

#: the most a script's dir may hold to be copied (files summed)
MAX_BYTES = 64 << 20

#: run on the host: unpack the archive (argv 1) into the dir (argv 2), then remove it
_UNPACK = """
import os, sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    archive.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
os.unlink(sys.argv[1])
"""


class ScriptCopy:
    """The job's script, copied to each host that asks for it (once per connection)."""

    def __init__(self, script: str):
        self.script = os.path.abspath(script)
        self._archive: bytes | None = None
        self._copied: dict[str, str] = {}  # work dir -> the script's path there
        self._lock = threading.Lock()

    def on(self, host: SshHost) -> str:
        """The script's path on ``host``: its copy in the connection's work dir (made on
        first use); ``ConfigError`` if its dir is too large to copy."""
        with self._lock:
            there = self._copied.get(host.work_dir)
            if there is None:
                archive = host.put("script.tar", self._pack())
                host.run([host.spec.python, "-I", "-S", "-c", _UNPACK, archive, f"{host.work_dir}/script"])
                there = self._copied[host.work_dir] = f"{host.work_dir}/script/{os.path.basename(self.script)}"
            return there

    def _pack(self) -> bytes:
        if self._archive is None:
            base = os.path.dirname(self.script)
            files, total = [], 0
            for root, dirs, names in os.walk(base):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                for name in sorted(names):
                    path = os.path.join(root, name)
                    if name.startswith(".") or not os.path.isfile(path):
                        continue
                    total += os.path.getsize(path)
                    if total > MAX_BYTES:
                        raise ConfigError("copy_script", True, f"cannot copy the script's dir {base}: it holds more "
                                          f"than {MAX_BYTES >> 20} MiB; put the script on the hosts at the same path "
                                          "instead (a shared checkout)")
                    files.append(path)
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                for path in files:
                    archive.add(path, arcname=os.path.relpath(path, base), recursive=False)
            self._archive = buffer.getvalue()
        return self._archive
