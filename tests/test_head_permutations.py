"""Heads permuted as wholes: a `per` space under a perm (or signed_perm) owner, attention's whole symmetry group
(a wreath product: the heads permuted, each carrying its own O(d_head) on its query/key and value/output bases).

Each test keeps its own reference: an attention model written in the tests (tests/attention_cases.py: nn.Linear q,
k, v, o projections and scaled_dot_product_attention), the group action written out per head, and the alignment's
optimum by a linear assignment on nuclear norms computed from the weights. (The curvature, the orbit average against
the group enumerated: test_head_permutation_curvature.py.)"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from attention_cases import D_HEAD, HEADS, Attention, D, attention, inputs, output_loss, spec_text, weights
from scipy.optimize import linear_sum_assignment
from torch import nn

import symo
from symo.alignment.matching import weight_matching
from symo.runtime.compiled import CompiledSpec

pytestmark = pytest.mark.usefixtures("one_thread_module")


# ---------------------------------------------------------------------------------------------- the group action
def test_the_wreath_product_is_a_true_symmetry_of_attention() -> None:
    model, x = attention(0), inputs()
    compiled = symo.compile(symo.parse_spec(spec_text()), model)
    assert compiled.spaces["head"] == {"group": "perm", "size": HEADS, "per": None}
    element = compiled.random_element(torch.Generator().manual_seed(1))
    assert element["head"].shape == (1, HEADS, HEADS) and element["dqk"].shape == (HEADS, D_HEAD, D_HEAD)
    report = symo.check_symmetry(output_loss(model, x), compiled, weights(model), trials=6)
    assert report.is_true_symmetry, report
    # the action moves the weights (and the outputs stay): a head permutation with per-head rotations
    moved = compiled.act(element, weights(model))
    assert float((moved["q.weight"] - model.q.weight.detach()).abs().max()) > 0.1
    torch.testing.assert_close(torch.func.functional_call(model, moved, (x,)), model(x), atol=1e-12, rtol=0)
    # `symo check`: each space on its own
    rows = {r.space: r.status for r in symo.check_spec(symo.parse_spec(spec_text()), model, (x,))}
    assert rows == {"head": "true", "dqk": "true", "dvo": "true", "mlp": "true"}


def test_a_spec_that_permutes_heads_without_the_output_columns_is_not_a_symmetry() -> None:
    """The check can fail: o's columns left free, the heads' values are permuted and rotated but never undone."""
    model = attention(0)
    text = spec_text().replace('"o.weight"   = ["_", "(head dvo)"]', '"o.weight"   = ["_", "_"]')
    compiled = symo.compile(symo.parse_spec(text), model)
    report = symo.check_symmetry(output_loss(model, inputs()), compiled, weights(model))
    assert not report.is_true_symmetry and report.max_rel_change > 1e-3


def test_owners_act_before_their_per_spaces_whatever_the_atoms_order() -> None:
    """k's rows stored (d_head head), q's (head d_head): the same element must move both alike (head slot i
    gets head pi(i) rotated by the element i), or q.k changes."""
    model, x = attention(0, k_major=True), inputs()
    compiled = symo.compile(symo.parse_spec(spec_text(k_rows="(dqk head)")), model)
    report = symo.check_symmetry(output_loss(model, x), compiled, weights(model), trials=6)
    assert report.is_true_symmetry, report
    # written out per head: q'[i] = R_i q[pi(i)], and k's rows, d-major, the same
    element = compiled.random_element(torch.Generator().manual_seed(2))
    pi, rot = element["head"][0].argmax(-1), element["dqk"]
    moved = compiled.act(element, weights(model))
    q = model.q.weight.detach().view(HEADS, D_HEAD, D)
    k = model.k.weight.detach().view(D_HEAD, HEADS, D).transpose(0, 1)
    torch.testing.assert_close(moved["q.weight"].view(HEADS, D_HEAD, D), torch.einsum("hij,hjd->hid", rot, q[pi]))
    torch.testing.assert_close(moved["k.weight"].view(D_HEAD, HEADS, D).transpose(0, 1),
                               torch.einsum("hij,hjd->hid", rot, k[pi]))


# ---------------------------------------------------------------------------------------------- alignment
def moved_copy(model: Attention, seed: int) -> tuple[Attention, CompiledSpec]:
    compiled = symo.compile(symo.parse_spec(spec_text()), model)
    element = compiled.random_element(torch.Generator().manual_seed(seed))
    assert not torch.equal(element["head"][0], torch.eye(HEADS, dtype=torch.float64))
    other = copy.deepcopy(model)
    moved = compiled.act(element, weights(model))
    with torch.no_grad():
        for n, p in other.named_parameters():
            p.copy_(moved[n])
    return other, compiled


@pytest.mark.parametrize("method", ["weights", "activations"])
def test_align_recovers_a_copy_moved_by_heads_rotations_and_mlp_units(method: str) -> None:
    model, x = attention(0), inputs()
    other, _ = moved_copy(model, seed=3)
    assert float((other.q.weight - model.q.weight).detach().abs().max()) > 0.1
    data = [inputs(s) for s in range(3)]
    result = symo.align(model, other, symo.parse_spec(spec_text()), method=method, data=data, example_inputs=(x,))
    assert not result.relaxed
    aligned = weights(result.model)
    for name, w in weights(model).items():
        torch.testing.assert_close(aligned[name], w, atol=1e-6, rtol=0, msg=name)
    torch.testing.assert_close(result.model(x), other(x), atol=1e-10, rtol=0)  # the same function as `other`
    assert result.elements["head"].shape == (HEADS,) and result.elements["dqk"].shape == (HEADS, D_HEAD, D_HEAD)


def exact_optimum(a: Attention, b: Attention, heads_move: bool = True) -> float:
    """max over the group of sum_p <W_a, g W_b> where the heads and the MLP share no parameter: per pair of heads
    (i of a, j of b) the Procrustes optima of the q/k and v/o cross matrices (their nuclear norms), a linear
    assignment over the pairs (the diagonal when heads stay in place); the MLP units by a linear assignment."""
    wa, wb = weights(a), weights(b)

    def rows(w: dict, name: str) -> torch.Tensor:  # a projection's weight and bias per head: (heads, d_head, D + 1)
        return torch.cat([w[f"{name}.weight"], w[f"{name}.bias"].unsqueeze(1)], 1).view(HEADS, D_HEAD, D + 1)

    qa, ka, va = (rows(wa, n) for n in "qkv")
    qb, kb, vb = (rows(wb, n) for n in "qkv")
    oa, ob = (w["o.weight"].view(D, HEADS, D_HEAD).transpose(0, 1) for w in (wa, wb))  # (heads, D, d_head)
    score = torch.zeros(HEADS, HEADS, dtype=torch.float64)
    for i, j in itertools.product(range(HEADS), repeat=2):
        qk = qa[i] @ qb[j].T + ka[i] @ kb[j].T
        vo = va[i] @ vb[j].T + oa[i].T @ ob[j]
        score[i, j] = torch.linalg.matrix_norm(qk, "nuc") + torch.linalg.matrix_norm(vo, "nuc")
    if heads_move:
        r, c = linear_sum_assignment(score.numpy(), maximize=True)
        head_value = float(score[r, c].sum())
    else:
        head_value = float(score.diagonal().sum())
    units = (wa["fc1.weight"] @ wb["fc1.weight"].T + torch.outer(wa["fc1.bias"], wb["fc1.bias"])
             + wa["fc2.weight"].T @ wb["fc2.weight"])
    r, c = linear_sum_assignment(units.numpy(), maximize=True)
    return head_value + float(units[r, c].sum())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_align_reaches_the_exact_optimum_of_two_independent_models(seed: int) -> None:
    a, b = attention(10 * seed), attention(10 * seed + 1)
    result = symo.align(a, b, symo.parse_spec(spec_text()), example_inputs=(inputs(),))
    optimum = exact_optimum(a, b)
    assert result.objective_after == pytest.approx(optimum, rel=1e-6)
    assert result.objective_before < optimum - 1e-3  # the identity is not already optimal


def test_keeping_heads_in_place_reaches_no_more_than_permuting_them() -> None:
    a, b = attention(30), attention(31)
    fixed = symo.align(a, b, symo.parse_spec(spec_text(owner="identity")), example_inputs=(inputs(),))
    moving = symo.align(a, b, symo.parse_spec(spec_text(owner="perm")), example_inputs=(inputs(),))
    assert fixed.objective_after == pytest.approx(exact_optimum(a, b, heads_move=False), rel=1e-6)
    assert fixed.objective_after <= moving.objective_after + 1e-9 * abs(moving.objective_after)
    assert fixed.objective_after < moving.objective_after - 1e-3  # on this pair the heads' pairing matters
    assert not torch.equal(moving.elements["head"], torch.arange(HEADS))


def test_a_signed_perm_owner_aligns_as_the_perm_owner_does() -> None:
    """Signs flip whole heads (q, k, v rows and o columns), a flip already inside each head's O(d_head): the
    same optimum."""
    a, b = attention(40), attention(41)
    signed = symo.align(a, b, symo.parse_spec(spec_text(owner="signed_perm")), example_inputs=(inputs(),))
    assert not signed.relaxed
    assert signed.objective_after == pytest.approx(exact_optimum(a, b), rel=1e-6)


def residual_spec_text() -> str:
    """spec_text with a permuted residual stream: q, k, v's inputs, o's and fc2's outputs and fc1's inputs (not a
    symmetry of Attention, whose input and output stay in place: a weight-matching problem in which the residual
    couples every head to the MLP, as in a transformer)."""
    text = spec_text().replace("[spaces]\n", '[spaces]\nres  = { group = "perm" }\n')
    for old, new in (('"(head dqk)", "_"]', '"(head dqk)", "res"]'), ('"(head dvo)", "_"]', '"(head dvo)", "res"]'),
                     ('["_", "(head dvo)"]', '["res", "(head dvo)"]'), ('["mlp", "_"]', '["mlp", "res"]'),
                     ('["_", "mlp"]', '["res", "mlp"]')):
        assert old in text
        text = text.replace(old, new)
    return text + '"o.bias"     = ["res"]\n"fc2.bias"   = ["res"]\n'


@pytest.mark.parametrize("seed", [5, 6])
def test_with_a_residual_stream_no_pairing_of_heads_beats_the_one_found(seed: int) -> None:
    """Oracle: with the residual and MLP permutations held where align left them, every pairing of heads (all 3!,
    enumerated), each with its per-head rotations solved by the ordinary per-space Procrustes steps (not the joint
    head step), reaches at most the objective align reports, and align's own pairing reaches it: the heads it
    returns are the exact optimum given the rest, also where the residual couples them to everything else."""
    a, b = attention(10 * seed), attention(10 * seed + 1)
    spec = symo.parse_spec(residual_spec_text())
    result = symo.align(weights(a), weights(b), spec)  # state dicts: a weight-matching problem, no check
    assert not torch.equal(result.elements["res"], torch.arange(D))  # the residual coupling is exercised
    compiled = result.compiled
    held = {s: result.matrices[s] for s in ("res", "mlp")}
    values = {}
    for p in itertools.permutations(range(HEADS)):
        heads = torch.eye(HEADS, dtype=torch.float64)[list(p)].unsqueeze(0)  # slot i holds other's head p[i]
        values[p] = weight_matching(compiled, weights(a), weights(b), fixed={**held, "head": heads}).objective_after
    own = tuple(int(i) for i in result.elements["head"])
    assert result.objective_after == pytest.approx(values[own], rel=1e-9)
    assert result.objective_after >= max(values.values()) - 1e-9 * abs(result.objective_after)
    assert max(values.values()) - min(values.values()) > 1e-3  # the pairing matters on this pair

# ---------------------------------------------------------------------------------------------- a repeated space
REPEATED = spec_text() + '"r.weight"   = ["mlp", "mlp"]\n'


def test_with_a_repeated_space_the_whole_toolchain_works() -> None:
    """The MLP space twice in r (compiler.repeated compiles the whole spec): the group is still a true symmetry,
    the curvature has the pooled head blocks and the optimizer is equivariant, and align recovers a moved copy."""
    model, x = attention(0, mix=True), inputs()
    compiled = symo.compile(symo.parse_spec(REPEATED), model)
    assert "repeated spaces" in compiled.source
    names = {b.name for b in compiled.blocks}
    assert {"ind(head) x nat(dqk)", "ind(head) x nat(dvo)"} <= names and "alt(mlp)" in names
    assert symo.check_symmetry(output_loss(model, x), compiled, weights(model), trials=4).is_true_symmetry

    def loss(m: nn.Module) -> torch.Tensor:
        return m(x).pow(2).mean()

    report = symo.check_equivariance(lambda ps: symo.Symo(ps, compiled, lr=1e-3, preset="notebook"), model,
                                     compiled, loss, steps=2)
    assert report.is_equivariant and report.first_step_defect < 1e-14, report.divergence
    element = compiled.random_element(torch.Generator().manual_seed(3))
    other = copy.deepcopy(model)
    moved = compiled.act(element, weights(model))
    with torch.no_grad():
        for n, p in other.named_parameters():
            p.copy_(moved[n])
    result = symo.align(model, other, symo.parse_spec(REPEATED), example_inputs=(x,))
    assert not result.relaxed
    torch.testing.assert_close(result.model.q.weight, model.q.weight, atol=1e-6, rtol=0)
    torch.testing.assert_close(result.model.r.weight, model.r.weight, atol=1e-6, rtol=0)
