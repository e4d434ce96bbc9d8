"""symo.align, interpolate, repair and barrier (the `symo align` / `symo merge` commands: test_align_cli.py), against
independent references: a model moved by a known group element (the element found must be its inverse),
forward passes (the aligned model computes the other's function), exhaustive enumeration of S_4 and B_3
with the objective written out by hand, the nuclear norm (the Procrustes optimum), closed-form statistics
and a closed-form loss path."""

from __future__ import annotations

import itertools
import math
import sys
import warnings

import pytest
import torch
from cases import MLP_SPEC
from helpers import inverse_element
from torch import nn

import symo
from symo.alignment import AlignError, AlignWarning, align, barrier, interpolate, repair
from symo.alignment.matching import weight_matching
from symo.train.models import GPT, MLP, Factored, GPTConfig
from symo.train.rnn import RNN

pytestmark = pytest.mark.usefixtures("one_thread_module")

TINY_GPT = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=11, block_size=8)
HEAD_SIZES = {"dqk{i}": 16, "dvo{i}": 16}


def trained_like_gpt() -> GPT:
    """The tiny GPT with every parameter perturbed, LayerNorm gains and biases included (at initialisation
    they are all ones and zeros, which no residual permutation can tell apart)."""
    model = GPT(TINY_GPT)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _seeded(factory, seed: int, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return factory().to(dtype)


class ConvBN(nn.Module):
    """conv -> BatchNorm -> ReLU -> conv -> BatchNorm -> ReLU -> pool -> linear: the BatchNorm case."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 5, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(5)
        self.fc = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean((2, 3)))

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.randn(4, 1, 6, 6, generator=torch.Generator().manual_seed(0), dtype=self.fc.weight.dtype),)


def _warm_batchnorm(model: nn.Module, seed: int) -> nn.Module:
    """Running statistics that are not the defaults, so that moving them is tested."""
    gen = torch.Generator().manual_seed(seed)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 1, 6, 6, generator=gen, dtype=next(model.parameters()).dtype))
    return model.eval()


# (label, model factory, spec, sizes, inputs)
CASES = [
    ("perm: ReLU MLP", lambda: MLP((8, 16, 16, 4), act="relu"), "mlp_relu", None, lambda: torch.randn(5, 8)),
    ("signed_perm: tanh MLP", lambda: MLP((8, 16, 16, 4), act="tanh"), "mlp_tanh", None, lambda: torch.randn(5, 8)),
    ("orthogonal: U V^T", Factored, "factored", None, lambda: ()),
    ("per-head O(k) + perm: GPT", lambda: GPT(TINY_GPT), "gpt_true", HEAD_SIZES,
     lambda: torch.randint(0, 11, (3, 8))),
    ("inferred: GPT (residual perm, per-head O(k), MLP perm)", trained_like_gpt, None, None,
     lambda: torch.randint(0, 11, (3, 8))),
    ("tier 2, signed_perm: tanh RNN", lambda: RNN(3, 8, 2, act="tanh"), "rnn_tanh", None,
     lambda: torch.randn(4, 5, 3)),
    ("tier 2, perm: ReLU RNN", lambda: RNN(3, 8, 2, act="relu"), "rnn_relu", None, lambda: torch.randn(4, 5, 3)),
]


def _moved_copy(factory, compiled, g) -> nn.Module:
    """The seed-0 model with its parameters moved by g (through named_parameters: tied weights stay tied)."""
    ref, other = _seeded(factory, 0), _seeded(factory, 0)
    moved = compiled.act(g, {n: p.detach() for n, p in ref.named_parameters()})
    with torch.no_grad():
        for n, p in other.named_parameters():
            p.copy_(moved[n])
    return other


def _out(model: nn.Module, x) -> torch.Tensor:
    y = model(*x) if isinstance(x, tuple) else model(x)
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("label,factory,spec,sizes,inputs", CASES, ids=[c[0] for c in CASES])
def test_a_moved_model_is_aligned_back_and_the_element_is_the_inverse(label, factory, spec, sizes, inputs) -> None:
    ref = _seeded(factory, 0)
    compiled = symo.compile(spec, ref, sizes=sizes) if spec else symo.compile(symo.infer_spec(ref), ref)
    g = compiled.random_element(torch.Generator().manual_seed(3), dtype=torch.float64)
    other = _moved_copy(factory, compiled, g)
    result = align(ref, other, compiled)
    got = dict(result.model.named_parameters())
    for n, p in ref.named_parameters():
        assert torch.allclose(got[n], p, atol=1e-6, rtol=0), (label, n)
    inverses = inverse_element(compiled, g)  # the inferred GPT permutes heads as wholes: a wreath product
    for s, info in compiled.spaces.items():
        if info["group"] == "identity":
            continue
        inverse = inverses[s]
        assert torch.allclose(result.matrices[s], inverse, atol=1e-6), (label, s)
        found = result.elements[s]
        squeeze = inverse[0] if info["per"] is None else inverse
        if info["group"] == "orthogonal":
            assert torch.allclose(found, squeeze, atol=1e-6)
        elif info["group"] == "perm":  # x'_i = x_{p_i}: the inverse's row i has its 1 at column p_i
            assert torch.equal(found, squeeze.argmax(-1))
        else:
            perm, signs = found
            assert torch.equal(perm, squeeze.abs().argmax(-1))
            assert torch.equal(signs.double(), torch.gather(squeeze, -1, perm.unsqueeze(-1)).squeeze(-1))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("label,factory,spec,sizes,inputs", CASES, ids=[c[0] for c in CASES])
def test_the_aligned_model_computes_the_others_function(label, factory, spec, sizes, inputs, dtype, tol) -> None:
    ref, other = _seeded(factory, 0, dtype), _seeded(factory, 1, dtype)
    result = align(ref, other, spec, sizes=sizes)
    assert result.objective_after >= result.objective_before
    torch.manual_seed(7)
    x = inputs()
    x = x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    with torch.no_grad():
        want, got = _out(other, x), _out(result.model, x)
    assert (got - want).abs().max() <= tol * max(1.0, float(want.abs().max())), label


def test_batchnorm_running_statistics_follow_the_channels() -> None:
    ref, other = _warm_batchnorm(_seeded(ConvBN, 0), 0), _warm_batchnorm(_seeded(ConvBN, 1), 1)
    result = align(ref, other)  # inferred: perm channel spaces through the BatchNorms
    assert any(s.group == "perm" for s in result.spaces)
    x = torch.randn(4, 1, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(result.model.eval()(x), other(x), atol=1e-10)
    moved = dict(result.model.named_buffers())
    perm = result.elements[next(s.name for s in result.spaces if s.size == 6)]
    assert torch.equal(moved["bn1.running_mean"], other.bn1.running_mean[perm])
    assert torch.equal(moved["bn1.running_var"], other.bn1.running_var[perm])


# ---------------------------------------------------------------- brute force over the whole group
def _mlp_objective(ref: nn.Module, other: nn.Module, q: torch.Tensor) -> float:
    """<W_ref, g W_other> for a one-hidden-layer MLP, written out: rows of fc1 and its bias, columns of fc2."""
    with torch.no_grad():
        return float((ref.fc1.weight * (q @ other.fc1.weight)).sum() + (ref.fc1.bias * (q @ other.fc1.bias)).sum()
                     + (ref.fc2.weight * (other.fc2.weight @ q.T)).sum())


def _group(n: int, signed: bool):
    for perm in itertools.permutations(range(n)):
        for signs in itertools.product((1.0, -1.0), repeat=n) if signed else [(1.0,) * n]:
            q = torch.zeros(n, n, dtype=torch.float64)
            q[torch.arange(n), torch.tensor(perm)] = torch.tensor(signs, dtype=torch.float64)
            yield q


@pytest.mark.parametrize("group,n", [("perm", 4), ("signed_perm", 3)], ids=["S_4", "B_3"])
@pytest.mark.parametrize("seed", range(4))
def test_weight_matching_agrees_with_brute_force(group: str, n: int, seed: int) -> None:
    spec = symo.parse_spec('name = "one hidden space"\n' + MLP_SPEC % group)
    ref, other = (_seeded(lambda: MLP((5, n, 3), act="tanh"), s) for s in (seed, 100 + seed))
    elements = list(_group(n, group == "signed_perm"))
    assert len(elements) == (24 if n == 4 else 48)
    values = [_mlp_objective(ref, other, q) for q in elements]
    best = max(range(len(values)), key=values.__getitem__)
    result = align(ref, other, spec, check=False)
    assert math.isclose(_mlp_objective(ref, other, result.matrices["h"][0]), values[best], rel_tol=1e-12)
    assert result.objective_after == pytest.approx(values[best], rel=1e-12)  # fc2.bias is not covered
    assert torch.equal(result.matrices["h"][0], elements[best])


def test_two_spaces_with_restarts_reach_the_brute_force_optimum() -> None:
    """S_4 x S_4 (576 elements): coordinate descent with restarts finds the exhaustive maximum."""
    ref, other = (_seeded(lambda: MLP((3, 4, 4, 2), act="relu"), s) for s in (0, 1))
    compiled = symo.compile("mlp_relu", ref)
    tensors = [{n: p.detach() for n, p in m.named_parameters()} for m in (ref, other)]
    best = -math.inf
    for q1 in _group(4, False):
        for q2 in _group(4, False):
            w = other
            value = ((ref.fc1.weight * (q1 @ w.fc1.weight)).sum() + (ref.fc1.bias * (q1 @ w.fc1.bias)).sum()
                     + (ref.fc2.weight * (q2 @ w.fc2.weight @ q1.T)).sum() + (ref.fc2.bias * (q2 @ w.fc2.bias)).sum()
                     + (ref.fc3.weight * (w.fc3.weight @ q2.T)).sum() + (ref.fc3.bias * w.fc3.bias).sum())
            best = max(best, float(value.detach()))
    match = weight_matching(compiled, *tensors, restarts=8, seed=0)
    assert match.objective_after == pytest.approx(best, rel=1e-12)


def test_procrustes_reaches_the_nuclear_norm() -> None:
    """One O(k) space: max over O(k) of <C, Q> is the nuclear norm of C = U_ref^T U_other + V_ref^T V_other."""
    ref, other = _seeded(Factored, 0), _seeded(Factored, 1)
    result = align(ref, other, "factored", check=False)
    c = (ref.U.T @ other.U + ref.V.T @ other.V).detach()
    assert result.objective_after == pytest.approx(float(torch.linalg.matrix_norm(c, ord="nuc")), rel=1e-12)
    q = result.elements["k"]
    assert torch.allclose(q @ q.T, torch.eye(3, dtype=torch.float64), atol=1e-12)


# ---------------------------------------------------------------- activation matching
@pytest.mark.parametrize("label,factory,spec,sizes,inputs", [CASES[0], CASES[1], CASES[4]],
                         ids=[CASES[i][0] for i in (0, 1, 4)])
def test_activation_matching_aligns_a_moved_model_back(label, factory, spec, sizes, inputs) -> None:
    ref = _seeded(factory, 0)
    compiled = symo.compile(spec, ref, sizes=sizes) if spec else symo.compile(symo.infer_spec(ref), ref)
    g = compiled.random_element(torch.Generator().manual_seed(5), dtype=torch.float64)
    other = _moved_copy(factory, compiled, g)
    torch.manual_seed(1)
    data = [inputs() for _ in range(8)]
    data = [x.double() if x.is_floating_point() else x for x in data]
    result = align(ref, other, compiled, method="activations", data=data)
    assert {s.method for s in result.spaces} == {"activations"}, result.report()
    inverses = inverse_element(compiled, g)
    for s, info in compiled.spaces.items():
        if info["group"] != "identity":
            assert torch.allclose(result.matrices[s], inverses[s], atol=1e-6), s


def test_spaces_not_found_in_the_forward_pass_fall_back_to_weights() -> None:
    ref, other = _seeded(lambda: RNN(3, 8, 2), 0), _seeded(lambda: RNN(3, 8, 2), 1)
    result = align(ref, other, "rnn_tanh", method="activations", data=[torch.randn(4, 5, 3, dtype=torch.float64)])
    assert [s.method for s in result.spaces] == ["weights"]


# ---------------------------------------------------------------- bad input
def test_models_of_different_shapes_are_refused() -> None:
    with pytest.raises(AlignError, match=r"different shapes: 'fc1.weight' is \(16, 8\) in reference and \(12, 8\)"):
        align(MLP((8, 16, 16, 4)), MLP((8, 12, 16, 4)), "mlp_tanh")


def test_a_spec_that_covers_neither_model_is_refused() -> None:
    with pytest.raises(AlignError, match="covers none of the models' parameters"):
        align(MLP((8, 16, 16, 4)), MLP((8, 16, 16, 4)), "gpt_true")


def test_a_relaxed_spec_warns_and_names_the_spaces() -> None:
    ref, other = _seeded(lambda: GPT(TINY_GPT), 0), _seeded(lambda: GPT(TINY_GPT), 1)
    with pytest.warns(AlignWarning, match=r"2 space\(s\) are not true symmetries .*mlp0, mlp1"):
        result = align(ref, other, "gpt", sizes=HEAD_SIZES)
    assert result.relaxed == ["mlp0", "mlp1"]


def test_inputs_that_are_not_models_are_refused() -> None:
    with pytest.raises(AlignError, match="other is not a model"):
        align(MLP(), {"fc1.weight": "not a tensor"}, "mlp_tanh")
    with pytest.raises(AlignError, match="needs both models as nn.Modules and data"):
        align(MLP(), MLP(), "mlp_tanh", method="activations")
    with pytest.raises(AlignError, match="method must be one of"):
        align(MLP(), MLP(), "mlp_tanh", method="sinkhorn")


def test_state_dicts_with_tied_weights_move_both_names() -> None:
    ref, other = _seeded(lambda: GPT(TINY_GPT), 0), _seeded(lambda: GPT(TINY_GPT), 1)
    compiled = symo.compile(symo.infer_spec(ref), ref)
    result = align(ref.state_dict(), other.state_dict(), compiled)
    assert result.model["lm_head.weight"] is result.model["transformer.wte.weight"]
    model = GPT(TINY_GPT).double()
    model.load_state_dict(result.model)
    x = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        assert torch.allclose(model(x)[0], other(x)[0], atol=1e-10)


# ---------------------------------------------------------------- interpolate, repair, barrier
def test_interpolate_modules_and_state_dicts() -> None:
    a, b = _warm_batchnorm(_seeded(ConvBN, 0), 0), _warm_batchnorm(_seeded(ConvBN, 1), 1)
    b.bn1.num_batches_tracked.fill_(99)
    mid = interpolate(a, b, 0.25)
    assert torch.allclose(mid.conv1.weight, 0.75 * a.conv1.weight + 0.25 * b.conv1.weight)
    assert torch.allclose(mid.bn1.running_var, 0.75 * a.bn1.running_var + 0.25 * b.bn1.running_var)
    assert int(mid.bn1.num_batches_tracked) == int(a.bn1.num_batches_tracked)
    sd = interpolate(a.state_dict(), b.state_dict(), 1.0)
    assert all(torch.equal(sd[k], v) for k, v in b.state_dict().items() if v.is_floating_point())
    with pytest.raises(AlignError, match="alpha must be a finite number"):
        interpolate(a, b, float("nan"))
    with pytest.raises(AlignError, match="different shapes"):
        interpolate(MLP((8, 16, 4)), MLP((8, 12, 4)), 0.5)


def test_repair_resets_batchnorm_statistics_to_the_datas() -> None:
    model = _seeded(ConvBN, 0)
    gen = torch.Generator().manual_seed(2)
    data = [torch.randn(8, 1, 6, 6, generator=gen, dtype=torch.float64) for _ in range(3)]
    fixed = repair(model, data)
    x = torch.cat(data)
    pre = model.conv1(x).transpose(0, 1).reshape(6, -1)  # bn1's input, channel-major
    assert torch.allclose(fixed.bn1.running_mean, pre.mean(1), atol=1e-12)
    per_batch = pre.reshape(6, 3, -1).var(2, unbiased=True)  # BatchNorm averages each batch's unbiased variance
    assert torch.allclose(fixed.bn1.running_var, per_batch.mean(1), atol=1e-12)
    assert torch.equal(model.bn1.running_mean, torch.zeros(6, dtype=torch.float64))  # the input is left as it was


def test_repair_gives_each_unit_the_interpolated_mean_and_spread() -> None:
    a, b = _seeded(lambda: MLP((6, 10, 10, 3), act="relu"), 0), _seeded(lambda: MLP((6, 10, 10, 3), act="relu"), 1)
    data = [torch.randn(64, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    x = torch.cat(data)

    def hidden(m: MLP) -> list[torch.Tensor]:  # pre-activations of both hidden layers, by hand
        h1 = x @ m.fc1.weight.T + m.fc1.bias
        return [h1, torch.relu(h1) @ m.fc2.weight.T + m.fc2.bias]

    merged = repair(interpolate(a, b, 0.3), data, parents=(a, b), alpha=0.3)
    for ha, hb, hm in zip(hidden(a), hidden(b), hidden(merged)):
        assert torch.allclose(hm.mean(0), 0.7 * ha.mean(0) + 0.3 * hb.mean(0), atol=1e-9)
        sd = [h.std(0, unbiased=False) for h in (ha, hb, hm)]
        assert torch.allclose(sd[2], 0.7 * sd[0] + 0.3 * sd[1], atol=1e-9)


def test_barrier_matches_the_closed_form_path() -> None:
    """A linear model with squared loss: L(alpha) is a quadratic in alpha, computed here directly."""
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1, bias=False).double(), nn.Linear(4, 1, bias=False).double()
    x, y = torch.randn(32, 4, dtype=torch.float64), torch.randn(32, 1, dtype=torch.float64)
    data = [(x[:16], y[:16]), (x[16:], y[16:])]

    def loss_fn(model, batch):
        return {"loss": ((model(batch[0]) - batch[1]) ** 2).mean(), "acc": (model(batch[0]) > 0).double().mean()}

    res = barrier(a, b, loss_fn, data, alphas=5)
    for alpha, got in zip(res.alphas, res.values["loss"]):
        w = ((1 - alpha) * a.weight + alpha * b.weight).detach()
        assert got == pytest.approx(float(((x @ w.T - y) ** 2).mean()), rel=1e-12)
    line = [(1 - al) * res.values["loss"][0] + al * res.values["loss"][-1] for al in res.alphas]
    assert res.barrier("loss") == pytest.approx(max(v - l for v, l in zip(res.values["loss"], line)))
    assert res.barrier("loss") <= 1e-12  # convex in the weights: never above the chord
    acc = res.values["acc"]
    assert res.barrier("acc") == pytest.approx(max((1 - al) * acc[0] + al * acc[-1] - v
                                                   for al, v in zip(res.alphas, acc)))
    assert res.midpoint("loss") == res.values["loss"][2]
    with pytest.raises(KeyError, match=r"no values named 'los' on this path; loss_fn returned \['acc', 'loss'\]"):
        res.barrier("los")
    same = barrier(a, a, loss_fn, data, alphas=3)
    assert same.barrier("loss") == pytest.approx(0.0, abs=1e-12)


def test_facade_names() -> None:
    """symo.align, interpolate, repair and barrier are the root's names for the functions of the symo.alignment
    package (no name is both a package and a function)."""
    assert symo.align is align and symo.interpolate is interpolate and symo.repair is repair
    assert symo.barrier is barrier
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from symo.alignment import matching  # noqa: F401
    assert symo.alignment is sys.modules["symo.alignment"] and callable(symo.align)


def test_the_per_block_contraction_is_the_gradient_of_the_group_action() -> None:
    """C for one space, as a contraction per block, against autograd through CompiledSpec.act."""
    from symo.alignment.matching import _autograd_gradient, _contraction, moving_per_spaces

    model = _seeded(lambda: GPT(TINY_GPT), 0)
    compiled = symo.compile(symo.infer_spec(model), model)
    ref = {n: p.detach() for n, p in model.named_parameters()}
    other = {n: v + torch.randn_like(v) for n, v in ref.items()}
    element = compiled.random_element(torch.Generator().manual_seed(0), dtype=torch.float64)
    for s, info in compiled.spaces.items():
        # a head owner whose per-spaces move (heads permuted as wholes) is differentiated by autograd, not contracted
        if info["group"] != "identity" and not moving_per_spaces(compiled, s):
            names = compiled.space_params[s]
            assert torch.allclose(_contraction(compiled, element, s, ref, other, names),
                                  _autograd_gradient(compiled, element, s, ref, other, names), atol=1e-12), s
