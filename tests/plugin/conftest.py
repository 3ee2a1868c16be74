"""The pytest sessions these tests start (``pytester``) join the test process's zygote
(``tests/conftest.py``'s ``warm_pool``) instead of starting one each: ``$HARNESS_POOL_ZYGOTE``
(``harness.sim.nodes.pool.SHARED_ZYGOTE_ENV``), which a session's ``WarmPool`` reads. A
session that imported torch and what its workers learned, again, for a job of a few seconds,
cost about 1.3 s of CPU each, on a 2-core runner. Its workers are the test process's
zygote's children then, so this process's leak check sees any it leaves behind. A test
about the session pool's own zygote (``test_pool.py``) takes the variable out."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def sessions_join_the_warm_zygote(warm_pool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.sim.nodes.pool import SHARED_ZYGOTE_ENV

    monkeypatch.setenv(SHARED_ZYGOTE_ENV, warm_pool.address())
