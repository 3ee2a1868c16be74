"""Who may use the rendezvous store: a per-job secret, proved by challenge and response.

Why: torch's TCPStore (and ours, which speaks its protocol) serves whoever reaches its
port. Anyone on the network could then read the rendezvous state, join the job as a node,
or end it with one ``compare_set`` of garbage. With a job secret, a connection must prove
it knows the secret before the store serves it anything. Without one, nothing changes:
torch's own client still works against our server.

The exchange (after torch's opening ``VALIDATE`` + magic, before any other request):

    client -> store   AUTH (one byte, no torch QueryType) + client nonce (32 random bytes)
    store  -> client  store nonce (32 random bytes)
    client -> store   HMAC-SHA256(secret, CLIENT_CONTEXT + store nonce + client nonce)
    store  -> client  ACCEPTED (u32) + HMAC-SHA256(secret, STORE_CONTEXT + client nonce + store nonce)
                      or REFUSED (u32), and the store closes the connection

The store proves the secret too, so an agent never mistakes a stranger's store (one that
took the port first) for its job's. Both sides compare in constant time. A request sent
before the exchange is answered with REFUSED and the connection is closed, and so is a
wrong proof, or no proof within ``AUTH_TIMEOUT``. Each refusal is counted and logged
with the peer's address. torch's client opens with ``PING``, so it reads REFUSED as a
wrong ping echo and fails. Our client without a secret recognises REFUSED and gives
a one-line error.

The secret comes from ``HARNESS_RDZV_SECRET`` (the value) or ``HARNESS_RDZV_SECRET_FILE``
(a file that only its owner may read). ``job_secret()`` reads it once, when the c10d
handler or the standalone store is built. It never goes on a command line or into a log
(``JobSecret``'s repr hides it), and the agent removes both variables from its workers'
environments (``SECRET_ENVS``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
from collections.abc import Callable, Mapping

from harness.errors import ConfigError

__all__ = ["ACCEPTED", "AUTH", "AUTH_TIMEOUT", "JobSecret", "NONCE_SIZE", "PROOF_SIZE", "REFUSED",
           "Refusal", "SECRET_ENV", "SECRET_ENVS", "SECRET_FILE_ENV", "StoreGate", "job_secret",
           "new_nonce"]

log = logging.getLogger(__name__)

#: the job's secret, by which a store peer proves it belongs to the job (never logged)
SECRET_ENV = "HARNESS_RDZV_SECRET"
#: a file holding the job's secret (read where the secret is not in the environment)
SECRET_FILE_ENV = "HARNESS_RDZV_SECRET_FILE"
#: what the agent removes from its workers' environments
SECRET_ENVS = (SECRET_ENV, SECRET_FILE_ENV)
#: the shortest secret accepted (``openssl rand -hex 32`` gives 64 characters)
MIN_SECRET_LENGTH = 16

#: the command byte that opens the exchange: far from torch's QueryType values (0..16 in
#: torch 2.13), so a torch server treats it as an unknown command and closes
AUTH = 0xA7
NONCE_SIZE = 32
PROOF_SIZE = hashlib.sha256().digest_size
#: the store's verdict on a proof (u32). REFUSED is also its answer to any request sent
#: before the exchange. It is above every pid, so it never matches our client's ping nonce.
ACCEPTED, REFUSED = 0x4F4B4159, 0x52454655  # "OKAY", "REFU"
#: a connection that has not proved the secret within this many seconds is refused (an
#: idle stranger must not hold a descriptor forever)
AUTH_TIMEOUT = 10.0
#: what each side signs: different strings, so one side's proof cannot be replayed as the
#: other side's
CLIENT_CONTEXT = b"harness rendezvous store v1: client"
STORE_CONTEXT = b"harness rendezvous store v1: store"


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_SIZE)


class JobSecret:
    """The job's secret. Its repr never shows the value (it must not reach a log)."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes):
        self._key = key

    def __repr__(self) -> str:
        return "JobSecret(<hidden>)"

    def password(self, service: str) -> str:
        """The job's password for ``service`` (a server that takes a user's password rather
        than a proof: etcd), derived from the secret, which itself never leaves this process."""
        return hmac.new(self._key, b"pytest-elastic password for " + service.encode(), hashlib.sha256).hexdigest()

    def client_proof(self, store_nonce: bytes, client_nonce: bytes) -> bytes:
        return hmac.new(self._key, CLIENT_CONTEXT + store_nonce + client_nonce, hashlib.sha256).digest()

    def store_proof(self, client_nonce: bytes, store_nonce: bytes) -> bytes:
        return hmac.new(self._key, STORE_CONTEXT + client_nonce + store_nonce, hashlib.sha256).digest()

    def client_proved(self, proof: bytes, store_nonce: bytes, client_nonce: bytes) -> bool:
        return hmac.compare_digest(proof, self.client_proof(store_nonce, client_nonce))

    def store_proved(self, proof: bytes, client_nonce: bytes, store_nonce: bytes) -> bool:
        return hmac.compare_digest(proof, self.store_proof(client_nonce, store_nonce))


