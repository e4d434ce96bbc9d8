"""benchmarks/align.py's helpers for the transformer rows: the heads-fixed and heads-permuted variants of a
spec, the count of heads moved, and the committed notes a partial run (--cases) keeps."""

from __future__ import annotations

import torch

import symo
from benchmarks.align import CASES, MHAClassifier, committed_notes, heads_as, heads_moved
from symo.train.models import GPT, GPTConfig


def test_heads_as_sets_only_the_owners() -> None:
    spec = symo.load_spec("gpt_true")
    for group in ("identity", "perm"):
        groups = {d.name: d.group for d in heads_as(spec, group).spaces}
        assert groups == {"head{i}": group, "dqk{i}": "orthogonal", "dvo{i}": "orthogonal", "mlp{i}": "perm"}


def test_permuted_heads_reach_at_least_the_fixed_objective() -> None:
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=4, n_embd=16)
    torch.manual_seed(0)
    a = GPT(cfg)
    torch.manual_seed(1)
    b = GPT(cfg)
    sizes = {"dqk{i}": 4, "dvo{i}": 4}
    spec = symo.load_spec("gpt_true")
    fixed = symo.align(a, b, heads_as(spec, "identity"), sizes=sizes, check=False)
    permuted = symo.align(a, b, heads_as(spec, "perm"), sizes=sizes, check=False)
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
