"""The benchmark harness: the run cache survives a restart, the pool trains each key once and lets a
finished run submit more, and the paired interval matches a hand computation."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from benchmarks import harness
from benchmarks.harness import RunCache, RunPool, mean_std, paired_diff_ci95, run_pool, write_results

CALLS: list[str] = []


def square(job: dict) -> dict:
    CALLS.append(job["key"])
    return {"value": job["x"] ** 2}


def test_cache_and_pool_train_each_key_once(tmp_path):
    CALLS.clear()
    cache = RunCache(tmp_path / "runs.json")
    seen = []

    def on_done(job, record):
        seen.append((job["key"], record["value"]))
        if job["x"] < 3:  # a finished run submits the next one, as a grid that extends itself does
            pool.submit({"key": f"x{job['x'] + 1}", "x": job["x"] + 1})

    pool = RunPool(square, cache, workers=1)
    pool.submit({"key": "x1", "x": 1})
    pool.submit({"key": "x1", "x": 1})  # the same key twice: trained once
    pool.run(on_done)
    assert seen == [("x1", 1), ("x2", 4), ("x3", 9)] and CALLS == ["x1", "x2", "x3"]
    # a restart reads the cache and trains nothing
    again = RunCache(tmp_path / "runs.json")
    assert run_pool(square, [{"key": "x2", "x": 2}, {"key": "x4", "x": 4}], again, workers=1) == [
        {"value": 4}, {"value": 16}]
    assert CALLS == ["x1", "x2", "x3", "x4"]
    assert json.loads((tmp_path / "runs.json").read_text())["x4"] == {"value": 16}


def test_statistics_and_writer(tmp_path):
    m, s = mean_std([1.0, 2.0, 4.0])
    assert math.isclose(m, 7 / 3) and math.isclose(s, math.sqrt(((1 - m) ** 2 + (2 - m) ** 2 + (4 - m) ** 2) / 2))
    lo, hi = paired_diff_ci95([2.0, 3.0, 5.0], [1.0, 1.0, 1.0])  # differences 1, 2, 4
    half = 4.302652729911275 * s / math.sqrt(3)  # t_{0.975, 2}
    assert math.isclose(lo, m - half) and math.isclose(hi, m + half)
    write_results(tmp_path, "demo", "# demo", {"a": 1})
    assert (tmp_path / "demo").with_suffix(".md").read_text() == "# demo\n"
    data = json.loads((tmp_path / "demo").with_suffix(".json").read_text())
    assert data["a"] == 1 and data["machine"]["cpus"] >= 1


def test_interleaved_timing_counts_a_refresh_step_in_the_mean_and_not_in_the_median(monkeypatch):
    """A fake clock: every step takes 1 ms, and every 10th step of the refreshing optimizer 91 ms more."""
    clock = [0.0]
    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        def forward(self, x, y):
            return None, (self.w * x).sum()

    class Opt:
        def __init__(self, refresh_every: int | None) -> None:
            self.refresh_every, self.steps = refresh_every, 0

        def zero_grad(self, set_to_none: bool = True) -> None:
            pass

        def step(self) -> None:
            self.steps += 1
            clock[0] += 1e-3 + (0.091 if self.refresh_every and self.steps % self.refresh_every == 0 else 0.0)

    setups = {"plain": (Model(), Opt(None)), "refreshing": (Model(), Opt(10))}
    x = torch.ones(2)
    median = harness.interleaved_ms_per_step(setups, x, None, rounds=3, steps=10)
    assert median["plain"] == median["refreshing"] == pytest.approx(1.0)
    mean = harness.interleaved_ms_per_step(setups, x, None, rounds=3, steps=10, reduce=statistics.mean)
    assert mean["plain"] == pytest.approx(1.0) and mean["refreshing"] == pytest.approx(10.1)
