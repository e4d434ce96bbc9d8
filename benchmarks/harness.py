"""What every benchmark that trains shares: a run cache, a process pool, an atomic results writer, the
machine's description, and the statistics the tables print.

    cache = RunCache(RESULTS / "NAME_runs.json")          # {key: record}, rewritten atomically per run
    pool = RunPool(train_one, cache, workers=2, desc="runs")
    pool.submit({"key": "adamw/lr0.004/seed0", ...})      # cached runs come back without training
    pool.run(on_done)                                       # on_done(job, record) may submit more jobs
    write_results(RESULTS, "NAME", markdown, data)          # benchmarks/results/NAME.{md,json}, atomically

An interrupted campaign continues where it stopped: every finished run is in the cache before the next
one is reported, and a finished campaign rebuilds its report from the cache without training.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

Job = dict[str, Any]
Record = dict[str, Any]


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunCache:
    """Finished runs, {key: record}, kept in one JSON file that is rewritten atomically after each run."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.records: dict[str, Record] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        if not isinstance(self.records, dict):
            raise ValueError(f"{self.path}: a run cache is a JSON object {{key: record}}; move this file away "
                             "to start the campaign afresh")

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def __getitem__(self, key: str) -> Record:
        return self.records[key]

    def __len__(self) -> int:
        return len(self.records)

    def get(self, key: str, default: Record | None = None) -> Record | None:
        return self.records.get(key, default)

    def put(self, key: str, record: Record) -> None:
        self.records[key] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(self.records, indent=1))


class RunPool:
    """Jobs (dicts with a "key") trained by `fn(job) -> record` in worker processes (spawned, so each sets
    its own threads), cached in `cache`; `on_done(job, record)` may submit further jobs (a learning-rate
    grid that extends itself, seeds after a chosen rate). workers <= 1 trains in this process."""

    def __init__(self, fn: Callable[[Job], Record], cache: RunCache, workers: int = 2, desc: str = "runs") -> None:
        from tqdm import tqdm  # progress bars only where a campaign runs

        self.fn, self.cache, self.workers = fn, cache, workers
        self.pending: dict[Future, Job] = {}
        self.ready: list[tuple[Job, Record]] = []
        self.queued: list[Job] = []
        self.submitted: set[str] = set()
        self.executor = (ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
                         if workers > 1 else None)
        self.bar = tqdm(total=0, unit="run", desc=desc)

    def submit(self, job: Job) -> None:
        """Queue `job` (once per key); a cached key is reported without training."""
        key = job["key"]
        if key in self.submitted:
            return
        self.submitted.add(key)
        self.bar.total += 1
        self.bar.refresh()
        if key in self.cache:
            self.ready.append((job, self.cache[key]))
        elif self.executor is not None:
            self.pending[self.executor.submit(self.fn, job)] = job
        else:
            self.queued.append(job)

    def run(self, on_done: Callable[[Job, Record], None] | None = None) -> None:
        """Until every submitted job has finished: store each record, then report it to `on_done`."""
        try:
            while self.ready or self.pending or self.queued:
                if self.ready:
                    job, record = self.ready.pop(0)
                elif self.queued:
                    job = self.queued.pop(0)
                    record = self.fn(job)
                    self.cache.put(job["key"], record)
                else:
                    done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
                    for fut in done:
                        job = self.pending.pop(fut)
                        record = fut.result()
                        self.cache.put(job["key"], record)
                        self.ready.append((job, record))
                    continue
                self.bar.update(1)
                self.bar.set_postfix_str(str(job["key"])[:60])
                if on_done is not None:
                    on_done(job, record)
        finally:
            if self.executor is not None:
                self.executor.shutdown(cancel_futures=True)
            self.bar.close()


def run_pool(fn: Callable[[Job], Record], jobs: Iterable[Job], cache: RunCache, workers: int = 2,
             desc: str = "runs") -> list[Record]:
    """Every job's record, in the jobs' order, training those the cache lacks."""
    jobs = list(jobs)
    pool = RunPool(fn, cache, workers, desc)
    for job in jobs:
        pool.submit(job)
    pool.run()
    return [cache[job["key"]] for job in jobs]


def interleaved_ms_per_step(setups: dict[str, tuple[Any, Any]], x: Any, y: Any, rounds: int = 5,
                            steps: int = 4, reduce: Callable[[list[float]], float] = statistics.median
                            ) -> dict[str, float]:
    """ms of one training step (zero_grad, forward + backward of `model(x, y)[1]`, `opt.step()`) per
    {name: (model, optimizer)}, timed in interleaved rounds in this process (round 0 warms up), so that the
    machine's background load hits every optimizer alike. `reduce` turns the timed steps into one figure: the
    median by default; statistics.mean where a step that refreshes a preconditioner every k steps must count
    (then `steps` should be a multiple of k)."""
    times: dict[str, list[float]] = {name: [] for name in setups}
    for r in range(rounds + 1):
        for name, (model, opt) in setups.items():
            for _ in range(steps):
                t = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                model(x, y)[1].backward()
                opt.step()
                if r:
                    times[name].append(time.perf_counter() - t)
    return {name: 1e3 * reduce(t) for name, t in times.items()}


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, load, Python and torch versions, date."""
    info: dict[str, Any] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                            "cpus": os.cpu_count(), "python": platform.python_version(),
                            "date": time.strftime("%Y-%m-%d")}
    try:
        info["load_average_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    try:
        import torch  # the version only; every benchmark that calls this has torch loaded already

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def write_results(out_dir: Path, name: str, markdown: str, data: dict[str, Any]) -> None:
    """The name's .md and .json files in `out_dir`, each written atomically; the JSON gains a "machine" entry."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / f"{name}.md", markdown if markdown.endswith("\n") else markdown + "\n")
    atomic_write_text(out_dir / f"{name}.json", json.dumps({**data, "machine": data.get("machine", machine())},
                                                          indent=1))


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    xs = list(values)
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def paired_diff_ci95(a: Iterable[float], b: Iterable[float]) -> tuple[float, float]:
    """95% interval of mean(a - b) for values paired by seed (Student's t with n - 1 degrees of freedom)."""
    from scipy.stats import t  # scipy only where an interval is reported

    d = [x - y for x, y in zip(a, b, strict=True)]
    if len(d) < 2:
        return (math.nan, math.nan)
    m, s = mean_std(d)
    half = float(t.ppf(0.975, len(d) - 1)) * s / math.sqrt(len(d))
    return (m - half, m + half)
