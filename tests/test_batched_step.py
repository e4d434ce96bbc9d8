"""The batched Muon-path step equals the per-block step, and bfloat16 Newton–Schulz stays close.

Same-shape blocks (every layer's heads, every layer's MLP) are stacked along the batch axis and go
through one matrix-function call. The reference is the same optimizer with batch_blocks=False, one
call per block, on a 3-layer GPT trained for a few real steps.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from cases import train

from symo.optim import Symo
from symo.optim.kinds import polar  # where the polar kind calls the block function
from symo.train.models import GPT, GPTConfig


@pytest.mark.parametrize(("spec", "backend"), [("gpt", "auto"), ("gpt_muon", "eigh"), ("gpt_muon", "newton_schulz")])
def test_batched_step_equals_per_block_step(spec: str, backend: str, monkeypatch) -> None:
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=128, vocab_size=17, block_size=16))
    calls = {True: 0, False: 0}
    original = polar.current_statistic_apply
    models = {}
    for batched in (False, True):
        model = copy.deepcopy(base)
        opt = Symo(model.named_parameters(), spec, lr=0.02, backend=backend, batch_blocks=batched)

        def counting(*args, _batched=batched, **kwargs):
            calls[_batched] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(polar, "current_statistic_apply", counting)
        train(model, opt, steps=1)
        models[batched] = model
    assert calls[True] < calls[False]  # blocks were stacked: fewer matrix-function calls
    # float tolerance: bmm and 2-D GEMMs round differently, and Newton-Schulz's quintic amplifies that
    # to ~1e-5 of the update; eigh matches to float32 rounding
    tol = 1e-4 if backend == "newton_schulz" else 1e-5
    for (name, a), b, p0 in zip(models[False].named_parameters(), models[True].parameters(), base.parameters()):
        update = (a - p0).norm()
        assert update > 0, name
        assert (a - b).norm() <= tol * update, (name, ((a - b).norm() / update).item())


def test_bfloat16_newton_schulz_close_to_float32() -> None:
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=128, vocab_size=17, block_size=16))
    deltas = {}
    for dtype in ("float32", "bfloat16"):
        model = copy.deepcopy(base)
        opt = Symo(model.named_parameters(), "gpt_muon", lr=0.02, backend="newton_schulz", ns_dtype=dtype)
        train(model, opt, steps=1)
        w = "transformer.h.0.mlp.c_fc.weight"
        deltas[dtype] = dict(model.named_parameters())[w] - dict(base.named_parameters())[w]
    a, b = deltas["float32"], deltas["bfloat16"]
    assert a.dtype == b.dtype == torch.float32
    rel = ((a - b).norm() / a.norm()).item()
    cosine = (a * b).sum() / (a.norm() * b.norm())
    # bfloat16 (8 mantissa bits) moves the quintic's output within Muon's own band around the polar
    # factor (singular values in ~[0.7, 1.2]): same direction, not the same numbers
    assert 0 < rel < 0.3 and cosine > 0.95, (rel, cosine.item())
    with pytest.raises(ValueError, match="ns_dtype"):
        Symo(base.named_parameters(), "gpt_muon", ns_dtype="float16")


def test_auto_batching_stacks_on_accelerators_only(monkeypatch) -> None:
    """batch_blocks='auto' (the default): one call per block on CPU, stacked calls on other devices."""
    from symo.optim.plan import stack_blocks as _stack_blocks

    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=17, block_size=16))
    calls = []
    original = polar.current_statistic_apply
    monkeypatch.setattr(polar, "current_statistic_apply",
                        lambda y, *a, **k: calls.append(y.shape[0]) or original(y, *a, **k))
    opt = Symo(model.named_parameters(), "gpt_muon", lr=0.02)
    assert opt.config.batch_blocks == "auto"
    train(model, opt, steps=1)
    assert len(calls) == len(opt.compiled.blocks)
    calls.clear()
    Symo(model.named_parameters(), "gpt_muon", lr=0.02, batch_blocks=True).step()
    assert len(calls) < len(opt.compiled.blocks)
    assert not _stack_blocks("auto", torch.device("cpu"))
    assert _stack_blocks("auto", torch.device("cuda")) and _stack_blocks("auto", torch.device("mps"))
    for explicit in (True, False):
        assert _stack_blocks(explicit, torch.device("cpu")) is explicit is _stack_blocks(explicit, torch.device("cuda"))


@pytest.mark.parametrize(("bad", "error"), [(1, TypeError), (0, TypeError), ("yes", ValueError), (None, TypeError)])
def test_batch_blocks_validation(bad, error) -> None:
    """A flag or 'auto': a string other than 'auto' is a wrong choice (ValueError), 1, 0 or None a wrong type."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=17, block_size=16))
    with pytest.raises(error, match=re.escape(f"batch_blocks must be one of True, False, 'auto'; got {bad!r}")):
        Symo(model.named_parameters(), "gpt_muon", batch_blocks=bad)
