"""``harness.procs.frozen_imports``: a fork server's imports, out of its children's
garbage collections (in a fresh interpreter each: freezing is for the whole process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import gc, json, os
    from harness.procs import frozen_imports

    before = gc.get_freeze_count()
    enabled_before = gc.isenabled()
    with frozen_imports():
        during = gc.isenabled()
        import email.mime.multipart  # any module this interpreter had not imported
        made_inside = [[]]
    after, frozen = gc.isenabled(), gc.get_freeze_count()
    seen = {id(o) for o in gc.get_objects()}
    pid = os.fork()
    if pid == 0:
        a, b = [], []
        a.append(b); b.append(a)  # the child's own cycle: its collections still free it
        del a, b
        os.write(1, json.dumps({"child_enabled": gc.isenabled(), "child_freed": gc.collect(),
                                "child_frozen": gc.get_freeze_count()}).encode() + b"\\n")
        os._exit(0)
    os.waitpid(pid, 0)
    gc.disable()
    with frozen_imports():
        pass
    print(json.dumps({"before": before, "enabled_before": enabled_before, "during": during,
                      "after": after, "frozen": frozen,
                      "module_frozen": id(email.mime.multipart.__dict__) not in seen,
                      "inside_frozen": id(made_inside) not in seen,
                      "stays_off": not gc.isenabled()}))
""")


def test_imports_inside_are_frozen_for_the_children_and_the_collector_comes_back_as_it_was():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    child, parent = (json.loads(line) for line in out.stdout.splitlines())
    assert parent["before"] == 0 and parent["enabled_before"] and not parent["during"]
    assert parent["after"] and parent["frozen"] > 1000, parent  # the interpreter's and the import's
    assert parent["module_frozen"] and parent["inside_frozen"], parent
    assert parent["stays_off"], parent  # a collector that was off is left off
    assert child["child_enabled"] and child["child_freed"] == 2, child
    assert child["child_frozen"] > 1000, child  # inherited (less what was freed since: counted live)
