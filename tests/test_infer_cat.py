"""symo.infer on models that concatenate, stack, split and chunk hidden tensors: torch.cat along a hidden
axis (branches joined), along the sequence axis (a key/value cache, Hugging Face's included), and the
pieces of a split or chunk. Oracles: specs written here by hand from the architectures, and
`symo.check_symmetry` through dense group matrices (tests/helpers.py's independent_check)."""

from __future__ import annotations

import pytest
import torch
from cases import HF_GPT2_SPEC
from helpers import assert_all_true, assert_covers, independent_check
from symo.compiler import parse_spec
from torch import nn

from symo.infer import infer

pytestmark = pytest.mark.usefixtures("one_thread_module")  # tiny float64 work: one torch thread


class Branches(nn.Module):
    """Two tanh branches joined along the hidden axis (`how`: cat, hstack or concat)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.b, self.out = nn.Linear(3, 4), nn.Linear(3, 5), nn.Linear(9, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.tanh(self.a(x)), torch.tanh(self.b(x))]
        h = torch.hstack(parts) if self.how == "hstack" else getattr(torch, self.how)(parts, dim=-1)
        return self.out(h)


BRANCHES_SPEC = """
[spaces]
ha = "signed_perm"
hb = "signed_perm"
[params]
"a.weight" = ["ha", "_"]
"a.bias" = ["ha"]
"b.weight" = ["hb", "_"]
"b.bias" = ["hb"]
"out.weight" = ["_", ["ha", "hb"]]
"""


@pytest.mark.parametrize("how", ["cat", "concat", "hstack"])
def test_cat_along_a_hidden_axis_keeps_each_branch(how: str) -> None:
    torch.manual_seed(0)
    model = Branches(how)
    x = torch.randn(5, 3)
    result = infer(model, (x,))
    assert_all_true(result)
    assert_covers(parse_spec(BRANCHES_SPEC), result.spec, model, same_group=["ha", "hb"])
    assert "unsupported operation" not in result.report()
    assert independent_check(model, result.spec, (x.double(),)).is_true_symmetry


class Stacked(nn.Module):
    """stack, then an odd function, then a sum over the stacked axis: both branches share one space."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(torch.stack([self.a(x), self.b(x)], dim=0)).sum(0))


