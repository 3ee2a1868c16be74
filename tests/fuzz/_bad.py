"""Seeded bad input, made by Faker: what a user (or a broken peer) may really type or send.

One ``Bad(seed)`` yields the same inputs in the same order on every machine, so a failure
is replayed with ``ELASTIC_FUZZ_SEED=<seed>``. Each generator returns text; the targets
turn it into argv, TOML, JSON, FIFO lines or socket bytes.
"""

from __future__ import annotations

import os
import random
import string
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from faker import Faker

T = TypeVar("T")

#: the seed CI runs with (deterministic); ``ELASTIC_FUZZ_SEED`` replays another
DEFAULT_SEED = 17
#: inputs per target = BASE * ELASTIC_FUZZ_SCALE (default 1): raise it for a longer soak
SCALE = float(os.environ.get("ELASTIC_FUZZ_SCALE", "1"))

#: one line per target run in this process, for the terminal summary
SUMMARY: list[str] = []

_LOCALES = ["en_US", "ja_JP", "ar_AA", "ru_RU", "zh_CN", "he_IL", "hi_IN", "el_GR"]
_faker: Faker | None = None


def seed() -> int:
    return int(os.environ.get("ELASTIC_FUZZ_SEED", DEFAULT_SEED))


def count(base: int) -> int:
    return max(1, int(base * SCALE))


def _shared_faker() -> Faker:
    """One multi-locale Faker per process (building it costs ~0.2 s); reseeded per use."""
    global _faker
    if _faker is None:
        _faker = Faker(_LOCALES)
    return _faker


#: numbers a parser must refuse or bound: off by one, past every integer width, not
#: finite, in other scripts' digits, in notations int()/float() half accept
OUT_OF_RANGE = [
    "-1", "0", "-0", "65536", "99999", "2147483648", "4294967296", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "18446744073709551616", "1" + "0" * 400,
    "nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1e309", "1e-400", "0x10", "0o7", "0b1",
    "1_000", "3.5", "+7", " 3 ", "3\t", "٣", "²", "①", "३", "1e3", "--5", "-", "", " ",
]

_GARBAGE_ATOMS = ["\n", "\r\n", "\t", "\x1b[31m", "\u202e", "\ufeff", "\u200b", "\\", "\"", "'",
                  "`", "$(", "${", "%s", "%n", "{}", "{tmp}", "[", "]", ":", "::", ",", ",,", "=",
                  "==", "@", "#", ";", "|", "&", "*", "?", "~", "..", "/", "//", "-", "--",
                  "\x7f", "\x00", "\ud800", "😀", "🏳️‍🌈", "ﷺ", "Ω", "ß", "İ", "\u0301"]


