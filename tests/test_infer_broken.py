"""symo.infer_spec on models broken on purpose: each operation that breaks a symmetry (a non-odd activation, a
fixed offset, rotary cos/sin, an unsupported operation, the normalisation before a residual stream) narrows or
drops exactly the space it breaks, with a closed-form reason, and the numeric check narrows a group the graph
overestimates.
"""

from __future__ import annotations

import pytest
import torch
from cases import MLP_SPEC
from helpers import assert_all_true, independent_check
from symo.compiler import parse_spec
from torch import nn
from torch.nn import functional as F

from symo.infer import check_spec, infer
from symo.train.models import MLP

pytestmark = pytest.mark.usefixtures("one_thread_module")  # tiny float64 work: one torch thread


# ---------------------------------------------------------------- broken on purpose


def test_non_odd_activation_declared_signed_perm_is_relaxed():
    torch.manual_seed(0)
    rows = check_spec("mlp_tanh", MLP((8, 16, 16, 4), act="relu"))
    assert {r.space: r.status for r in rows} == {"h1": "relaxed", "h2": "relaxed"}
    assert min(r.rel_change for r in rows) > 1e-3
    rows = check_spec("mlp_relu", MLP((8, 16, 16, 4), act="relu"))
    assert {r.status for r in rows} == {"true"}


class OffsetMLP(nn.Module):
    """tanh MLP whose first hidden layer gets a fixed per-channel offset (a buffer, not a parameter) or
    is mixed by a fixed matrix before a per-channel bias: neither moves with the group, so h1 breaks."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.how = how
        self.register_buffer("offset", torch.linspace(-1, 1, 8))
        self.register_buffer("mix", torch.eye(8)[torch.randperm(8)] + 0.1)
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = self.fc1(x)
        h = h + self.offset if self.how == "offset" else h @ self.mix + self.bias
        return self.fc3(torch.tanh(self.fc2(torch.tanh(h))))


@pytest.mark.parametrize("how, words", [("offset", "fixed tensor"), ("mix", "fixed (non-parameter) matrix")])
def test_operation_that_breaks_a_space_drops_it(how, words):
    torch.manual_seed(0)
    model = OffsetMLP(how)
    result = infer(model, torch.randn(4, 6))
    assert_all_true(result)
    moved = {p for s in result.spaces for p in s.params}
    assert "fc1.weight" not in result.spec.to_toml() and "fc1.weight" not in moved
    assert "fc2.weight" in moved and [s.group for s in result.spaces] == ["signed_perm"]
    assert any(words in d.reason and "fc1.weight" in d.params for d in result.dropped), result.report()
    # the broken space really is broken: declaring it by hand is caught as relaxed
    hand = parse_spec(MLP_SPEC % "perm")
    (row,) = check_spec(hand, model, torch.randn(4, 6))
    assert row.status == "relaxed"


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class RotaryAttention(nn.Module):
    """One attention layer with rotary position embeddings (LLaMA's rotate_half form) on q and k."""

    def __init__(self, d=16, heads=2, vocab=11, t=6, rotary=True):
        super().__init__()
        self.heads, self.rotary = heads, rotary
        self.emb = nn.Embedding(vocab, d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.head = nn.Linear(d, vocab)
        dh = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh))
        ang = torch.outer(torch.arange(t).float(), inv)
        self.register_buffer("cos", torch.cat([ang, ang], -1).cos())
        self.register_buffer("sin", torch.cat([ang, ang], -1).sin())

    def forward(self, idx):
        x = self.emb(idx)
        b, t, c = x.shape
        q, k, v = (f(x).view(b, t, self.heads, c // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        if self.rotary:
            cos, sin = self.cos[:t], self.sin[:t]
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + self.o(y.transpose(1, 2).reshape(b, t, c)))


def test_rotary_attention_drops_the_query_key_gauge():
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (2, 6))
    plain = infer(RotaryAttention(rotary=False), ids)
    assert_all_true(plain)
    assert {s.name.rstrip("0123456789") for s in plain.spaces} >= {"dqk", "dvo", "head"}
    model = RotaryAttention(rotary=True)
    result = infer(model, ids)
    assert_all_true(result)
    groups = {s.name: (s.group, s.per) for s in result.spaces}
    assert not any(name.startswith("dqk") for name in groups), result.report()
    assert groups.get("dvo") == ("orthogonal", "head") or any(g == ("orthogonal", "head") for g in groups.values())
    assert any("q.weight" in d.params for d in result.dropped)
    # declaring the gauge by hand anyway: the check calls it relaxed
    hand = parse_spec('[spaces]\nhead = "identity"\nd = { group = "orthogonal", per = "head", size = 8 }\n'
                      '[params]\n"q.weight" = ["(head d)", "_"]\n"k.weight" = ["(head d)", "_"]\n')
    assert {r.space: r.status for r in check_spec(hand, model, ids)} == {"head": "identity", "d": "relaxed"}


class CumsumMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(5, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(torch.logcumsumexp(self.fc1(x), dim=-1)))


def test_unsupported_operation_is_reported_by_name_and_left_uncovered():
    torch.manual_seed(0)
    result = infer(CumsumMLP(), torch.randn(3, 5))
    assert result.spaces == []
    assert [op for op, _ in result.unknown_ops] == ["logcumsumexp"]
    assert set(result.unknown_ops[0][1]) >= {"fc1.weight", "fc1.bias"}
    assert "fc1.weight" in result.uncovered and "logcumsumexp" in result.report()


class Residual(nn.Module):
    """x -> W_in -> [x + fc2(tanh(fc1(norm(x))))] x 2 -> norm -> W_out: the residual group is decided by norm."""

    def __init__(self, norm: str):
        super().__init__()
        self.norm = norm
        self.inp, self.out = nn.Linear(4, 8), nn.Linear(8, 3)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(fc1=nn.Linear(8, 12), fc2=nn.Linear(12, 8))) for _ in range(2))
        self.gain = nn.Parameter(torch.rand(8) + 0.5)

    def n(self, x):
        if self.norm == "layer":
            return F.layer_norm(x, (8,))
        if self.norm == "rms_manual":  # LLaMA's RMSNorm without its gain
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        if self.norm == "rms":
            return F.rms_norm(x, (8,), eps=1e-6)
        return F.rms_norm(x, (8,), self.gain, eps=1e-6)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + b["fc2"](torch.tanh(b["fc1"](self.n(x))))
        return self.out(self.n(x))


@pytest.mark.parametrize("norm, group", [("layer", "perm"), ("rms_manual", "orthogonal"), ("rms", "orthogonal"),
                                         ("rms_gain", "perm")])
def test_normalisation_decides_the_residual_group(norm, group):
    torch.manual_seed(0)
    model = Residual(norm)
    result = infer(model, torch.randn(5, 4))
    assert_all_true(result)
    res = [s for s in result.spaces if s.name == "res"]
    assert len(res) == 1 and res[0].group == group, result.report()
    assert {s.group for s in result.spaces if s.name != "res"} == {"signed_perm"}  # tanh hidden units
    if group == "orthogonal":  # the oracle: a rotation of the stream leaves the outputs unchanged
        assert independent_check(model, result.spec, (torch.randn(5, 4, dtype=torch.float64),)).is_true_symmetry


def test_numeric_check_narrows_a_group_the_graph_overestimates():
    from symo.infer.inference import _verify, trace
    from symo.infer.layout import build_layout
    from symo.infer.verify import OutputCheck

    torch.manual_seed(0)
    model = MLP((6, 10, 10, 3), act="relu")
    x = torch.randn(4, 6)
    layout = build_layout(trace(model, (x,), {}), {n: tuple(p.shape) for n, p in model.named_parameters()})
    for s in layout.spaces.values():
        s.group = "orthogonal"  # pretend the graph analysis missed the ReLU
    results = _verify(layout, OutputCheck(model, (x,), {}), trials=2, tol=1e-9, seed=0)
    assert [layout.spaces[sid].group for sid in results] == ["perm", "perm"]
    assert {status for status, _ in results.values()} == {"narrowed"}
