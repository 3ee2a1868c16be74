"""``harness.hosts``: its public names are pinned, and it keeps to its layer (it uses the
runtime's public API only; the runtime and the simulation's private parts stay out of it,
and the runtime never imports it). Read from the source with ``ast``, as
``tests/unit/test_layers.py`` does for the rest of ``harness``."""

from __future__ import annotations

import harness.hosts
from tests.unit.test_layers import ROOT, RUNTIME, imports, in_layer, module_name, private_part, sources

PUBLIC = {
    "CAPABILITIES", "FIELDS", "ClockOffset", "ClockSample", "CommandResult", "EventRelay", "HostAuthError",
    "HostCommandError", "HostError", "HostKeyError", "HostPythonError", "HostSpec", "HostTimeout", "HostUnreachable",
    "RemoteInfo", "RemoteProcess", "SshHost", "check_event", "controller_version", "load_hosts", "measure_offset",
    "last_line", "parse_host", "place", "refusal", "SILENT_LINK_S",
    "SrunHost", "SLURM_FIELDS", "SlurmAllocation", "SlurmSpec", "slurm_spec", "load_slurm", "stand_ins",
    "allocation_refusal",
}
#: what harness.hosts may import from the rest of harness (public names only)
ALLOWED = ("harness.errors", "harness.procs", "harness.hosts")


def test_public_names():
    assert set(harness.hosts.__all__) == PUBLIC
    assert all(hasattr(harness.hosts, name) for name in PUBLIC)


def test_hosts_imports_only_the_runtime_public_api():
    found = []
    for path in sorted((ROOT / "harness" / "hosts").rglob("*.py")):
        me = module_name(path)
        for line, module, names in imports(path):
            if module.split(".")[0] in ("pytest", "_pytest", "pytest_elastic"):
                found.append(f"{me}:{line} imports {module}")
            elif module.startswith("harness") and not in_layer(module, ALLOWED):
                found.append(f"{me}:{line} imports {module} (allowed: {', '.join(ALLOWED)})")
            elif in_layer(module, ("harness.errors", "harness.procs")) and private_part(module, names):
                found.append(f"{me}:{line} imports the runtime's private {private_part(module, names)}")
    assert found == []


def test_the_runtime_never_imports_hosts():
    found = [f"{module_name(path)}:{line}" for path in sources() if in_layer(module_name(path), RUNTIME)
             for line, module, _ in imports(path) if in_layer(module, ("harness.hosts",))]
    assert found == []
