"""benchmarks/gauge_twins.py and benchmarks/hyperspectral.py: the pieces the full runs rely on."""


import json
import shutil
import zlib
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import symo
from benchmarks import gauge_twins as tw
from benchmarks import hyperspectral as hs

pytestmark = pytest.mark.usefixtures("one_thread")


def _small_model():
    torch.manual_seed(0)
    return tw.ModAdd().double()


def test_data_split_follows_the_protocol():
    (xt, yt), (xv, yv) = tw.data()
    assert xt.shape == (883, 3) and xv.shape == (1326, 3)
    assert torch.equal(yt, (xt[:, 0] + xt[:, 1]) % 47) and bool((xt[:, 2] == 47).all())
    pairs = {tuple(r) for r in torch.cat([xt, xv])[:, :2].tolist()}
    assert len(pairs) == 47 * 47


def test_rotated_twin_is_the_same_function_but_other_weights():
    model = _small_model()
    twin = tw.rotate_twin(model, 777)
    (xt, _), _ = tw.data()
    x = xt[:50]
    assert torch.allclose(model(x), twin(x), rtol=0, atol=1e-12)
    assert tw.rel(model.blocks[0].attn.q.weight, twin.blocks[0].attn.q.weight) > 0.5
    for a, b in zip(tw.qk_products(model), tw.qk_products(twin)):
        assert torch.allclose(a, b, atol=1e-12)
    noisy = tw.noise_twin(model)
    assert 0 < tw.rel(model(x), noisy(x)) < 1e-5


def test_per_head_spec_is_a_true_symmetry_and_symo_respects_it():
    model = _small_model()
    (xt, yt), _ = tw.data()
    x, y = xt[:40], yt[:40]

    def loss(m):
        return F.cross_entropy(m(x), y)

    compiled = symo.compile("mod_add_qk_gauge", model)
    assert len(compiled.param_names) == 4  # q and k of both layers
    params = dict(model.named_parameters())
    rep = symo.check_symmetry(lambda w: F.cross_entropy(torch.func.functional_call(model, w, (x,)), y),
                              compiled, params)
    assert rep.is_true_symmetry
    good = symo.check_equivariance(
        lambda ps: symo.Symo(ps, compiled, lr=1e-3, adamw_lr=1e-3, adamw_betas=(0.9, 0.999)), model, compiled, loss,
        steps=2)
    bad = symo.check_equivariance(lambda ps: tw.make_optimizer("adam", _Holder(ps))[0], model, compiled, loss,
                                  steps=2)
    assert good.is_equivariant, good.summary()
    assert not bad.is_equivariant and bad.first_step_defect > 1e-6


class _Holder:
    """make_optimizer takes a model; the checker hands out named parameters."""

    def __init__(self, named):
        self._named = named

    def named_parameters(self):
        return list(self._named)


def test_indian_pines_preprocessing():
    x = hs.load_pixels(300)
    assert x.shape == (300, 200)
    assert float(x.mean(dim=0).abs().max()) < 1e-6
    assert float(x.abs().max()) <= 1.0
    assert torch.equal(x, hs.load_pixels(300))  # Generator(2026): deterministic


def test_hyperspectral_selection_rule():
    def run(lr, levels, steps):
        return {"lr": lr, "hits": {str(lv): {"step": steps} for lv in hs.LEVELS[:levels]}}

    runs = [run(1, 3, 50), run(1, 4, 60), run(3, 4, 30), run(3, 4, 40), run(10, 4, 10), run(10, 2, 10)]
    assert hs.deepest_common(runs[:2]) == hs.LEVELS[2]
    assert hs.select(runs) == 3  # 10 reaches fewer levels on one seed; 3 beats 1 on levels
    runs += [run(30, 4, 5), run(30, 4, 5)]
    assert hs.select(runs) == 30  # same depth, fewer steps


def test_hyperspectral_train_reaches_levels():
    r = hs.train("adam", 1e-2, 42, 0.25, 100, 150)
    assert r["hits"] and all(h["test_rmse"] > 0 for h in r["hits"].values())
    first = [r["hits"][str(lv)]["step"] for lv in hs.LEVELS if str(lv) in r["hits"]]
    assert first == sorted(first)


