"""The job secret's pure parts: where it comes from, what a bad one says (never the
secret itself), the proofs, and where a hosted store listens."""

from __future__ import annotations

import os

import pytest

from harness.errors import ConfigError
from harness.rendezvous import SECRET_ENV, SECRET_ENVS, SECRET_FILE_ENV
from harness.rendezvous._store_auth import (
    MIN_SECRET_LENGTH,
    NONCE_SIZE,
    JobSecret,
    job_secret,
    new_nonce,
)
from harness.rendezvous._store_host import listen_address

SECRET = "s3cret-" + "x" * 20


def _file(tmp_path, text: str, mode: int) -> str:
    path = tmp_path / "secret"
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_no_variable_means_no_secret():
    assert job_secret({}) is None
    assert set(SECRET_ENVS) == {SECRET_ENV, SECRET_FILE_ENV}


def test_the_value_and_the_file_give_the_same_secret(tmp_path):
    from_env = job_secret({SECRET_ENV: SECRET})
    from_file = job_secret({SECRET_FILE_ENV: _file(tmp_path, SECRET + "\n", 0o600)})
    assert from_env is not None and from_file is not None
    a, b = new_nonce(), new_nonce()
    assert len(a) == NONCE_SIZE and a != b
    assert from_file.client_proved(from_env.client_proof(a, b), a, b)  # the newline is not part of it


def test_the_secret_never_shows_in_a_repr_or_an_error(tmp_path):
    secret = job_secret({SECRET_ENV: SECRET})
    assert SECRET not in repr(secret) and "hidden" in repr(secret)
    short = "tooshort"
    with pytest.raises(ConfigError, match=rf"at least {MIN_SECRET_LENGTH} characters") as info:
        job_secret({SECRET_ENV: short})
    assert short not in str(info.value) and "<8 characters>" in str(info.value)


def test_a_secret_file_others_may_read_is_refused(tmp_path):
    path = _file(tmp_path, SECRET, 0o644)
    with pytest.raises(ConfigError, match=r"may be read by others \(mode 0644\): chmod 600 it"):
        job_secret({SECRET_FILE_ENV: path})


def test_a_missing_file_and_both_variables_are_one_line_errors(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match=rf"{SECRET_FILE_ENV}='.*nope' cannot be read: No such file"):
        job_secret({SECRET_FILE_ENV: missing})
    with pytest.raises(ConfigError, match=f"cannot be set together with {SECRET_ENV}"):
        job_secret({SECRET_ENV: SECRET, SECRET_FILE_ENV: _file(tmp_path, SECRET, 0o600)})


def test_proofs_bind_the_secret_both_nonces_and_the_side():
    secret, other = JobSecret(SECRET.encode()), JobSecret(b"another-secret-of-20")
    store, client = new_nonce(), new_nonce()
    proof = secret.client_proof(store, client)
    assert secret.client_proved(proof, store, client)
    assert not other.client_proved(proof, store, client)  # wrong secret
    assert not secret.client_proved(proof, new_nonce(), client)  # replayed to another challenge
    # a client's proof is no store's proof (no reflection of one side's answer)
    assert not secret.store_proved(secret.client_proof(client, store), store, client)
    assert secret.store_proved(secret.store_proof(client, store), client, store)


@pytest.mark.parametrize("host, bound", [
    ("127.0.0.1", "127.0.0.1"),
    ("127.0.0.5", "127.0.0.5"),
    ("localhost", "127.0.0.1"),  # IPv4 first: a client of the name tries each address
    ("0.0.0.0", ""),
    ("::", ""),
])
def test_a_hosted_store_listens_on_the_endpoint_address(host, bound):
    assert listen_address(host) == bound


def test_a_name_that_resolves_to_loopback_only_listens_everywhere(monkeypatch):
    """Debian's 127.0.1.1 for the host name: the other nodes resolve the name to an address
    this one cannot know, so the store cannot listen on one address."""
    import socket

    real = socket.getaddrinfo

    def fake(host, *args, **kwargs):
        if host == "myhost.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0))]
        if host == "node7.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::7", 0, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.7", 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    assert listen_address("myhost.example") == ""
    assert listen_address("node7.example") == "10.1.2.7"