class Refusal(Exception):
    """A connection did not prove the job secret (the message says how)."""


class StoreGate:
    """The store's side of the exchange, without the sockets. It answers AUTH with a
    nonce, judges the proof that comes back, and counts, logs and reports each refusal.
    A server has one and uses it on its own thread only."""

    def __init__(self, secret: JobSecret, on_refused: Callable[[str, str], None] | None = None):
        self._secret = secret
        self._on_refused = on_refused
        #: connections refused so far
        self.refused = 0

    @staticmethod
    def unproved(request: str) -> Refusal:
        """The refusal of a request (``"PING"``...) sent before the exchange."""
        return Refusal(f"sent {request} without proving it knows the job secret (a client "
                       f"without {SECRET_ENV}, or torch's)")

    @staticmethod
    def challenge(client_nonce: bytes) -> tuple[bytes, bytes]:
        """(client nonce, store nonce): the connection's open challenge. The store nonce
        is the answer to its AUTH."""
        return client_nonce, new_nonce()

    def admit(self, proof: bytes, challenge: tuple[bytes, bytes]) -> bytes:
        """The answer to a right proof (ACCEPTED and the store's own proof). Raises
        ``Refusal`` on a wrong one."""
        theirs, mine = challenge
        if not self._secret.client_proved(proof, mine, theirs):
            raise Refusal("wrong job secret")
        return struct.pack("<I", ACCEPTED) + self._secret.store_proof(theirs, mine)

    def refuse(self, peer: str, reason: str) -> None:
        """Count, log and report the refusal of ``peer``. Call it before the server answers
        REFUSED, so that whoever reads that answer finds the refusal counted."""
        self.refused += 1
        log.warning("rendezvous store: refused %s: %s", peer, reason)
        if self._on_refused is not None:
            try:
                self._on_refused(peer, reason)
            except Exception as e:  # a listener's failure must not stop the store
                log.warning("rendezvous store: the refusal listener failed: %s", e)


def job_secret(env: Mapping[str, str]) -> JobSecret | None:
    """The job secret from ``env`` (None if neither variable is set). Raises ``ConfigError``
    if both are set, if the file cannot be read or others may read it, or if the secret
    is shorter than ``MIN_SECRET_LENGTH``. The error never shows the secret."""
    value, path = env.get(SECRET_ENV), env.get(SECRET_FILE_ENV)
    if value is not None and path is not None:
        raise ConfigError(SECRET_FILE_ENV, path, f"cannot be set together with {SECRET_ENV}: "
                          "unset one of them")
    if path is not None:
        key = _read_secret_file(path)
        source = f"the file {SECRET_FILE_ENV} names"
    elif value is not None:
        key = value.encode()
        source = SECRET_ENV
    else:
        return None
    key = key.strip()
    if len(key) < MIN_SECRET_LENGTH:
        raise ConfigError("job secret", f"<{len(key)} characters>",
                          f"must be at least {MIN_SECRET_LENGTH} characters "
                          f"(e.g. `openssl rand -hex 32`)", source)
    return JobSecret(key)


def _read_secret_file(path: str) -> bytes:
    """The file's bytes. It must be a regular file that only its owner can read or
    write (0600 or stricter), because a secret that anyone can read protects nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        raise ConfigError(SECRET_FILE_ENV, path, f"cannot be read: {e.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(SECRET_FILE_ENV, path, "must name a regular file")
        if info.st_mode & 0o077:
            raise ConfigError(SECRET_FILE_ENV, path,
                              f"may be read by others (mode {stat.S_IMODE(info.st_mode):04o}): "
                              f"chmod 600 it")
        with os.fdopen(fd, "rb", closefd=False) as fp:
            return fp.read(64 * 1024)
    finally:
        os.close(fd)
