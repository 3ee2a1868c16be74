"""Scenario files and ``--elastic-schedule`` JSON under thousands of Faker-made bad values.

Each input goes through what the plugin does with it before any job starts: a scenario
is parsed as TOML, checked (``harness.sim.schema.check_scenario``) and, if accepted, its
faults are built (``from_spec``), its chaos fitted (``_chaos_around``) and a chaos
schedule drawn for its node counts; a schedule is checked (``parse_schedule``) and, if
accepted, built (``schedules_from_json``) and spelled back. Every input must end
accepted (and then all of that works) or refused in one line per problem.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.sim import schema
from tests.fuzz._bad import Bad, cases, run_target

FAULT_KEYS = sorted(schema.SPEC_KEYS)
JOB_KEYS = [key.name for key in schema.SCENARIO_JOB_OPTIONS]
EXPECT_KEYS = [key.name for key in schema.EXPECT_KEYS]


def bad_value(b: Bad, depth: int = 0) -> Any:
    """A TOML/JSON value of any type, odd more often than not."""
    kind = b.rng.randrange(12)
    if kind == 0:
        return b.clean(b.any())
    if kind == 1:
        return b.rng.choice([0, -1, 1, 2, 3, 2**31, 2**63 - 1, -(2**63), 10**30, -(10**30)])
    if kind == 2:
        return b.rng.choice([0.0, -0.0, 0.5, -1.5, 1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan])
    if kind == 3:
        return b.rng.choice([True, False])
    if kind == 4 and depth < 2:
        return [bad_value(b, depth + 1) for _ in range(b.rng.randint(0, 3))]
    if kind == 5 and depth < 2:
        return {b.clean(b.rng.choice([b.any(), *FAULT_KEYS])): bad_value(b, depth + 1)
                for _ in range(b.rng.randint(0, 3))}
    if kind == 6:
        return datetime.datetime(2026, 11, 25, 18, 0, b.rng.randint(0, 59))
    if kind == 7:
        return b.rng.choice(list(schema.FAULT_KINDS) + list(schema.STATES) + ["all", "store", "1mbit"])
    if kind == 8:
        return b.rng.choice(["1:2", "2", "0:1", "2:1", "1:2:3", "²", "1: 2", " 1", "1mbit", "mbit", "9"])
    return b.rng.randint(-3, 9)


def fault_spec(b: Bad) -> Any:
    """A fault spec: a valid one with one to three keys made odd, or anything at all."""
    if b.rng.random() < 0.1:
        return bad_value(b)
    spec: dict[str, Any] = {"kind": b.rng.choice(list(schema.FAULT_KINDS))}
    for name in b.rng.sample(FAULT_KEYS, b.rng.randint(0, 3)):
        spec[name] = bad_value(b)
    if b.rng.random() < 0.2:
        spec[b.clean(b.any())] = bad_value(b)
    return spec


def scenario(b: Bad) -> dict[str, Any]:
    """The README's scenario with a few keys, tables or faults made odd."""
    data: dict[str, Any] = {
        "description": "fuzz",
        "job": {"script": "scripts/train.py", "nnodes": "1:2", "nproc_per_node": 2, "steps": 20},
        "fault": [{"kind": "kill_worker", "node": 0, "local_rank": 1, "exit_code": 3, "at_step": 5}],
        "expect": {"state": "SUCCEEDED", "restarts": 1},
    }
    for _ in range(b.rng.randint(1, 3)):
        where = b.rng.randrange(6)
        if not all(isinstance(data.get(t), c) for t, c in (("job", dict), ("fault", list), ("expect", dict))):
            break  # a table already replaced by a value: nothing left to reach into
        if where == 0:
            data["job"][b.rng.choice(JOB_KEYS)] = bad_value(b)
        elif where == 1:
            data["expect"][b.rng.choice(EXPECT_KEYS)] = bad_value(b)
        elif where == 2:
            data["fault"].append(fault_spec(b))
        elif where == 3 and data["fault"]:
            data["fault"][0] = fault_spec(b)
        elif where == 4:
            data[b.rng.choice(["job", "fault", "expect", b.clean(b.any())])] = bad_value(b)
        else:
            data["job"].pop(b.rng.choice(["script", "nnodes"]), None)
    return data


