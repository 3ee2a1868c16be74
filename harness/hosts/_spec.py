"""Host specs: ``ssh://user@address[:port]`` and the hosts file, checked once into a frozen
``HostSpec`` (the project's rule: configuration is resolved at the edge).

One row per field (``FIELDS``) says its type check, so a URL's keyword fields, the hosts
file's ``[[host]]`` tables and its ``[defaults]`` are validated by the same code, and every
error is one ``ConfigError`` line naming the host and the field::

    port='x' must be an int in [1, 65535] (from hosts.toml host[1] 10.0.0.6)

The hosts file (TOML)::

    [defaults]                        # optional: every [[host]] gets these unless it sets its own
    user = "ci"
    key = "~/.ssh/elastic_ed25519"    # relative paths: relative to this file
    python = "/opt/elastic/bin/python"

    [[host]]
    address = "10.0.0.5"
    port = 2222
    work_dir = "/scratch"             # the per-session work dirs are made under it
    capabilities = ["netns", "cgroups"]
    shared_dir = "/nfs/elastic"       # a filesystem the job's hosts share: its {shared} there
    copy_script = true                # the job's script dir copied into the work dir
    keep_missed = 20                  # s the host keeps a lost connection's events files
    gpus = 8                          # its GPUs (a count, or ids): split between its nodes
    exclusive = false                 # other jobs run there too: no fault on the whole host
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the dependency pyproject names for 3.10
    import tomli as tomllib

__all__ = ["FIELDS", "HostSpec", "KEEP_MISSED_S", "parse_host", "load_hosts"]

#: the default of how long a host keeps the nodes' events files of a connection lost
#: without the controller's ``close()``, for a new connection to read what never came
#: (``_remote``'s lease; ``host_unreachable``); everything else of it goes at once
KEEP_MISSED_S = 20.0

_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
_CAPABILITY = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_LABEL = re.compile(r"[A-Za-z0-9_.@%-]+")
_URL_FORM = "must be ssh://user@address[:port]"


@dataclass(frozen=True)
class HostSpec:
    """One host, checked. ``label`` (``user@address:port``) names it in every message."""

    address: str
    user: str
    port: int = 22
    key: str | None = None  # local private key (absolute); None: ssh's own identities
    python: str = "python3"  # the host's interpreter, which must have pytest-elastic
    work_dir: str | None = None  # remote base of the session work dirs; None: the host's temp dir
    capabilities: frozenset[str] = field(default_factory=frozenset)
    known_hosts: str | None = None  # local known_hosts file; None: ssh's default (~/.ssh/known_hosts)
    trust_on_first_use: bool = False  # accept (and record) an unknown host key: throwaway hosts only
    max_sessions: int = 10  # the host's sshd MaxSessions: commands at once on one connection (its default: 10)
    #: a dir of a filesystem every host of a job mounts there (NFS...): its ``{shared}`` goes there
    shared_dir: str | None = None
    #: copy the job's script and its dir into the connection's work dir and run the copy
    #: (False: the script must be at the same path there: a shared checkout, an image)
    copy_script: bool = False
    #: seconds the host keeps a lost connection's events files (``KEEP_MISSED_S``; 0: none)
    keep_missed: float = KEEP_MISSED_S
    #: the host's GPUs (``CUDA_VISIBLE_DEVICES`` ids) the harness splits between the job's
    #: nodes there (``harness.sim.places.hosts.gpus``); empty: none handed out
    gpus: tuple[str, ...] = ()
    #: no other job runs on the host while the job does (False: others may, as a test
    #: session's under pytest -n, or a pool several pipelines share): a fault that would
    #: fall on the whole host, and so on their nodes too, is refused where it is False
    exclusive: bool = True
    #: its own name where it has one (a Slurm node's: what the scheduler calls it, and how
    #: its steps are sent to it); None: it is known by its address
    name: str | None = None
    #: the scheduler that owns it (``"slurm"``: a node of a Slurm allocation, whose own
    #: faults, a node marked DOWN or drained, are done there); None: no scheduler, an SSH host
    scheduler: str | None = None

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.user}@{address}:{self.port}"

    @property
    def url(self) -> str:
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"ssh://{self.user}@{address}" + (f":{self.port}" if self.port != 22 else "")


# -- one row per field: the check that turns a raw value into the HostSpec's one ------------

def _address(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return value if _HOSTNAME.fullmatch(value) else None  # never starts with "-": no ssh option


def _user(value: Any) -> str | None:
    return value if isinstance(value, str) and _USER.fullmatch(value) else None


def _port(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
    return value if ok else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value and not set(value) & {"\0", "\n", "\r"} else None


def _absolute(value: Any) -> str | None:
    text = _text(value)
    return text if text is not None and text.startswith("/") else None


def _capabilities(value: Any) -> frozenset[str] | None:
    if isinstance(value, str) or not isinstance(value, Sequence):
        return None
    ok = all(isinstance(c, str) and _CAPABILITY.fullmatch(c) for c in value)
    return frozenset(value) if ok else None


def _label(value: Any) -> str | None:
    return value if isinstance(value, str) and _LABEL.fullmatch(value) else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _keep(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 3600
    return float(value) if ok else None


def _gpus(value: Any) -> tuple[str, ...] | None:
    """A count (ids 0..n-1) or a list of device ids, as ``CUDA_VISIBLE_DEVICES`` takes them."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return tuple(str(i) for i in range(value)) if 0 <= value <= 1024 else None
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, str)) and not isinstance(v, bool) and str(v).strip() and "," not in str(v) for v in value)
    return tuple(str(v).strip() for v in value) if ok else None


