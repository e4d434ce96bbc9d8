"""pytest set-up. Under CI (CI=true) hypothesis draws the same examples every run, so a submission is
judged on a fixed set; locally each run explores new examples. The `one_thread` fixture serves the tests
of benchmark scripts (imported from the `benchmarks` package: run pytest from the repository root)."""

import os

import pytest
import symo.compiler as compiler
import torch
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="module")
def one_thread_module():
    """`one_thread` for a whole test module (`pytestmark = pytest.mark.usefixtures("one_thread_module")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """Tiny matmuls: one thread avoids OpenMP spin-waits on a loaded 2-core machine (a 20x slowdown seen)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fresh_memory(monkeypatch: pytest.MonkeyPatch):
    """A new 'process': an empty in-memory compile cache (restored after the test). Call it to empty it again."""
    def reset() -> None:
        monkeypatch.setattr(compiler, "_MEMORY", {})
        monkeypatch.setattr(compiler, "_DISKS", {})  # a new process re-reads the cache's secret

    reset()
    return reset
