"""Host specs: URLs and hosts files parse to frozen ``HostSpec``s; every bad input is one
``ConfigError`` line naming the host and the field. No processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.hosts import FIELDS, HostSpec, load_hosts, parse_host


@pytest.mark.parametrize("url, address, user, port, label", [
    ("ssh://ci@10.0.0.5", "10.0.0.5", "ci", 22, "ci@10.0.0.5:22"),
    ("ssh://ci@10.0.0.6:2222", "10.0.0.6", "ci", 2222, "ci@10.0.0.6:2222"),
    ("ssh://root@node-3.example.org", "node-3.example.org", "root", 22, "root@node-3.example.org:22"),
    ("ssh://u@[fd00::5]:2200", "fd00::5", "u", 2200, "u@[fd00::5]:2200"),
])
def test_urls(url, address, user, port, label):
    spec = parse_host(url)
    assert (spec.address, spec.user, spec.port, spec.label) == (address, user, port, label)
    assert parse_host(spec.url) == spec


def test_url_with_fields():
    spec = parse_host("ssh://ci@10.0.0.5", python="/opt/venv/bin/python", capabilities=["netns"])
    assert spec.python == "/opt/venv/bin/python" and spec.capabilities == frozenset({"netns"})
    assert spec.trust_on_first_use is False and spec.known_hosts is None


@pytest.mark.parametrize("url, expected", [
    ("ssh://10.0.0.5", "host='ssh://10.0.0.5' must be ssh://user@address[:port] (no user) (from hosts)"),
    ("http://ci@10.0.0.5", "(the scheme is not ssh)"),
    ("ssh://ci:secret@10.0.0.5", "(a password does not belong in it (BatchMode: keys only))"),
    ("ssh://ci@10.0.0.5:99999", "(bad port)"),
    ("ssh://ci@10.0.0.5/home", "(nothing may follow the address)"),
    ("ssh://ci@-oProxyCommand=x", "address='-oproxycommand=x' must be an IP address or a host name"),
    ("ssh://-x@10.0.0.5", "user='-x' must be a user name"),
    (42, "host=42 must be ssh://user@address[:port] (from hosts)"),
])
def test_bad_urls(url, expected):
    with pytest.raises(ConfigError) as caught:
        parse_host(url)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("fields, expected", [
    ({"pyton": "x"}, "pyton='x' is not a host field (known: address, user, port, key, python"),
    ({"work_dir": "scratch"}, "work_dir='scratch' must be an absolute path on the host"),
    ({"shared_dir": "nfs"}, "shared_dir='nfs' must be an absolute path on the host, of a filesystem the job's hosts "
                            "share"),
    ({"capabilities": "netns"}, "capabilities='netns' must be a list of names"),
    ({"trust_on_first_use": "yes"}, "trust_on_first_use='yes' must be true or false"),
    ({"copy_script": 1}, "copy_script=1 must be true or false"),
    ({"max_sessions": 1}, "max_sessions=1 must be an int in [2, 1024]: the host's sshd MaxSessions"),
    ({"port": 2222}, "port=2222 is given by the URL already"),
])
def test_bad_fields_name_the_host_and_the_field(fields, expected):
    with pytest.raises(ConfigError) as caught:
        parse_host("ssh://ci@10.0.0.5", **fields)
    assert expected in str(caught.value)
    assert "ssh://ci@10.0.0.5" in str(caught.value) or "port" in fields


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def test_hosts_file(tmp_path: Path):
    (tmp_path / "keys").mkdir()
    for key in (tmp_path / "keys/ci_ed25519", tmp_path / "abs_key"):
        key.write_text("a private key\n")
    path = write(tmp_path, """
[defaults]
user = "ci"
key = "keys/ci_ed25519"
python = "/opt/elastic/bin/python"

[[host]]
address = "10.0.0.5"
port = 2222
work_dir = "/scratch"
capabilities = ["netns", "cgroups"]

