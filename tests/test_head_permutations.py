"""Heads permuted as wholes: a `per` space under a perm (or signed_perm) owner, attention's whole symmetry group
(a wreath product: the heads permuted, each carrying its own O(d_head) on its query/key and value/output bases).

Each test keeps its own reference: an attention model written here (nn.Linear q, k, v, o projections and
scaled_dot_product_attention), the group action written out per head, the orbit average by enumerating the
group, and the alignment's optimum by a linear assignment on nuclear norms computed from the weights."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from symo.compiler import compile_spec
from torch import nn

import symo
from symo.alignment.matching import weight_matching
from symo.runtime.compiled import CompiledSpec

pytestmark = pytest.mark.usefixtures("one_thread_module")

D, HEADS, D_HEAD, MLP = 8, 3, 2, 6


class Attention(nn.Module):
    """One pre-norm-free transformer block: causal multi-head attention (q, k, v, o projections) and a ReLU
    MLP, each on a residual. `k_major`: the key projection stores its rows d_head-major, (d_head head), where
    the others store (head d_head); `mix`: a hidden-to-hidden layer `r` inside the MLP (its space repeats)."""

    def __init__(self, d: int = D, heads: int = HEADS, d_head: int = D_HEAD, mlp: int = MLP,
                 k_major: bool = False, mix: bool = False) -> None:
        super().__init__()
        self.heads, self.d_head, self.k_major = heads, d_head, k_major
        self.q, self.k, self.v = (nn.Linear(d, heads * d_head) for _ in range(3))
        self.o = nn.Linear(heads * d_head, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)
        self.r = nn.Linear(mlp, mlp, bias=False) if mix else None  # hidden -> hidden: the MLP space twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(z: torch.Tensor) -> torch.Tensor:  # (b, t, heads * d_head) -> (b, heads, t, d_head)
            return z.view(b, t, self.heads, self.d_head).transpose(1, 2)

        k = self.k(x)
        k = k.view(b, t, self.d_head, self.heads).transpose(2, 3).transpose(1, 2) if self.k_major else split(k)
        y = F.scaled_dot_product_attention(split(self.q(x)), k, split(self.v(x)), is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        h = torch.relu(self.fc1(x))
        return x + self.fc2(h if self.r is None else torch.relu(self.r(h)))


def spec_text(owner: str = "perm", k_rows: str = "(head dqk)", o_cols: str = "(head dvo)") -> str:
    return f'''name = "attention, heads {owner}"

[spaces]
head = {{ group = "{owner}" }}
dqk  = {{ group = "orthogonal", per = "head", size = {D_HEAD} }}
dvo  = {{ group = "orthogonal", per = "head", size = {D_HEAD} }}
mlp  = {{ group = "perm" }}

[params]
"q.weight"   = ["(head dqk)", "_"]
"q.bias"     = ["(head dqk)"]
"k.weight"   = ["{k_rows}", "_"]
"k.bias"     = ["{k_rows}"]
"v.weight"   = ["(head dvo)", "_"]
"v.bias"     = ["(head dvo)"]
"o.weight"   = ["_", "{o_cols}"]
"fc1.weight" = ["mlp", "_"]
"fc1.bias"   = ["mlp"]
"fc2.weight" = ["_", "mlp"]
'''


def attention(seed: int, **kwargs) -> Attention:
    torch.manual_seed(seed)
    return Attention(**kwargs).double()


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def inputs(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def output_loss(model: nn.Module, x: torch.Tensor):
    return lambda w: torch.func.functional_call(model, w, (x,)).pow(2).sum()


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

# ---------------------------------------------------------------------------------------------- the curvature
def brute_orbit_average(vectors: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(vectors)
    return stacked.T @ stacked / len(vectors)


def signed_perms(n: int) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """B_n as (permutation, signs): x'_i = s_i x_pi(i). On R^n its commutant is O(n)'s (the scalars), so it
    stands in for Haar O(n) in an orbit average (docs/theory.md)."""
    return [(p, torch.tensor(s, dtype=torch.float64)) for p in itertools.permutations(range(n))
            for s in itertools.product((1.0, -1.0), repeat=n)]


def matrix(perm: tuple[int, ...], signs: torch.Tensor) -> torch.Tensor:
    return torch.eye(len(perm), dtype=torch.float64)[list(perm)] * signs.unsqueeze(1)


CURVATURE_A = '''[spaces]
head = { group = "perm" }
dqk = { group = "orthogonal", per = "head" }

[params]
"q" = ["(head dqk)", "_"]
"k" = ["(head dqk)", "_"]
"g" = ["head"]
'''


REPEATED_HEAD = '"m" = ["head", "head"]\n'  # a head-to-head matrix: the owner twice (compiler.repeated)


@pytest.mark.parametrize("repeated", [False, True], ids=["single", "head twice"])
def test_orbit_average_of_heads_permuted_with_their_rotations_against_enumeration(repeated: bool) -> None:
    """S_3 wreath O(2): q, k rows (head dqk) and a per-head gain g (the owner alone: its trivial and standard
    pieces); `repeated` adds m (head x head), moved as P m P^T, which compiles through compiler.repeated. The
    compiled S equals the average over every element (O(2) by its stand-in B_2), and commutes with Haar
    elements."""
    n, k, d = 3, 2, 3
    shapes = {"q": (n * k, d), "k": (n * k, d), "g": (n,)} | ({"m": (n, n)} if repeated else {})
    text = CURVATURE_A + (REPEATED_HEAD if repeated else "")
    compiled = symo.compile(symo.parse_spec(text), shapes, sizes={"head": n})
    assert {b.name for b in compiled.blocks} == ({"ind(head) x nat(dqk)", "std(head)", "trivial"}
                                                 | ({"alt(head)"} if repeated else set()))
    gen = torch.Generator().manual_seed(0)
    grads = {name: torch.randn(shape, dtype=torch.float64, generator=gen) for name, shape in shapes.items()}
    rotations = [matrix(*e) for e in signed_perms(k)]
    vectors = []
    for pi in itertools.permutations(range(n)):
        idx = list(pi)
        for rs in itertools.product(rotations, repeat=n):
            r = torch.stack(rs)
            q, kk = (torch.einsum("hij,hjd->hid", r, grads[x].view(n, k, d)[idx]) for x in ("q", "k"))
            mixed = [grads["m"][idx][:, idx].reshape(-1)] if repeated else []
            vectors.append(torch.cat([q.reshape(-1), kk.reshape(-1), grads["g"][idx], *mixed]))
    expected = brute_orbit_average(vectors)
    got = compiled.orbit_average(grads).dense()
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    # the per-head blocks pooled: not the statistic with heads kept in place (identity owner)
    kept_spec = symo.parse_spec(text.replace('head = { group = "perm" }', 'head = { group = "identity" }'))
    kept = symo.compile(kept_spec, shapes, sizes={"head": n})
    assert float((kept.orbit_average(grads).dense() - expected).abs().max()) > 1e-3
    _assert_commutes_with_haar(compiled, got, shapes)


CURVATURE_B = '''[spaces]
head = { group = "signed_perm" }
dqk = { group = "orthogonal", per = "head" }
dvo = { group = "perm", per = "head" }

[params]
"q" = ["(head dqk)", "_"]
"k" = ["(head dqk)", "_"]
"v" = ["(head dvo)", "_"]
"o" = ["_", "(head dvo)"]
"g" = ["head"]
'''


@pytest.mark.parametrize("repeated", [False, True], ids=["single", "head twice"])
def test_orbit_average_of_signed_heads_with_rotations_and_unit_permutations_against_enumeration(
        repeated: bool) -> None:
    """A signed_perm owner of 2 heads, an O(2) per head on q, k and a per-head permutation of 3 value units on
    v's rows and o's columns (its trivial piece meets the owner's own piece, as g does; its standard piece is
    induced over the heads); `repeated` adds m (head x head), moved as (S P) m (S P)^T."""
    n, k, m, d = 2, 2, 3, 3
    shapes = {"q": (n * k, d), "k": (n * k, d), "v": (n * m, d), "o": (d, n * m), "g": (n,)}
    shapes |= {"m": (n, n)} if repeated else {}
    compiled = symo.compile(symo.parse_spec(CURVATURE_B + (REPEATED_HEAD if repeated else "")), shapes,
                            sizes={"head": n})
    assert {b.name for b in compiled.blocks} == ({"ind(head) x nat(dqk)", "ind(head) x std(dvo)", "nat(head)"} | (
        {"trivial", "diag(head)", "sym(head)", "alt(head)"} if repeated else set()))
    gen = torch.Generator().manual_seed(1)
    grads = {name: torch.randn(shape, dtype=torch.float64, generator=gen) for name, shape in shapes.items()}
    rotations = [matrix(*e) for e in signed_perms(k)]
    units = [torch.eye(m, dtype=torch.float64)[list(p)] for p in itertools.permutations(range(m))]
    q0, k0, v0 = (grads[x].view(n, -1, d) for x in ("q", "k", "v"))
    o0 = grads["o"].view(d, n, m).transpose(0, 1)  # (head, d, dvo)
    vectors = []
    for pi in itertools.permutations(range(n)):
        idx = list(pi)
        for signs in itertools.product((1.0, -1.0), repeat=n):
            s = torch.tensor(signs, dtype=torch.float64)
            for rs in itertools.product(rotations, repeat=n):
                r = torch.stack(rs) * s.view(n, 1, 1)
                q, kk = (torch.einsum("hij,hjd->hid", r, x[idx]) for x in (q0, k0))
                for ps in itertools.product(units, repeat=n):
                    p = torch.stack(ps) * s.view(n, 1, 1)
                    v = torch.einsum("hij,hjd->hid", p, v0[idx])
                    o = torch.einsum("hej,hij->hei", o0[idx], p)  # columns moved by P: o P^T
                    mixed = [(s[:, None] * s[None, :] * grads["m"][idx][:, idx]).reshape(-1)] if repeated else []
                    vectors.append(torch.cat([q.reshape(-1), kk.reshape(-1), v.reshape(-1),
                                              o.transpose(0, 1).reshape(-1), s * grads["g"][idx], *mixed]))
    assert len(vectors) == math.factorial(n) * 2 ** n * 8 ** n * 6 ** n
    expected = brute_orbit_average(vectors)
    got = compiled.orbit_average(grads).dense()
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    _assert_commutes_with_haar(compiled, got, shapes)


def _assert_commutes_with_haar(compiled: CompiledSpec, s: torch.Tensor, shapes: dict) -> None:
    """A_g S A_g^T = S for random (Haar) elements, A_g built column by column from `act`."""
    sizes = [math.prod(shape) for shape in shapes.values()]
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        element = compiled.random_element(gen)
        columns = []
        for e in torch.eye(sum(sizes), dtype=torch.float64):
            parts = dict(zip(shapes, (x.view(shape) for x, shape in zip(e.split(sizes), shapes.values()))))
            moved = compiled.act(element, parts)
            columns.append(torch.cat([moved[name].reshape(-1) for name in shapes]))
        a = torch.stack(columns, 1)
        torch.testing.assert_close(a @ s @ a.T, s, atol=1e-12, rtol=1e-10)


FAMILY = f'''[spaces]
"head{{i}}" = {{ group = "perm" }}
"dqk{{i}}"  = {{ group = "orthogonal", per = "head{{i}}", size = {D_HEAD} }}
"dvo{{i}}"  = {{ group = "orthogonal", per = "head{{i}}", size = {D_HEAD} }}
"mlp{{i}}"  = {{ group = "perm" }}

[params]
"l.{{i}}.q.weight"   = ["(head{{i}} dqk{{i}})", "_"]
"l.{{i}}.k.weight"   = ["(head{{i}} dqk{{i}})", "_"]
"l.{{i}}.v.weight"   = ["(head{{i}} dvo{{i}})", "_"]
"l.{{i}}.o.weight"   = ["_", "(head{{i}} dvo{{i}})"]
"l.{{i}}.fc1.weight" = ["mlp{{i}}", "_"]
"l.{{i}}.fc2.weight" = ["_", "mlp{{i}}"]
'''


def test_a_family_of_layers_compiles_the_pooled_heads_as_layer_by_layer() -> None:
    """Two layers (`{i}`) are one family: the loop's generated code gives the per-layer code's S."""
    model = nn.ModuleDict({"l": nn.ModuleList([Attention(), Attention()])}).double()
    spec = symo.parse_spec(FAMILY)
    looped = CompiledSpec(compile_spec(spec, model, disk_cache=False, templates=True))
    plain = CompiledSpec(compile_spec(spec, model, disk_cache=False, templates=False))
    assert "families of identical layers" in looped.source and "families of identical layers" not in plain.source
    grads = {n: torch.randn_like(p) for n, p in model.named_parameters() if n in plain.shapes}
    torch.testing.assert_close(looped.orbit_average(grads).dense(), plain.orbit_average(grads).dense(),
                               atol=1e-12, rtol=0)
    names = [b.name for b in plain.blocks]
    assert names.count("ind(head0) x nat(dqk0)") == 1 and names.count("ind(head1) x nat(dvo1)") == 1


def test_the_optimizer_steps_with_heads_permuted_and_stays_equivariant() -> None:
    model, x = attention(0), inputs()
    compiled = symo.compile(symo.parse_spec(spec_text()), model)

    def loss(m: nn.Module) -> torch.Tensor:
        return m(x).pow(2).mean()

    for preset in ("notebook", "default"):  # the orbit-averaged curvature's S^-1/2, and Symo's defaults
        options = {"preset": "notebook"} if preset == "notebook" else {}

        def make(ps, options: dict = options) -> symo.Symo:
            return symo.Symo(ps, compiled, lr=1e-3, **options)

        report = symo.check_equivariance(make, model, compiled, loss, steps=3)
        assert report.is_symmetry and report.is_equivariant, (preset, report.summary())
        assert report.first_step_defect < 1e-14, (preset, report.divergence)


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
