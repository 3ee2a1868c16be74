import pytest

from harness.agent import RunResult, WorkerSpec, WorkerState
from harness.errors import ConfigError, ElasticError


class _Handler:
    def get_run_id(self):
        return "r"


def spec(**kw):
    base = dict(role="trainer", local_world_size=2, rdzv_handler=_Handler(), entrypoint="python")
    base.update(kw)
    return WorkerSpec(**base)


def test_defaults_match_torch():
    s = spec()
    assert (s.max_restarts, s.monitor_interval, s.args) == (3, 0.1, ())
    assert s.master_port is None and s.master_addr is None and s.local_addr is None
    assert s.get_entrypoint_name() == "python"


@pytest.mark.parametrize("field,value,fragment", [
    ("local_world_size", 0, "local_world_size=0 must be an int >= 1"),
    ("max_restarts", -1, "max_restarts=-1 must be an int >= 0"),
    ("monitor_interval", 0, "monitor_interval=0 must be a number > 0"),
    ("master_port", 70000, "master_port=70000 must be in 0..65535"),
    ("role", "", "role='' must be a non-empty string"),
    ("entrypoint", 5, "entrypoint=5 must be a callable or a str"),
])
def test_bad_values_name_field_value_and_constraint(field, value, fragment):
    with pytest.raises(ConfigError) as info:
        spec(**{field: value})
    assert fragment in str(info.value)
    assert isinstance(info.value, ElasticError)


def test_fn_is_the_deprecated_entrypoint():
    def train():
        return 1

    s = WorkerSpec(role="r", local_world_size=1, rdzv_handler=_Handler(), fn=train)
    assert s.entrypoint is train and s.get_entrypoint_name() == "test_fn_is_the_deprecated_entrypoint.<locals>.train"


def test_worker_state_members_and_is_running():
    assert [s.name for s in WorkerState] == [
        "UNKNOWN", "INIT", "HEALTHY", "UNHEALTHY", "STOPPED", "SUCCEEDED", "FAILED"]
    running = {s for s in WorkerState if WorkerState.is_running(s)}
    assert running == {WorkerState.HEALTHY, WorkerState.UNHEALTHY}


def test_run_result_is_failed_only_for_failed():
    assert RunResult(WorkerState.FAILED).is_failed()
    assert not RunResult(WorkerState.UNHEALTHY).is_failed()
    assert RunResult(WorkerState.SUCCEEDED).return_values == {}