[[host]]
address = "10.0.0.6"
user = "other"
key = "ABS_KEY"
trust_on_first_use = true
max_sessions = 4
copy_script = true
keep_missed = 0
exclusive = false
""".replace("ABS_KEY", str(tmp_path / "abs_key")))
    first, second = load_hosts(path)
    assert first == HostSpec(address="10.0.0.5", user="ci", port=2222, key=str(tmp_path / "keys/ci_ed25519"),
                             python="/opt/elastic/bin/python", work_dir="/scratch",
                             capabilities=frozenset({"netns", "cgroups"}))
    assert (second.user, second.key, second.port, second.trust_on_first_use) == ("other", str(tmp_path / "abs_key"),
                                                                                 22, True)
    assert (first.max_sessions, second.max_sessions) == (10, 4)
    assert (first.copy_script, second.copy_script) == (False, True)
    assert (first.keep_missed, second.keep_missed) == (20.0, 0.0)
    assert (first.exclusive, second.exclusive) == (True, False)


@pytest.mark.parametrize("text, expected", [
    ('[[host]]\naddress = "10.0.0.5"\nuser = "ci"\n\n[[host]]\naddress = "10.0.0.6"\nuser = "ci"\nport = "x"\n',
     "port='x' must be an int in [1, 65535] (from hosts.toml host[1] 10.0.0.6)"),
    ('[[host]]\naddress = "10.0.0.5"\n', "user=None is required (from hosts.toml host[0] 10.0.0.5)"),
    ('[[host]]\naddress = "10.0.0.5"\nuser = "ci"\npyhton = "x"\n', "pyhton='x' is not a host field"),
    ('[defaults]\nuser = "ci"\n[[host]]\naddress = "a"\n[[host]]\naddress = "a"\n',
     "address='a' names host ci@a:22 twice (from hosts.toml host[1])"),
    ('[[hosts]]\naddress = "a"\n', "table='hosts' is not one of a hosts file's ([defaults], [[host]])"),
    ('[defaults]\nuser = "ci"\n', "host=[] needs at least one [[host]] table"),
    ('[[host]\n', "is not TOML"),
    ('[[host]]\naddress = "a"\nuser = "ci"\nkeep_missed = -1\n',
     "keep_missed=-1 must be a number of seconds in [0, 3600]"),
    # a key that is not there: one line when the file loads, not a traceback at the first connect
    ('[[host]]\naddress = "a"\nuser = "ci"\nkey = "keys/gone"\n',
     "key='keys/gone' must be the path of a private key file: "),
])
def test_bad_hosts_files(tmp_path: Path, text, expected):
    with pytest.raises(ConfigError) as caught:
        load_hosts(write(tmp_path, text))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_hosts_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot be read: No such file or directory"):
        load_hosts(tmp_path / "nope.toml")


def test_every_field_has_a_row():
    """One row per HostSpec field: the URL keywords, the file and the checks cannot drift.
    ``scheduler`` is no hosts file's: a Slurm allocation's nodes carry it."""
    assert set(FIELDS) == set(HostSpec.__dataclass_fields__) - {"scheduler"}


def test_what_a_host_lacks_is_found_where_it_connects(tmp_path: Path):
    """A host listing cgroups with no cgroup filesystem mounted (started under ``ip netns
    exec``, which remounts /sys) was accepted, and failed only when a resource fault fired."""
    from harness.hosts import HostError
    from harness.hosts._remote import host_lacks
    from harness.hosts._ssh import RemoteInfo, check_capabilities

    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n")
    lacks = host_lacks(str(mounts), dev_fuse=str(tmp_path / "no-fuse"))
    assert lacks["cgroups"] == f"no cgroup filesystem is mounted ({mounts} lists none)"
    assert lacks["fuse"].startswith(f"{tmp_path / 'no-fuse'} cannot be opened (No such file")
    mounts.write_text("cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert "cgroups" not in host_lacks(str(mounts), dev_fuse=str(tmp_path / "no-fuse"))
    spec = parse_host("ssh://ci@10.0.0.5", capabilities=["cgroups", "netns"])
    info = RemoteInfo("3.11.7", "/usr/bin/python3", "0.1.0", "/tmp/w", 1, {"cgroups": "no cgroup filesystem is "
                                                                         "mounted (/proc/self/mounts lists none)",
                                                                         "fuse": "unlisted: not asked"})
    with pytest.raises(HostError) as caught:
        check_capabilities(spec, info)
    assert str(caught.value) == ("host ci@10.0.0.5:22: its capabilities list what it lacks: cgroups (no cgroup "
                                 "filesystem is mounted (/proc/self/mounts lists none)); take them out of its "
                                 "capabilities in the hosts file, or give the host them")
    check_capabilities(parse_host("ssh://ci@10.0.0.5", capabilities=["netns"]), info)  # lacks only what it lists