class Bad:
    """Bad (and borderline good) values of every kind the brief names."""

    def __init__(self, seed: int, nul: bool = True):
        self.rng = random.Random(seed)
        self.fake = _shared_faker()
        self.fake.seed_instance(seed)
        self._nul = nul  # argv and environ cannot carry NUL or lone surrogates

    # -- kinds ---------------------------------------------------------------------------

    def hostname(self) -> str:
        f = self.fake
        return self.rng.choice([f.hostname, f.domain_name, f.domain_word, f.hostname])()

    def ipv4(self) -> str:
        f = self.fake
        return self.rng.choice([f.ipv4, f.ipv4_private, lambda: f.ipv4(network=True),
                                lambda: "256.1.1.1", lambda: "1.2.3", lambda: "0.0.0.0"])()

    def ipv6(self) -> str:
        f = self.fake
        addr = self.rng.choice([f.ipv6, lambda: f.ipv6(network=True), lambda: "::1",
                                lambda: "::", lambda: "fe80::1%eth0", lambda: "[::1", lambda: "::1]"])()
        return self.rng.choice([addr, f"[{addr}]", f"[{addr}]:{self.port()}", f"{addr}:{self.port()}"])

    def port(self) -> str:
        return self.rng.choice([str(self.fake.port_number()), str(self.rng.randint(0, 70000)),
                                self.rng.choice(OUT_OF_RANGE)])

    def endpoint(self) -> str:
        host = self.rng.choice([self.hostname, self.ipv4, self.ipv6, self.url, self.garbage])()
        return self.rng.choice([host, f"{host}:{self.port()}", f"{host}:", f":{self.port()}",
                                f"{host}:{self.port()}:{self.port()}"])

    def url(self) -> str:
        f = self.fake
        return self.rng.choice([f.url, f.uri, lambda: f.url(schemes=["etcd", "tcp", "file"]),
                                lambda: "http://" + f.ipv6()])()

    def unicode(self) -> str:
        f = self.fake
        return self.rng.choice([lambda: f.text(max_nb_chars=self.rng.choice([10, 80, 300])),
                                f.name, f.word, f.emoji, f.address, f.user_name])()

    def path(self) -> str:
        """Over-long and odd file paths: past PATH_MAX, components past NAME_MAX, unicode."""
        f = self.fake
        kind = self.rng.randrange(6)
        if kind == 0:
            words = f.words(nb=30)
            return "/".join(self.rng.choices(words, k=self.rng.randint(600, 1200)))  # > PATH_MAX
        if kind == 1:
            return "/tmp/" + "x" * self.rng.randint(256, 600)  # > NAME_MAX
        if kind == 2:
            return f.file_path(depth=self.rng.randint(1, 8), extension="py")
        if kind == 3:
            return os.path.join(*(f.word() for _ in range(3))) + self.rng.choice([".py", "", "/", ".toml"])
        if kind == 4:
            return self.rng.choice(["/", ".", "..", "/dev/null", "/proc/self/mem", "~", "/etc/shadow"])
        return f.file_name()

    def number(self) -> str:
        kind = self.rng.randrange(4)
        if kind == 0:
            return self.rng.choice(OUT_OF_RANGE)
        if kind == 1:
            return str(self.rng.choice([-1, 1]) * self.rng.randint(0, 2 ** self.rng.choice([8, 16, 31, 63, 64, 200])))
        if kind == 2:
            return repr(self.rng.uniform(-1e6, 1e6) * 10.0 ** self.rng.randint(-300, 300))
        return self.fake.pystr_format("##?#")

    def garbage(self) -> str:
        kind = self.rng.randrange(4)
        if kind == 0:
            text = "".join(self.rng.choice(_GARBAGE_ATOMS) for _ in range(self.rng.randint(1, 8)))
        elif kind == 1:
            text = "".join(chr(self.rng.randint(1, 0x2FFFF)) for _ in range(self.rng.randint(1, 40)))
        elif kind == 2:
            text = self.fake.pystr(min_chars=0, max_chars=self.rng.choice([5, 50, 5000]))
        else:
            text = "".join(self.rng.choice(string.printable) for _ in range(self.rng.randint(0, 30)))
        return self.clean(text)

    def clean(self, text: str) -> str:
        """``text`` as a process argument or environment value can carry it."""
        if self._nul:
            return text
        return "".join(c for c in text if c != "\x00" and not 0xD800 <= ord(c) <= 0xDFFF)

    def any(self) -> str:
        return self.clean(self.rng.choice(self.KINDS)(self))

    KINDS: list[Callable[[Bad], str]] = [hostname, ipv4, ipv6, endpoint, url, unicode, path,
                                         number, number, garbage, garbage]

    def blob(self, limit: int = 300) -> bytes:
        """Raw bytes: random, or text of the kinds above in some encoding."""
        if self.rng.random() < 0.5:
            return self.rng.randbytes(self.rng.randint(0, limit))
        return self.any().encode(self.rng.choice(["utf-8", "utf-16", "latin-1"]), "replace")[:limit]


def cases(n: int, seed_: int | None = None, **kwargs: object) -> Iterator[tuple[int, Bad]]:
    """``n`` case indices with one generator seeded once (reseeding Faker per case costs
    more than the case): the whole sequence, hence case ``i``, replays from the seed."""
    bad = Bad(seed() if seed_ is None else seed_, **kwargs)  # type: ignore[arg-type]
    for i in range(n):
        yield i, bad


def replay_hint(target: str, i: int, shown: object) -> str:
    return (f"fuzz target {target!r} failed at case {i} (ELASTIC_FUZZ_SEED={seed()}); "
            f"input: {shown!r}")


def why(e: BaseException) -> str:
    """A broken check's own message; anything else with the frames it came from."""
    if isinstance(e, AssertionError):
        return str(e)
    return f"{type(e).__name__}: {str(e)[:300]}\n{traceback.format_exc(limit=-4)}"


def run_target(target: str, base: int, make: Callable[[Bad], T], check: Callable[[T], str],
               shown: Callable[[T], object] = lambda x: x, **kwargs: Any) -> dict[str, int]:
    """Feed ``count(base)`` inputs from ``make`` to ``check`` (which returns the outcome's
    name, or raises); fail on the first that raises, naming the case, the seed and the
    input; print how many were tried, how fast, and the outcomes."""
    n = count(base)
    outcomes: dict[str, int] = {}
    start = time.monotonic()
    for i, b in cases(n, **kwargs):
        value = make(b)
        try:
            outcome = check(value)
        except BaseException as e:
            pytest.fail(f"{replay_hint(target, i, shown(value))}\n{why(e)}")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    line = (f"{target}: {n} inputs in {time.monotonic() - start:.1f}s "
            f"(ELASTIC_FUZZ_SEED={seed()}): {outcomes}")
    print(f"\nfuzz {line}")
    SUMMARY.append(line)  # tests/fuzz/conftest.py shows it in the terminal summary
    return outcomes