def test_hyperspectral_reuses_its_cached_runs_and_trains_only_a_new_rate(tmp_path, monkeypatch):
    """A rate added to a rule's grid: the next invocation trains only that rate (and, if it is chosen, its
    report seeds) and selects over every rate; runs of another size are not reused."""
    hs.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    trained = []
    real = hs.train
    monkeypatch.setattr(hs, "train", lambda **kw: trained.append((kw["rule"], kw["lr"], kw["seed"])) or real(**kw))
    monkeypatch.setitem(hs.QUICK_GRIDS, "gd", (*hs.QUICK_GRIDS["gd"], 10))
    data = hs.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    gd = data["0.25"]["gd"]
    want = [("gd", 10, 42), ("gd", 10, 123)] + ([("gd", 10, 456), ("gd", 10, 789)] if gd["lr"] == 10 else [])
    assert trained == want and gd["lr"] in (3, 10) and gd["lr_at_grid_edge"]
    stored = json.loads((tmp_path / "hyperspectral_runs.json").read_text())
    assert len(stored) == 4 * len(hs.QUICK_GRIDS) + len(trained)
    command = (tmp_path / "hyperspectral.md").read_text().splitlines()[2]
    assert command == "Command: `python -m benchmarks.hyperspectral --quick`"
    hs.main(["--quick", "--max-steps", "50", "--workers", "1", "--out", str(tmp_path)])
    capped = [r for r in json.loads((tmp_path / "hyperspectral_runs.json").read_text()).values()
              if r["max_steps"] == 50]
    # every run trained again: the cached runs had another cap
    assert len(trained) - len(want) == len(capped) >= 4 * len(hs.QUICK_GRIDS)


def test_hyperspectral_pruning_budget():
    def run(levels, step):
        return {"hits": {str(lv): {"step": step} for lv in hs.LEVELS[:levels]}}

    assert hs.pruning_budget([run(6, 87), run(6, 88)]) == 175  # floor(2 * 87.5)
    assert hs.pruning_budget([run(6, 87), run(5, 40)]) is None  # a rate reaching more levels wins at any step


class _SyntheticCache:
    """Stands in for the run cache and its training (hs.fetch): a run's first step at each level is drawn once
    per (rule, lr, seed, density) and a run stopped at max_steps keeps the levels it reached by then, as a
    truncated training run does."""

    def __init__(self, seed: int):
        self.seed, self.asked = seed, []

    def fetch(self, tasks):
        self.asked += tasks
        return [self.run(t) for t in tasks]

    def run(self, t):
        key = repr((self.seed, t["rule"], t["lr"], t["seed"], t["density"])).encode()
        g = torch.Generator().manual_seed(zlib.crc32(key))
        every = float(torch.rand((), generator=g)) < 0.75
        reach = len(hs.LEVELS) if every else int(torch.randint(3, len(hs.LEVELS), (), generator=g))
        scale = 2 ** int(torch.randint(0, 4, (), generator=g))  # rates and seeds 8x apart in speed
        steps = (scale * torch.randint(1, 30, (len(hs.LEVELS),), generator=g).cumsum(0)).tolist()
        hits = {str(lv): {"step": s} for lv, s in zip(hs.LEVELS[:reach], steps) if s <= t["max_steps"]}
        return {**t, "hits": hits}


def test_hyperspectral_pruned_selection_chooses_the_rate_that_full_selection_chooses(monkeypatch):
    """Oracle: selecting from runs that all went to the protocol's cap. 400 synthetic draws of the steps
    each rate needs, with rates that miss levels, ties and incumbents that miss levels among them."""
    monkeypatch.setattr(hs, "PRUNED_RULES", ("symo_notebook",))
    monkeypatch.setattr(hs, "fetch", lambda cache, tasks, desc, workers: cache.fetch(tasks))
    grids = {"symo_notebook": (1e-3, 3e-3, 1e-2, 3e-2, 0.1), "gd": (1, 3)}
    base = {"n_pixels": 2000, "max_steps": 30_000}
    pruned_any = cut = 0
    for seed in range(400):
        cache = _SyntheticCache(seed)
        runs = hs.selection_runs(cache, grids, (0.15,), base, workers=1)
        full = [cache.run({**t, "max_steps": base["max_steps"]}) for t in cache.asked]
        for rule in grids:
            mine = [x for x in runs if x["rule"] == rule]
            assert hs.select(mine) == hs.select([x for x in full if x["rule"] == rule])
        stops = {x["max_steps"] for x in runs if x["rule"] == "symo_notebook" and x["lr"] != 1e-2}
        budget = hs.pruning_budget([x for x in runs if x["rule"] == "symo_notebook" and x["lr"] == 1e-2])
        assert stops == {base["max_steps"] if budget is None else budget}
        assert {x["max_steps"] for x in runs if x["rule"] == "gd"} == {base["max_steps"]}
        pruned_any += budget is not None
        cut += sum(len(x["hits"]) < len(cache.run({**x, "max_steps": base["max_steps"]})["hits"]) for x in runs)
    assert 50 < pruned_any < 350 and cut > 50  # both branches exercised, and runs really cut short


def test_hyperspectral_committed_tables_rebuild_from_the_committed_run_cache(tmp_path, monkeypatch):
    """`python -m benchmarks.hyperspectral` on the committed cache: nothing is trained, and the tables are
    the committed ones."""
    results = Path(hs.__file__).parent / "results"
    shutil.copy(results / "hyperspectral_runs.json", tmp_path)

    def trained(**kwargs):
        raise AssertionError(f"the committed cache lacks a run: {kwargs}")

    monkeypatch.setattr(hs, "train", trained)
    hs.main(["--workers", "1", "--out", str(tmp_path)])
    assert (tmp_path / "hyperspectral.md").read_text() == (results / "hyperspectral.md").read_text()
