"""Errors of a host, one line each, naming the host (``user@address:port``) and what to do.

``explain`` turns what the ``ssh`` client printed when it failed (exit 255: its own failure,
not the remote command's) into the error a user can act on. OpenSSH's messages are stable
across releases for these cases (they are what every SSH wrapper greps for), and anything
unrecognised still becomes one line with ssh's own last line in it.
"""

from __future__ import annotations

import re

from harness.errors import ElasticError
from harness.hosts._spec import HostSpec

__all__ = ["HostError", "HostUnreachable", "HostAuthError", "HostKeyError", "HostPythonError",
           "HostCommandError", "HostTimeout", "explain", "last_line"]

#: the exit status with which the ssh client reports a failure of its own
SSH_FAILED = 255


class HostError(ElasticError):
    """Something on or on the way to a host failed; the message names the host."""


class HostUnreachable(HostError):
    """No connection to the host, or the connection was lost."""


class HostAuthError(HostError):
    """The host refused our key (BatchMode: no password is ever asked for)."""


class HostKeyError(HostError):
    """The host's key is unknown (strict checking) or differs from the recorded one."""


class HostPythonError(HostError):
    """The host's interpreter cannot run, or lacks pytest-elastic of the controller's version."""


class HostCommandError(HostError):
    """A remote command exited non-zero (``run(..., check=True)``)."""

    def __init__(self, message: str, returncode: int, stdout: str, stderr: str):
        super().__init__(message)
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


class HostTimeout(HostError, TimeoutError):
    """A bounded wait on a host ran out; the message says what and after how long."""


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` that is not ssh's ``@@@`` banner art, nor srun's
    own word on how a step ended (``srun: error: node0: task 0: Exited with exit code 2``)
    where the command said something before it: what the command itself said."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("@")]
    said = [line for line in lines if not line.startswith("srun: ")]
    return (said or lines or ["no output"])[-1]


def _known_hosts_entry(spec: HostSpec) -> str:
    return spec.address if spec.port == 22 else f"[{spec.address}]:{spec.port}"


def explain(spec: HostSpec, stderr: str, doing: str) -> HostError:
    """The error for an ssh client that exited 255 while ``doing`` (e.g. "connecting")."""
    known = spec.known_hosts or "~/.ssh/known_hosts"
    said = last_line(stderr)
    where = f"host {spec.label}: {doing}"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "Host key for" in stderr and "has changed" in stderr:
        return HostKeyError(
            f"{where}: its host key is not the one known_hosts={known} has for it (a reinstalled host, or "
            f"someone in between); if the change is expected: ssh-keygen -R '{_known_hosts_entry(spec)}' -f {known}")
    if re.search(r"No \S+ host key is known for", stderr) or "Host key verification failed" in stderr:
        return HostKeyError(
            f"{where}: no host key for it in known_hosts={known} (host keys are checked); add it "
            f"(ssh-keyscan -p {spec.port} {spec.address} >> {known}) or, for a throwaway host only, "
            f"set trust_on_first_use=true")
    if "Permission denied" in stderr or "Too many authentication failures" in stderr:
        key = spec.key or "ssh's default identities"
        return HostAuthError(
            f"{where}: authentication refused ({said}); keys only, never a password prompt (BatchMode=yes): "
            f"authorize key={key} for user {spec.user} on the host")
    if "Session open refused by peer" in stderr or "administratively prohibited" in stderr:  # multiplexed, or not
        return HostError(
            f"{where}: its sshd refused one more session on the connection (MaxSessions): the hosts file's "
            f"max_sessions={spec.max_sessions} is more than the host's sshd MaxSessions; set it to that")
    return HostUnreachable(f"{where}: ssh failed: {said}")
