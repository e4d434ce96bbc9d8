"""benchmarks/matrix_sensing.py: problem generation, the nuclear-norm reference, the run cache, and the batched
trainer used by the dial and the tail against the zoo optimizers and symo.Symo run one at a time."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import matrix_sensing as ms
from benchmarks import sensing_core as sc

pytestmark = pytest.mark.usefixtures("one_thread")


def test_problem_follows_the_protocol():
    x, a, y = sc.make_problem(42)
    assert a.shape == (462, 1600) and sc.M == 462 and sc.DOF == 231
    s = torch.linalg.svdvals(x.double())
    assert s[2] > 0.1 * s[0] and s[3] < 1e-5 * s[0]  # rank 3 (up to float32 rounding)
    assert torch.allclose(a @ x.reshape(-1), y)
    # generator order: Us, Vs, then A
    g = torch.Generator().manual_seed(42)
    us, vs = torch.randn(40, 3, generator=g) / math.sqrt(3), torch.randn(40, 3, generator=g) / math.sqrt(3)
    assert torch.equal(x, us @ vs.T) and torch.equal(a, torch.randn(462, 1600, generator=g))


def test_spectral_tail_target():
    x3, _, _ = sc.make_problem(7)
    x, _, _ = sc.make_problem(7, tau=0.3)
    e = (x - math.sqrt(1 - 0.09) * x3) / 0.3
    assert math.isclose(float(e.norm()), float(x3.norm()), rel_tol=1e-5)   # tail scaled to ||X3||
    u, _, vh = torch.linalg.svd(x3.double())
    assert float((u[:, :3].T @ e.double()).norm()) < 1e-4 * float(e.norm())  # orthogonal to X3's spaces
    assert float((e.double() @ vh[:3].T).norm()) < 1e-4 * float(e.norm())


def test_effective_rank():
    assert math.isclose(sc.effective_rank(torch.eye(5)), 5.0, rel_tol=1e-9)
    assert math.isclose(sc.effective_rank(torch.diag(torch.tensor([1.0, 0, 0]))), 1.0, rel_tol=1e-9)


def test_nuclear_norm_single_measurement_closed_form():
    """min ||X||_* s.t. <A, X> = y is y / sigma_1(A) u_1 v_1^T (the dual norm of the nuclear norm)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 4, 3, generator=gen, dtype=torch.float64)
    y = torch.tensor([2.5], dtype=torch.float64)
    x = sc.nuclear_norm_interpolant(a.reshape(1, -1), y, (4, 3))
    u, s, vh = torch.linalg.svd(a[0])
    want = y[0] / s[0] * torch.outer(u[:, 0], vh[0])
    assert torch.allclose(x, want, atol=1e-5)
    assert math.isclose(float(torch.linalg.matrix_norm(x, "nuc")), 2.5 / float(s[0]), rel_tol=1e-5)


def test_nuclear_norm_full_measurements_row_major():
    """With n^2 independent measurements the interpolant is unique: checks the row-major vec."""
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    a = torch.randn(9, 9, generator=gen, dtype=torch.float64)
    x = sc.nuclear_norm_interpolant(a, a @ target.reshape(-1), (3, 3))
    assert torch.allclose(x, target, atol=1e-5)


def test_low_rank_recovery_by_nuclear_norm():
    """Enough Gaussian measurements of a rank-1 matrix: the convex program recovers it exactly."""
    x, a, y = sc.make_problem(3, n=6, rank=1, m=30, dtype=torch.float64)
    w = sc.nuclear_norm_interpolant(a, y, (6, 6))
    assert float((w - x).norm() / x.norm()) < 1e-4


@pytest.mark.parametrize("rule,p,single", [("gd", None, "gd"), ("adam", None, "adam"),
                                           ("scalar_adam", None, "scalar_adam"), ("adam_p", 0.5, "adam_p"),
                                           ("muon", None, "muon"), ("shampoo", None, "shampoo"),
                                           ("symo_p", -0.5, "symo"), ("symo_p", -0.25, "symo_p")])
def test_batched_trainer_matches_the_optimizers(rule, p, single):
    """The dial and the tail run rules stacked on a batch axis; they must be the zoo / Symo rules."""
    lr = {"gd": 0.01, "shampoo": 0.03, "muon": 0.03}.get(rule, 3e-3)
    sched = "cos" if rule == "muon" else "const"
    batched = sc.train_batched(rule, [lr, lr / 3], [42], max_steps=40, p=p, schedule=sched)
    one = sc.train(single, lr, 42, max_steps=40, p=p, schedule=sched)
    assert batched[0]["steps"] == one["steps"] == 40
    assert math.isclose(batched[0]["recovery"], one["recovery"], rel_tol=1e-5)
    assert math.isclose(batched[0]["final_loss"], one["final_loss"], rel_tol=1e-4)
    assert not math.isclose(batched[1]["final_loss"], one["final_loss"], rel_tol=1e-2)  # the other lr differs


def test_select_lr_prefers_interpolating_runs():
    runs = [{"lr": 0.1, "recovery": 0.01, "final_loss": 1e-3}, {"lr": 0.01, "recovery": 0.2, "final_loss": 1e-9}]
    assert sc.select_lr(runs)[0] == 0.01
    runs.append({"lr": 0.001, "recovery": 0.1, "final_loss": 1e-9})
    assert sc.select_lr(runs)[0] == 0.001


