"""The generated source reads like hand-written torch (compiler.emit), for each of the three generators.

What it computes is tested against the oracles elsewhere (test_compiler_oracles, test_templates,
test_repeated_spaces); here: sizes are named after spaces and axes, no variable is assigned and never
read, no helper function is defined and never called, no reshape or expand leaves a shape as it was,
BLOCKS rows are dicts, and the disk cache's key names the emitter, so entries written by another emitter
are never used.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import symo.compiler as compiler
import torch
from torch.overrides import TorchFunctionMode

import symo
from symo.train.models import GPT, GPTConfig, gpt_small, mlp_tanh
from symo.train.rnn import RNN


def gpt_true() -> symo.CompiledSpec:
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=3, n_head=2, n_embd=8))
    return symo.compile("gpt_true", model, sizes={"dqk{i}": 4, "dvo{i}": 4}, disk_cache=False)


DOCS = Path(__file__).resolve().parent.parent / "docs"


CASES = {  # the three generators, by the name their header gives
    "families of identical layers": gpt_true,
    "layer by layer": lambda: symo.compile("mlp_tanh", mlp_tanh(), disk_cache=False),
    "repeated spaces": lambda: symo.compile("rnn_tanh", RNN(2, 5, 1, act="tanh"), disk_cache=False),
}


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request: pytest.FixtureRequest) -> symo.CompiledSpec:
    spec = CASES[request.param]()
    assert f", {request.param})" in spec.source.splitlines()[0]
    return spec


def test_sizes_are_named_after_spaces_and_axes(compiled: symo.CompiledSpec) -> None:
    source = compiled.source
    assert not re.search(r"\b(f\d+_\d+_\d+|_s\d+)\b", source)  # no positional names
    for name in compiled.sizes:
        assert re.fullmatch(r"(n_\w+|d_\w+_dim\d+(_part\d+)?)", name), name
    assert "0 + " not in source and ":0 +" not in source


def test_every_assigned_variable_is_read(compiled: symo.CompiledSpec) -> None:
    tree = ast.parse(compiled.source)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id not in ("BLOCKS",):
                    assert target.id in loaded or target.id in ("gather", "scatter"), ast.unparse(node)


def test_every_helper_function_is_called(compiled: symo.CompiledSpec) -> None:
    """The emitter's one pruning pass drops helper functions nothing calls, as it drops unread variables."""
    tree = ast.parse(compiled.source)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    helpers = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
               and node.name not in ("gather", "scatter")]
    assert all(name in loaded for name in helpers), helpers


class _ShapeChanges(TorchFunctionMode):
    """Fails on a reshape or expand to the shape the tensor already has."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.reshape, torch.Tensor.expand):
            shape = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list, torch.Size)) else args[1:]
            assert tuple(args[0].shape) != tuple(shape), f"{func.__name__} to the same shape {tuple(shape)}"
        return func(*args, **kwargs)


def test_no_reshape_or_expand_keeps_a_shape(compiled: symo.CompiledSpec) -> None:
    tensors = {n: torch.randn(s, dtype=torch.float64) for n, s in compiled.shapes.items()}
    with _ShapeChanges():
        ys = compiled.gather(tensors)
        back = compiled.scatter(ys)
    for n, t in tensors.items():
        torch.testing.assert_close(back[n], t, rtol=0, atol=1e-12)


def test_blocks_rows_are_dicts(compiled: symo.CompiledSpec) -> None:
    blocks = compiled._gather.__globals__["BLOCKS"]
    for b in blocks:
        for row in b["rows"]:
            assert set(row) == {"param", "block", "pieces", "offset", "rows"}, row
            assert row["param"] in compiled.param_names


def test_entries_of_another_emitter_are_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key hashes the emitter's version: a source cached by another emitter is never looked up."""
    assert compiler.emit.EMIT_VERSION in compiler.cache.KEY_FORMAT
    monkeypatch.setattr(compiler, "_MEMORY", {})
    first = symo.compile("mlp_tanh", mlp_tanh(), cache_dir=tmp_path)
    monkeypatch.setattr(compiler, "_MEMORY", {})
    monkeypatch.setattr(compiler, "_DISKS", {})
    monkeypatch.setattr(compiler.cache, "KEY_FORMAT", "symo-kernel/emitter-another")
    second = symo.compile("mlp_tanh", mlp_tanh(), cache_dir=tmp_path)
    assert second.key != first.key and second.from_cache == "built"
    assert sorted(p.stem for p in tmp_path.glob("*.py")) == sorted([first.key, second.key])


def test_the_listing_in_the_architecture_docs_is_what_the_emitter_writes() -> None:
    """docs/architecture.md shows part of `symo compile gpt_true --model symo.train.models:gpt_small --size
    'dqk{i}=16' --size 'dvo{i}=16' --source`: it stays a listing of the current emitter's output."""
    listing = (DOCS / "architecture.md").read_text().split("```text\n", 1)[1].split("\n```", 1)[0]
    source = symo.compile("gpt_true", gpt_small(), sizes={"dqk{i}": 16, "dvo{i}": 16}, disk_cache=False).source
    assert listing in source