def toml_value(value: Any) -> str:
    """``value`` as TOML (inline tables and arrays: any nesting, one line)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else {math.inf: "inf", -math.inf: "-inf"}.get(value, repr(value))
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, str):  # TOML's basic string escapes are JSON's, plus DEL
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007F")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_value(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(b: Bad, data: dict[str, Any]) -> str:
    text = "\n".join(f"{toml_value(str(k))} = {toml_value(v)}" for k, v in data.items()) + "\n"
    mangle = b.rng.randrange(8)
    if mangle == 0:  # a slice of the file replaced by garbage: mostly not TOML any more
        at = b.rng.randrange(len(text))
        return text[:at] + b.clean(b.any()) + text[at + b.rng.randint(0, 20):]
    if mangle == 1:  # nesting deeper than any parser's recursion
        depth = b.rng.choice([50, 500, 5000])
        return text + "deep = " + "[" * depth + "]" * depth + "\n"
    return text


def one_line(text: str) -> bool:
    return len(str(text).splitlines()) <= 1


def check_scenario_text(text: str) -> str:
    """What collection and the run do before launching; 'accepted', 'refused' or 'toml'."""
    from harness.sim.faults import from_spec
    from harness.sim.faults.chaos import ChaosConfig, generate_schedule
    from pytest_elastic._scenarios import _chaos_around, _parse, _validate

    try:
        data = _parse(text)
    except ValueError as e:
        assert one_line(str(e)), f"TOML error not one line: {e}"
        return "toml"
    problems = _validate(data)
    for problem in problems:
        assert one_line(problem), f"problem not one line: {problem!r}"
    if problems:
        return "refused"
    job, faults = data["job"], data.get("fault", [])
    float(job.get("timeout", 120.0))
    [str(a) for a in job.get("args", [])]  # noqa: B018  (as runtest does)
    for spec in faults:
        from_spec(spec)
    chaos = _chaos_around(ChaosConfig(seed=1, kinds=tuple(schema.CHAOS_KINDS)), faults,
                          job.get("max_restarts", 3))
    nnodes = str(job.get("nnodes", "1:1")).split(":")
    low, high = int(nnodes[0]), int(nnodes[-1])
    # as Cluster.launch: nodes within nnodes (it refuses others); not a million nodes,
    # which chaos would list one by one (a cluster that size is refused by the machine)
    if chaos is not None and 1 <= job.get("nodes", high) <= high <= 1000:
        generate_schedule(1, chaos.kinds, low, high, job.get("nproc_per_node", 1),
                          job.get("max_restarts", 3), max_faults=chaos.max_faults,
                          initial_nodes=job.get("nodes"), reserved_nodes=chaos.reserved_nodes)
    return "accepted"


def test_scenario_files() -> None:
    outcomes = run_target("scenario files", 2000, lambda b: toml_text(b, scenario(b)), check_scenario_text,
                          shown=lambda text: text[:2000])
    assert len(outcomes) == 3, outcomes  # accepted, refused and not TOML all reached


def schedule_text(b: Bad) -> str:
    kind = b.rng.randrange(10)
    if kind == 0:
        return b.clean(b.any())
    if kind == 1:
        depth = b.rng.choice([50, 500, 5000, 200_000])
        return "[" * depth + "]" * depth
    if kind == 2:
        return json.dumps(bad_value(b), default=str)
    jobs = [[fault_spec(b) if b.rng.random() < 0.5 else {"kind": "kill_worker", "after_healthy": 0.3}
             for _ in range(b.rng.randint(0, 3))] for _ in range(b.rng.randint(1, 3))]
    text = json.dumps(jobs, default=str)
    if kind == 3:  # JSON's own non-standard numbers
        text = text.replace("0.3", b.rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "0.3"]))
    if kind == 4:
        at = b.rng.randrange(len(text))
        text = text[:at] + b.clean(b.any()) + text[at:]
    return text


def check_schedule_text(text: str) -> str:
    from pytest_elastic._settings import parse_schedule
    from pytest_elastic._shrink import schedules_from_json, schedules_to_json

    try:
        parse_schedule(text)
    except ValueError as e:
        assert one_line(str(e)), f"error not one line: {e}"
        return "refused"
    built = schedules_from_json(text)
    spelled = schedules_to_json(built)
    if spelled is not None:
        assert schedules_from_json(spelled) == built, f"spelled back differently: {spelled}"
    return "accepted"


def test_schedule_json() -> None:
    outcomes = run_target("--elastic-schedule", 3000, schedule_text, check_schedule_text,
                          shown=lambda text: text[:2000])
    assert len(outcomes) == 2, outcomes


END_TO_END_FILES = 40


def test_scenario_files_collected_by_pytest(tmp_path: Path) -> None:
    """The plugin itself, in one real ``pytest --collect-only`` over fuzz-made scenario
    files: each refused file is one collection error of one line, the rest are items;
    no traceback, no internal error."""
    folder = tmp_path / "scenarios"
    folder.mkdir()
    refused = 0
    for i, b in cases(END_TO_END_FILES * 3, nul=False):  # a file holds no lone surrogate
        text = toml_text(b, scenario(b))
        if check_scenario_text(text) == "accepted":
            if i % 10:
                continue  # a few accepted files: they must collect as items
        else:
            refused += 1
        (folder / f"case_{i}.toml").write_text(text, encoding="utf-8")
        if refused >= END_TO_END_FILES:
            break
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                             "-p", "no:cacheprovider", "scenarios"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    out = result.stdout + result.stderr
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-5000:]
    assert out.count("ERROR collecting") == refused, out[-5000:]
    bodies = re.findall(r"_ ERROR collecting [^\n]*\n(.*?)\n(?=_{3,}|={3,})", out, re.S)
    assert len(bodies) == refused and all("\n" not in body for body in bodies), bodies
