"""What the observer tests share: the two backends as a fixture, and one observed run."""

from __future__ import annotations

import pytest

from torch_adapter.routing import observe
from torch_adapter.routing.observe import ObserveResult, OpObserver

needs_cpp = pytest.mark.skipif(not observe.is_compiled_available(),
                               reason="no C++ compiler/ninja: the C++ observer cannot be built")
BACKENDS = [pytest.param("cpp", marks=needs_cpp), "python"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def observed(backend: str, fn) -> ObserveResult:
    obs = OpObserver(backend).start()
    try:
        fn()
    finally:
        result = obs.stop()
    assert result.backend == backend and obs.backend == backend
    assert result.errors == []
    return result
