"""benchmarks/align.py's helpers for the transformer rows (align_heads.py, align_report.py): the heads-fixed and
heads-permuted variants of a spec, the count of heads moved, the committed notes a partial run (--cases) keeps,
and the diagnostics of heads permuted against heads fixed."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import symo
from benchmarks.align_heads import heads_as, heads_diagnostics, heads_moved, heads_text
from benchmarks.align_models import MHAClassifier
from benchmarks.align_report import CASES, committed_notes
from symo.alignment.matching import weight_matching
from symo.train.models import GPT, GPTConfig


def test_heads_as_sets_only_the_owners() -> None:
    spec = symo.load_spec("gpt_true")
    for group in ("identity", "perm"):
        groups = {d.name: d.group for d in heads_as(spec, group).spaces}
        assert groups == {"head{i}": group, "dqk{i}": "orthogonal", "dvo{i}": "orthogonal", "mlp{i}": "perm"}


@pytest.mark.parametrize("restarts", [0, 3])
def test_permuted_heads_reach_at_least_the_fixed_objective(restarts: int) -> None:
    """Each run of the heads-permuted group first solves the heads-fixed subgroup from the same start (random
    starts included: both specs draw the same ones), so with one seed it ends at least as high."""
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=4, n_embd=16)
    torch.manual_seed(0)
    a = GPT(cfg)
    torch.manual_seed(1)
    b = GPT(cfg)
    sizes = {"dqk{i}": 4, "dvo{i}": 4}
    spec = symo.load_spec("gpt_true")
    fixed = symo.align(a, b, heads_as(spec, "identity"), sizes=sizes, check=False, restarts=restarts)
    permuted = symo.align(a, b, heads_as(spec, "perm"), sizes=sizes, check=False, restarts=restarts)
    assert heads_moved(fixed) == (0, 4)
    assert heads_moved(permuted)[1] == 4
    assert permuted.objective_after >= fixed.objective_after - 1e-6


def test_mha_classifier_infers_permutable_heads() -> None:
    torch.manual_seed(0)
    model = MHAClassifier(d=16, heads=2, blocks=1, hidden=8)
    spaces = symo.infer_spec(model).spaces
    owners = {d.per for d in spaces if d.per}
    assert owners and all(d.group == "perm" for d in spaces if d.name in owners)


def test_committed_notes_cover_every_case() -> None:
    assert set(committed_notes()) == set(CASES)


def test_heads_diagnostics_against_enumerated_pairings() -> None:
    """Oracle for heads_diagnostics: per layer, every pairing of heads enumerated (3!), each with its per-head
    rotations solved by weight matching's ordinary per-space steps and every other space held. With the
    heads-fixed result held, the best pairing's gain is the layer step's gain; with the heads-permuted result
    held, the order of the pairings' objectives gives the ranks of keeping heads in place and of activation
    matching's pairing."""
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=3, n_embd=12)
    torch.manual_seed(0)
    a = GPT(cfg).eval()
    torch.manual_seed(1)
    b = GPT(cfg).eval()
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, 11, (4, 8), generator=gen), torch.randint(0, 11, (4, 8), generator=gen))
               for _ in range(2)]

    def lm(model, batch):
        return {"loss": model(*batch)[1]}

    spec = symo.infer_spec(a)
    fixed = symo.align(a, b, heads_as(spec, "identity"), check=False)
    permuted = symo.align(a, b, heads_as(spec, "perm"), check=False)
    act = symo.align(a, b, heads_as(spec, "perm"), method="activations", data=[x for x, _ in batches], check=False)
    d = heads_diagnostics(a, b, lm, batches, fixed, permuted, act)
    json.dumps(d)  # kept in align.json
    compiled = permuted.compiled
    ref = {n: p.detach() for n, p in a.named_parameters() if n in compiled.param_names}
    other = {n: p.detach() for n, p in b.named_parameters() if n in compiled.param_names}
    owners = [s for s, info in compiled.spaces.items() if any(i["per"] == s for i in compiled.spaces.values())]
    assert list(d["layers"]) == owners and len(owners) == 2
    for owner in owners:
        free = {owner} | {t for t, i in compiled.spaces.items() if i["per"] == owner}

        def objective(held: dict, p: tuple[int, ...], owner: str = owner, free: set = free) -> float:
            heads = torch.eye(3)[list(p)].unsqueeze(0)
            fixed_here = {s: q for s, q in held.items() if s not in free} | {owner: heads}
            return weight_matching(compiled, ref, other, fixed=fixed_here).objective_after

        pairings = list(itertools.permutations(range(3)))
        from_fixed = {p: objective(fixed.matrices, p) for p in pairings}
        layer = d["layers"][owner]
        assert layer["gain"] == pytest.approx(max(from_fixed.values()) - fixed.objective_after, abs=1e-4)
        assert from_fixed[tuple(layer["heads"])] == pytest.approx(max(from_fixed.values()), abs=1e-4)
        at_permuted = {p: objective(permuted.matrices, p) for p in pairings}

        def rank(p: tuple[int, ...], values: dict = at_permuted) -> int:
            return 1 + sum(v > values[p] + 1e-4 for v in values.values())

        assert layer["rank_in_place"] == rank((0, 1, 2))
        assert layer["rank_activations"] == rank(tuple(layer["activations"]))
    assert any(v["gain"] > 1e-3 for v in d["layers"].values())  # some layer's heads move on this pair
    text = heads_text(d, 1.0, 1.0)
    assert f"{d['heads_from_activations']['barrier']:.4f}" in text
