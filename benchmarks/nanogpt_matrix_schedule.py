"""The nanoGPT campaign's schedule: per arm and regime, the rate grid that extends at an edge, then weight
decay at the chosen rate, then seeds; the screening pass's verdict; one run cache per regime."""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import RunCache, mean_std
from benchmarks.nanogpt_matrix_runs import ARMS, NAME, job_for

WEIGHT_DECAYS = (0.0, 0.05, 0.1)
SEEDS = 3


class Tuning:
    """One arm in one regime: its rate grid (seed 0, decay 0), then decays at the chosen rate, then seeds.
    In the screening regime the rate grid alone, and for Muon its seeds at the chosen rate (the spread)."""

    def __init__(self, regime: str, setup: dict, arm: str, quick: bool) -> None:
        self.regime, self.setup, self.arm, self.quick = regime, setup, arm, quick
        self.screen = regime == "screen"
        self.n_seeds = 2 if quick else SEEDS
        self.grid = list(ARMS[arm]["grid"][1:] if quick else ARMS[arm]["grid"])
        self.extensions = 0
        self.rates: dict[float, float] = {}   # lr -> final val (seed 0, decay 0)
        self.decays: dict[float, float] = {}  # wd -> final val (seed 0, chosen lr)
        self.lr: float | None = None
        self.wd: float | None = None
        self.runs: dict[int, dict] = {}       # seed -> run at (lr, wd)
        self.seed0: dict[tuple[float, float], dict] = {}  # (lr, wd) -> the seed-0 run

    def first_jobs(self) -> list[dict]:
        return [job_for(self.regime, self.setup, self.arm, lr, 0.0, 0) for lr in self.grid]

    def done(self, job: dict, run: dict) -> list[dict]:
        """Record a finished run; the jobs it makes due."""
        if job["seed"] == 0:
            self.seed0[(job["lr"], job["wd"])] = run
        if self.lr is None and job["wd"] == 0.0 and job["seed"] == 0:
            self.rates[job["lr"]] = run["final_val"]
            if len(self.rates) < len(self.grid):
                return []
            best = min(self.rates, key=lambda lr: (self.rates[lr], lr))
            edge = sorted(self.grid)
            extra = edge[0] / 2 if best == edge[0] else edge[-1] * 2 if best == edge[-1] else None
            if extra is not None and self.extensions < 2 and not self.quick:
                self.extensions += 1
                self.grid.append(extra)
                return [job_for(self.regime, self.setup, self.arm, extra, 0.0, 0)]
            self.lr = best
            self.decays[0.0] = self.rates[best]
            if self.screen:
                self.wd = 0.0
                self.runs[0] = self.seed0[(best, 0.0)]
                seeds = range(1, self.n_seeds) if self.arm == "muon" else range(0)
                return [job_for(self.regime, self.setup, self.arm, best, 0.0, s) for s in seeds]
            return [job_for(self.regime, self.setup, self.arm, best, wd, 0) for wd in WEIGHT_DECAYS if wd]
        if self.lr is not None and self.wd is None and job["lr"] == self.lr and job["seed"] == 0:
            self.decays[job["wd"]] = run["final_val"]
            if len(self.decays) < len(WEIGHT_DECAYS):
                return []
            self.wd = min(self.decays, key=lambda wd: (self.decays[wd], wd))
            self.runs[0] = self.seed0[(self.lr, self.wd)]
            seeds = range(1, self.n_seeds)
            return [job_for(self.regime, self.setup, self.arm, self.lr, self.wd, s) for s in seeds]
        if job["lr"] == self.lr and job["wd"] == self.wd:
            self.runs[job["seed"]] = run
        return []

    def seed_runs(self) -> list[dict]:
        return [self.runs[s] for s in sorted(self.runs)]

    def finished(self) -> bool:
        if self.screen:
            return self.lr is not None and len(self.runs) == (self.n_seeds if self.arm == "muon" else 1)
        return len(self.runs) == self.n_seeds


class RegimeCaches:
    """One run cache per regime (nanogpt_matrix_<regime>_runs.json), so that two regimes can train in two
    processes at once; looked up by the regime that starts each key."""

    def __init__(self, out: Path, regimes: list[str]) -> None:
        self.caches = {r: RunCache(out / f"{NAME}_{r}_runs.json") for r in regimes}

    def _of(self, key: str) -> RunCache:
        regime = key.split("/", 2)[1] if key.startswith("timing/") else key.split("/", 1)[0]
        return self.caches[regime]

    def __contains__(self, key: str) -> bool:
        return key in self._of(key)

    def __getitem__(self, key: str) -> dict:
        return self._of(key)[key]

    def get(self, key: str, default: dict | None = None) -> dict | None:
        return self._of(key).get(key, default)

    def put(self, key: str, record: dict) -> None:
        self._of(key).put(key, record)


def screened_out(tunings: dict[tuple[str, str], Tuning]) -> dict[str, str]:
    """Arms the screening pass drops from the reference regime: their best grid loss is worse than Muon's
    mean by more than two of Muon's seed spreads. {} until the screen has finished for Muon."""
    muon = tunings.get(("screen", "muon"))
    if muon is None or not muon.finished():
        return {}
    m, s = mean_std(r["final_val"] for r in muon.seed_runs())
    out = {}
    for (regime, arm), t in tunings.items():
        if regime == "screen" and t.lr is not None and arm not in ("muon", "adamw"):
            best = t.rates[t.lr]
            if best > m + 2 * s:
                out[arm] = f"{best:.4f} > Muon's {m:.4f} + 2 x {s:.4f}"
    return out


def replay(tunings: dict[tuple[str, str], Tuning], cache: RegimeCaches, by_key: dict[str, Tuning],
           phase: tuple[str, ...]) -> None:
    """Advance every tuning of `phase` through the runs the cache holds, training nothing (--report)."""
    pending = [(t, job) for (regime, _), t in tunings.items() if regime in phase for job in t.first_jobs()]
    while pending:
        t, job = pending.pop(0)
        by_key[job["key"]] = t
        if job["key"] in cache:
            pending += [(t, due) for due in t.done(job, cache[job["key"]])]