def test_quick_mode_writes_the_outputs_and_a_second_run_computes_nothing(tmp_path, monkeypatch):
    data = ms.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    assert data["nuclear_norm"]["recovery_mean"] < 1e-3
    for name in ("matrix_sensing.md", "matrix_sensing.json", "matrix_sensing.png", "matrix_sensing_runs.json"):
        assert (tmp_path / name).exists(), name
    md = (tmp_path / "matrix_sensing.md").read_text()
    assert md.splitlines()[2] == "Command: `python -m benchmarks.matrix_sensing --quick`"

    def computed(*args, **kwargs):
        raise AssertionError("a cached run was computed again")

    for name in ("train", "train_batched", "nuclear_norm_interpolant"):
        monkeypatch.setattr(sc, name, computed)
    monkeypatch.setattr(ms, "verdict", computed)
    again = ms.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    assert again == json.loads(json.dumps(data)) and (tmp_path / "matrix_sensing.md").read_text() == md


def _gd_tail(rates: tuple[float, ...]) -> list[dict]:
    """The quick tail's planned GD runs (tau 0 and 0.2, one seed) at `rates`."""
    gd = [r for r in ms.planned_runs("tail", quick=True) if r["rule"] == "gd"]
    return [{**r, "lr": lr} for r in gd for lr in rates]


def test_a_grid_extension_computes_only_the_new_rate_and_reselects_over_both(tmp_path, monkeypatch):
    """A rate added to a grid: the next run computes only its runs and selects every (tau, rule) over the
    union; running again computes nothing and adds nothing."""
    calls = []
    train_batched = sc.train_batched
    monkeypatch.setattr(sc, "train_batched", lambda *a, **k: calls.append(k["lrs"]) or train_batched(*a, **k))
    cache = ms.RunCache(tmp_path / "matrix_sensing_runs.json")
    ms.compute_missing(cache, _gd_tail((0.01,)), "tail", workers=1)
    assert calls == [[0.01], [0.01]]  # one batch per tau
    cache = ms.RunCache(tmp_path / "matrix_sensing_runs.json")  # as a second invocation reads it
    ms.compute_missing(cache, _gd_tail((0.003, 0.01, 0.03)), "tail", workers=1)
    assert calls[2:] == [[0.003, 0.03], [0.003, 0.03]]  # the new rates only, batched
    tail = ms.summarize_tail(ms.select(cache, _gd_tail((0.003, 0.01, 0.03))))
    assert {t["tau"] for t in tail} == {0.0, 0.2} and all(t["grid"] == [0.003, 0.01, 0.03] for t in tail)
    ms.compute_missing(cache, _gd_tail((0.003, 0.01, 0.03)), "tail", workers=1)
    assert len(calls) == 4 and len(ms.cached_runs(cache)) == 6


def test_cached_runs_are_kept_until_deleted_from_the_cache(tmp_path):
    """A rule whose update changed: its cached runs stand until its records are deleted from the cache
    file; then only that rule is computed again, and the other rules' runs are untouched."""
    path = tmp_path / "matrix_sensing_runs.json"
    planned = [r for r in ms.planned_runs("zoo", quick=True) if r["rule"] in ("adafactor", "gd")]
    ms.compute_missing(ms.RunCache(path), planned, "zoo", workers=1)
    records = json.loads(path.read_text())
    for record in records.values():
        for r in record["runs"]:
            if r["rule"] == "adafactor":
                r["recovery"] = 123.0  # stands for the result of the rule before its update changed
    path.write_text(json.dumps(records))
    cache = ms.RunCache(path)
    ms.compute_missing(cache, planned, "zoo", workers=1)
    assert [r["recovery"] for r in ms.select(cache, planned) if r["rule"] == "adafactor"] == [123.0]
    path.write_text(json.dumps({k: rec for k, rec in records.items()
                                if all(r["rule"] != "adafactor" for r in rec["runs"])}))
    cache = ms.RunCache(path)
    ms.compute_missing(cache, planned, "zoo", workers=1)
    assert [r["recovery"] for r in ms.select(cache, planned) if r["rule"] == "adafactor"] != [123.0]
    gd = [r for rec in records.values() for r in rec["runs"] if r["rule"] == "gd"]
    assert [r for r in ms.cached_runs(cache).values() if r["rule"] == "gd"] == gd


def test_the_committed_tables_rebuild_from_the_committed_run_cache(tmp_path, monkeypatch):
    """`python -m benchmarks.matrix_sensing` on the committed cache: nothing is computed, and the tables
    are the committed ones."""
    results = Path(ms.__file__).parent / "results"
    shutil.copy(results / "matrix_sensing_runs.json", tmp_path)

    def computed(*args, **kwargs):
        raise AssertionError("the committed cache lacks a run")

    for name in ("train", "train_batched", "nuclear_norm_interpolant"):
        monkeypatch.setattr(sc, name, computed)
    monkeypatch.setattr(ms, "verdict", computed)
    ms.main(["--workers", "1", "--out", str(tmp_path)])
    assert (tmp_path / "matrix_sensing.md").read_text() == (results / "matrix_sensing.md").read_text()