class Gated(nn.Module):
    """A gated unit: one projection cut in two (`how`: chunk or split), value * sigmoid(gate)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.fc, self.out = nn.Linear(3, 8), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        value, gate = h.chunk(2, dim=-1) if self.how == "chunk" else torch.split(h, [4, 4], dim=-1)
        return self.out(value * torch.sigmoid(gate))


STACKED_SPEC = """
[spaces]
h = "signed_perm"
[params]
"a.weight" = ["h", "_"]
"a.bias" = ["h"]
"b.weight" = ["h", "_"]
"b.bias" = ["h"]
"out.weight" = ["_", "h"]
"""

GATED_SPEC = """
[spaces]
g = "perm"
[params]
"fc.weight" = [["g", "g"], "_"]
"fc.bias" = [["g", "g"]]
"out.weight" = ["_", "g"]
"""


@pytest.mark.parametrize("model,spec", [(Stacked, STACKED_SPEC), (lambda: Gated("chunk"), GATED_SPEC),
                                        (lambda: Gated("split"), GATED_SPEC)], ids=["stack", "chunk", "split"])
def test_stack_chunk_split(model, spec: str) -> None:
    torch.manual_seed(0)
    model = model()
    x = torch.randn(5, 3)
    result = infer(model, (x,))
    assert_all_true(result)
    hand = parse_spec(spec)
    assert_covers(hand, result.spec, model, same_group=[s.name for s in hand.spaces])
    assert independent_check(model, result.spec, (x.double(),)).is_true_symmetry


class CachedAttention(nn.Module):
    """One attention head whose keys and values are a cache of the first positions followed by the rest,
    concatenated along the sequence axis (`empty`: the cache starts as a legacy empty tensor, as
    Hugging Face's DynamicCache does)."""

    def __init__(self, empty: bool) -> None:
        super().__init__()
        self.empty = empty
        self.q, self.k, self.v = nn.Linear(4, 6, bias=False), nn.Linear(4, 6, bias=False), nn.Linear(4, 6, bias=False)
        self.o = nn.Linear(6, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.empty:
            k = torch.cat([torch.tensor([], dtype=x.dtype), self.k(x)], dim=-2)
            v = torch.cat([torch.tensor([], dtype=x.dtype), self.v(x)], dim=-2)
        else:
            k = torch.cat([self.k(x[:, :2]), self.k(x[:, 2:])], dim=1)
            v = torch.cat([self.v(x[:, :2]), self.v(x[:, 2:])], dim=1)
        att = torch.softmax(self.q(x) @ k.transpose(1, 2) / 6 ** 0.5, dim=-1)
        return self.o(att @ v)


ATTENTION_SPEC = """
[spaces]
dqk = "orthogonal"
dvo = "orthogonal"
[params]
"q.weight" = ["dqk", "_"]
"k.weight" = ["dqk", "_"]
"v.weight" = ["dvo", "_"]
"o.weight" = ["_", "dvo"]
"""


@pytest.mark.parametrize("empty", [False, True], ids=["prefix-cache", "empty-cache"])
def test_cat_along_the_sequence_axis_keeps_the_attention_gauges(empty: bool) -> None:
    torch.manual_seed(0)
    model = CachedAttention(empty)
    x = torch.randn(2, 5, 4)
    result = infer(model, (x,))
    assert_all_true(result)
    assert_covers(parse_spec(ATTENTION_SPEC), result.spec, model, same_group=["dqk", "dvo"])
    assert independent_check(model, result.spec, (x.double(),)).is_true_symmetry


def test_hugging_face_gpt2_with_its_default_kv_cache() -> None:
    """`infer(hf_gpt2, (input_ids,))`: traced with use_cache=True, the cache's torch.cat keeps the per-head
    gauges and covers c_attn.bias (before, the cat was unsupported and the gauges were lost)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=13, n_positions=8, bos_token_id=0,
                                  eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 13, (1, 6))
    result = infer(model, (ids,), heads=2)
    assert_all_true(result)
    assert result.covered_params == result.total_params
    rename, bound = assert_covers(parse_spec(HF_GPT2_SPEC), result.spec, model,
                                  same_group=[f"{s}{i}" for s in ("dqk", "dvo", "mlp") for i in (0, 1)] + ["res"])
    # heads permuted as wholes (the hand spec keeps them in place)
    assert {bound.spaces[next(iter(rename[h]))].group for h in ("head0", "head1")} == {"perm"}
    assert "unsupported operation" not in result.report()
    model.eval()
    assert independent_check(model, result.spec, (ids,)).is_true_symmetry


class CatWithFixedRows(nn.Module):
    """Hidden rows concatenated (along the batch axis) with rows of a fixed buffer: the hidden units are
    no longer a symmetry (permuting them moves the buffer's rows' outputs too), so no space may be kept."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.out = nn.Linear(3, 4), nn.Linear(4, 2)
        self.register_buffer("extra", torch.randn(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(torch.cat([self.a(x), self.extra.to(x.dtype)], dim=0)))


def test_cat_with_a_fixed_tensor_drops_the_space_it_breaks() -> None:
    torch.manual_seed(0)
    model = CatWithFixedRows()
    result = infer(model, (torch.randn(5, 3),))
    moved = {p for s in result.spaces if s.status != "identity" for p in s.params}
    assert "a.weight" not in moved and "out.weight" not in moved, result.report()
    hand = parse_spec('[spaces]\nh = "signed_perm"\n[params]\n"a.weight" = ["h", "_"]\n"a.bias" = ["h"]\n'
                      '"out.weight" = ["_", "h"]\n')
    assert not independent_check(model, hand, (torch.randn(5, 3).double(),)).is_true_symmetry  # why it must go