def _sessions(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 2 <= value <= 1024
    return value if ok else None


@dataclass(frozen=True)
class _Field:
    check: Callable[[Any], Any]  # the value to keep, or None when it is bad
    constraint: str
    local_path: bool = False  # a file on this machine: ~ expanded, relative to the hosts file
    must_exist: bool = False  # ... that must be there and readable when the file is loaded


FIELDS: dict[str, _Field] = {
    "address": _Field(_address, "must be an IP address or a host name"),
    "user": _Field(_user, "must be a user name ([A-Za-z_][A-Za-z0-9_.-]*)"),
    "port": _Field(_port, "must be an int in [1, 65535]"),
    "key": _Field(_text, "must be the path of a private key file", local_path=True, must_exist=True),
    "python": _Field(_text, "must be the host's interpreter (a path or a command name)"),
    "work_dir": _Field(_absolute, "must be an absolute path on the host"),
    "capabilities": _Field(_capabilities, "must be a list of names like \"netns\", \"cgroups\""),
    "known_hosts": _Field(_text, "must be the path of a known_hosts file", local_path=True),
    "trust_on_first_use": _Field(_flag, "must be true or false"),
    "max_sessions": _Field(_sessions, "must be an int in [2, 1024]: the host's sshd MaxSessions"),
    "shared_dir": _Field(_absolute, "must be an absolute path on the host, of a filesystem the job's hosts share"),
    "copy_script": _Field(_flag, "must be true or false"),
    "keep_missed": _Field(_keep, "must be a number of seconds in [0, 3600]"),
    "gpus": _Field(_gpus, "must be a GPU count in [0, 1024] or a list of device ids"),
    "exclusive": _Field(_flag, "must be true or false"),
    "name": _Field(_label, "must be a name for the host ([A-Za-z0-9_.@%-]+): how reports call it"),
}
_REQUIRED = ("address", "user")


def check_fields(raw: Mapping[str, Any], fields: Mapping[str, _Field], source: str, base_dir: Path | None,
                 noun: str) -> dict[str, Any]:
    """Raw fields checked, each by its row of ``fields`` (a hosts file's, a Slurm file's): the
    values to keep, or one ``ConfigError`` line naming the field and ``source``."""
    values: dict[str, Any] = {}
    for name, value in raw.items():
        row = fields.get(name)
        if row is None:
            raise ConfigError(name, value, f"is not a {noun} field (known: {', '.join(fields)})", source)
        checked = row.check(value)
        if checked is None:
            raise ConfigError(name, value, row.constraint, source)
        if row.local_path:
            path = Path(checked).expanduser()
            checked = str(path if path.is_absolute() or base_dir is None else base_dir / path)
        if row.must_exist and not (os.path.isfile(checked) and os.access(checked, os.R_OK)):
            why = "does not exist" if not os.path.exists(checked) else "is not a readable file"
            raise ConfigError(name, value, f"{row.constraint}: {checked} {why}", source)
        values[name] = checked
    return values


def _build(raw: Mapping[str, Any], source: str, base_dir: Path | None) -> HostSpec:
    """A HostSpec from raw fields, every one checked by its row."""
    values = check_fields(raw, FIELDS, source, base_dir, "host")
    for name in _REQUIRED:
        if name not in values:
            raise ConfigError(name, None, "is required", source)
    return HostSpec(**values)


def parse_host(url: str, *, source: str | None = None, **fields: Any) -> HostSpec:
    """``ssh://user@address[:port]`` (IPv6 in brackets) plus any other field by keyword."""
    where = source or "hosts"
    if not isinstance(url, str):
        raise ConfigError("host", url, _URL_FORM, where)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError("host", url, f"{_URL_FORM} (bad port)", where) from None
    problem = ("the scheme is not ssh" if parts.scheme != "ssh" else
               "no user" if not parts.username else
               "a password does not belong in it (BatchMode: keys only)" if parts.password is not None else
               "no address" if not parts.hostname else
               "nothing may follow the address" if parts.path or parts.query or parts.fragment else None)
    if problem:
        raise ConfigError("host", url, f"{_URL_FORM} ({problem})", where)
    for name in ("address", "user", "port"):
        if name in fields:
            raise ConfigError(name, fields[name], "is given by the URL already", where)
    raw = {"address": parts.hostname, "user": parts.username, **({"port": port} if port is not None else {}),
           **fields}
    return _build(raw, f"{where} {url}", None)


def load_hosts(path: str | os.PathLike[str]) -> list[HostSpec]:
    """The hosts of a TOML hosts file (see the module docstring), in file order."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except OSError as e:
        raise ConfigError("hosts file", str(file), f"cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("hosts file", str(file), f"is not TOML: {e}") from None
    unknown = set(data) - {"defaults", "host"}
    if unknown:
        raise ConfigError("table", sorted(unknown)[0], "is not one of a hosts file's ([defaults], [[host]])",
                          str(file))
    defaults, hosts = data.get("defaults", {}), data.get("host", [])
    if not isinstance(defaults, dict):
        raise ConfigError("defaults", defaults, "must be a table ([defaults])", str(file))
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, dict) for h in hosts):
        raise ConfigError("host", hosts, "needs at least one [[host]] table", str(file))
    specs: list[HostSpec] = []
    for i, table in enumerate(hosts):
        name = table.get("address", "")
        spec = _build({**defaults, **table}, f"{file.name} host[{i}] {name}".rstrip(), file.parent)
        twin = next((s for s in specs if s.label == spec.label), None)
        if twin is not None:
            raise ConfigError("address", spec.address, f"names host {spec.label} twice", f"{file.name} host[{i}]")
        specs.append(spec)
    return specs
