"""The import cache on real files (``harness.procs._import_cache``): what a zygote's workers
imported, kept as module names between processes. Every cache here lives in ``tmp_path``."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from pathlib import Path

import pytest

from harness.procs import _import_cache
from harness.procs._import_cache import (
    IMPORT_CACHE_ENV,
    MAX_FILE_BYTES,
    ImportCache,
    Interpreter,
    import_cache_dir,
)
from harness.procs._preload import Preloader, preloadable, target_key

HERE = Interpreter("/venv/bin/python", "3.11.7 (main)", "2.13.0+cpu")
KEY = "script:abc"


def _cache(tmp_path: Path, interpreter: Interpreter = HERE) -> ImportCache:
    return ImportCache(str(tmp_path), interpreter, preloadable)


def _files(cache: ImportCache) -> list[str]:
    return sorted(os.listdir(cache.directory))


def test_names_round_trip_in_order_merged_and_filtered(tmp_path):
    cache = _cache(tmp_path)
    assert cache.names(KEY) == []  # nothing learned yet: no file, no complaint
    cache.remember(KEY, ["torch.distributed.checkpoint", "localmod", "json", "__main__"])
    cache.remember(KEY, ["json", "numpy.linalg"])
    again = _cache(tmp_path)  # another process's view
    assert again.names(KEY) == ["torch.distributed.checkpoint", "json", "numpy.linalg"]
    assert again.names("script:other") == []
    on_disk = json.loads(Path(cache.path(KEY)).read_text())
    assert "localmod" not in on_disk["modules"] and on_disk["target"] == KEY  # never written


def test_each_interpreter_and_torch_has_its_own_names(tmp_path):
    _cache(tmp_path).remember(KEY, ["json"])
    for other in (Interpreter("/other/python", HERE.python, HERE.torch),
                  Interpreter(HERE.executable, "3.12.1 (main)", HERE.torch),
                  Interpreter(HERE.executable, HERE.python, "2.14.0+cpu")):
        assert _cache(tmp_path, other).names(KEY) == [], other
    assert _cache(tmp_path).names(KEY) == ["json"]
    assert len(os.listdir(tmp_path)) == 1  # only the one that wrote has a directory


def test_a_write_is_whole_then_renamed_and_a_failed_one_leaves_the_old_file(tmp_path, monkeypatch, capsys):
    cache = _cache(tmp_path)
    cache.remember(KEY, ["json"])
    before = Path(cache.path(KEY)).read_bytes()

    def disk_full(data: object, fp, **_kw: object) -> None:  # writes half, then fails
        fp.write(json.dumps(data)[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_import_cache.json, "dump", disk_full)
    cache.remember(KEY, ["csv"])
    cache.remember(KEY, ["wave"])  # not tried again: said once
    monkeypatch.undo()
    assert Path(cache.path(KEY)).read_bytes() == before  # the reader's file never half written
    assert _files(cache) == [".lock", os.path.basename(cache.path(KEY))]  # no temporary file left
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and IMPORT_CACHE_ENV in err[0], err


def test_readers_never_see_half_a_file_while_writers_merge(tmp_path):
    """Two writers (each its own ``ImportCache``, as two zygotes) and a reader at once: the
    reader always gets a whole file, and no writer's names are lost to the other's."""
    names = {w: [f"xml.n{w}_{i}" for i in range(100)] for w in ("a", "b")}
    errors: list[str] = []

    def write(which: str) -> None:
        cache = _cache(tmp_path)
        for name in names[which]:
            cache.remember(KEY, [name])

    def read(done: threading.Event) -> None:
        path = _cache(tmp_path).path(KEY)
        while not done.is_set():
            try:
                text = Path(path).read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
            except ValueError:
                errors.append(text[-80:])

    done = threading.Event()
    reader = threading.Thread(target=read, args=(done,))
    reader.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in names]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join()
    assert errors == []
    kept = _cache(tmp_path).names(KEY)
    assert set(kept) == set(names["a"]) | set(names["b"])
    assert not [f for f in _files(_cache(tmp_path)) if f.startswith(".tmp-")]


@pytest.mark.parametrize("content", [
    b"not json {",
    b"[1, 2, 3]",
    json.dumps({"format": 99, "target": KEY, "modules": ["json"]}).encode(),
    json.dumps({"format": 1, "target": "script:someone-else", "modules": ["json"]}).encode(),
    json.dumps({"format": 1, "target": KEY, "modules": {"json": 1}}).encode(),
    json.dumps({"format": 1, "target": KEY, "modules": ["json"], "pad": " " * MAX_FILE_BYTES}).encode(),
    b"\xff\xfe\x00garbage",
], ids=["not-json", "a-list", "another-format", "another-target", "wrong-shape", "huge", "binary"])
def test_garbage_is_ignored_with_one_line_and_replaced_by_the_next_write(tmp_path, capsys, content):
    cache = _cache(tmp_path)
    os.makedirs(cache.directory)
    Path(cache.path(KEY)).write_bytes(content)
    Path(cache.directory, "avoid.json").write_bytes(content)
    assert cache.names(KEY) == [] and cache.names(KEY) == [] and cache.avoided() == set()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[zygote] import cache:") and cache.path(KEY) in err[0], err
    cache.remember(KEY, ["json"])
    assert _cache(tmp_path).names(KEY) == ["json"]


def test_names_that_may_not_be_preloaded_are_dropped_on_the_way_in(tmp_path, capsys):
    """The file is read by a process that imports what it names: a hand-edited (or
    hostile) file gets only torch, numpy and the standard library imported."""
    cache = _cache(tmp_path)
    os.makedirs(cache.directory)
    written = ["json", "localmod", "__main__", "antigravity", 5, None, "torch.nn", "json"]
    Path(cache.path(KEY)).write_text(json.dumps({"format": 1, "target": KEY, "modules": written}))
    assert cache.names(KEY) == ["json", "torch.nn"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ignored 6 of 8 names" in err[0], err


def test_avoided_names_are_kept_for_every_later_process(tmp_path):
    cache = _cache(tmp_path)
    cache.avoid("colorsys")
    cache.avoid("localmod")  # not a name this cache holds at all
    assert _cache(tmp_path).avoided() == {"colorsys"}


def test_the_least_recently_used_targets_and_stale_temporary_files_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(_import_cache, "MAX_TARGETS", 3)
    cache = _cache(tmp_path)
    keys = [f"script:{i}" for i in range(5)]
    for age, key in enumerate(keys):  # keys[0] the newest
        cache.remember(key, ["json"])
        os.utime(cache.path(key), (time.time() - 100 * (age + 1),) * 2)
    cache.avoid("colorsys")
    stale = Path(cache.directory, ".tmp-killed-writer")
    stale.write_text("{")
    os.utime(stale, (time.time() - 3600,) * 2)
    cache.names(keys[4])  # used now: the oldest file becomes the most recently used one
    pruned = _cache(tmp_path)
    assert [k for k in keys if pruned.names(k)] == [keys[0], keys[1], keys[4]]
    assert not stale.exists() and pruned.avoided() == {"colorsys"}


def test_where_the_cache_lives(tmp_path):
    assert import_cache_dir({"HOME": "/home/u"}) == "/home/u/.cache/pytest-elastic"
    assert import_cache_dir({"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg"}) == "/xdg/pytest-elastic"
    assert import_cache_dir({"HOME": "/home/u", "XDG_CACHE_HOME": "rel"}) == "/home/u/.cache/pytest-elastic"
    assert import_cache_dir({IMPORT_CACHE_ENV: str(tmp_path), "XDG_CACHE_HOME": "/xdg"}) == str(tmp_path)
    for off in ("0", "off", "OFF", " off "):
        assert import_cache_dir({IMPORT_CACHE_ENV: off}) is None


def test_an_unwritable_cache_is_said_once_and_the_zygote_goes_on(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    cache = ImportCache(str(blocker), HERE, preloadable)
    cache.remember(KEY, ["json"])
    cache.avoid("json")
    assert cache.names(KEY) == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0], err


# -- what a target is, and what the preloader keeps for it ---------------------------------


def _payload(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "call.pkl"
    path.write_bytes(data)
    return str(path)


def test_a_script_is_known_by_its_content_a_callable_by_its_function_never_unpickled(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "train.py").write_text("import torch\n")
    (tmp_path / "edited.py").write_text("import torch  # edited\n")
    same = [target_key(f"{d}/train.py", False, False, str(tmp_path)) for d in ("a", "b")]
    assert same[0] is not None and same[0] == same[1]  # a test's script in each run's tmp_path
    assert target_key("edited.py", False, False, str(tmp_path)) not in (None, same[0])
    assert target_key("missing.py", False, False, str(tmp_path)) is None
    assert target_key("pkg.train", True, False, "/repo") == "module:/repo:pkg.train"

    fn_payload = _payload(tmp_path, pickle.dumps((os.path.join, ("a", "b"), "/r/return.pkl")))
    assert target_key(fn_payload, False, True, "/") == f"callable:{os.path.join.__module__}.join"
    # protocol 0 naming a module that does not exist: read from the opcodes, nothing imported
    ghost = _payload(tmp_path, b"(cnot_a_module_anywhere\nmain\np0\n(tp1\nVr\np2\ntp3\n.")
    assert target_key(ghost, False, True, "/") == "callable:not_a_module_anywhere.main"
    assert "not_a_module_anywhere" not in __import__("sys").modules
    assert target_key(_payload(tmp_path, b"\x80\x05garbage"), False, True, "/") is None
    assert target_key(str(tmp_path / "none.pkl"), False, True, "/") is None


def test_the_preloader_keeps_what_a_target_imported_for_later_processes(tmp_path):
    preloader = Preloader(_cache(tmp_path))
    preloader.learn(["json", "localmod", 7], key=KEY)
    preloader.learn(["csv"], key=None)  # a worker that knows no target: queued, not kept
    preloader.learn(["wave"], key="x" * 2000)  # garbage key
    assert _cache(tmp_path).names(KEY) == ["json"]
    assert [f for f in _files(_cache(tmp_path)) if f.endswith(".json")] == [os.path.basename(
        _cache(tmp_path).path(KEY))]
    assert Preloader(_cache(tmp_path)).targets == {}  # loaded when a target is first forked for
