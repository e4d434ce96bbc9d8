"""Repeated spaces (docs/repeated_spaces.md): a space that occurs twice in one parameter (an RNN's W_hh, acted on as
Q W Q^T), against independent oracles:

- S_n and B_n: exhaustive enumeration of every group element for n = 3 and 4 (tests/oracles.py);
- O(n): the exact Haar average through the degree-4 Weingarten formula (oracles_haar.haar_orbit_average),
  NOT B_n, whose fourth moment differs once a space repeats;
- the symbolic diagram Gram inverse against a numeric inverse, and the projection onto the diagram
  span (c = G^{-1} b) against the compiled S.
W_hh x W_hh blocks of S carry four occurrences of the space. float64 throughout.
"""

from __future__ import annotations

import itertools
import math
import warnings
from pathlib import Path

import oracles as O
import oracles_dense as OD
import oracles_haar
import pytest
import sympy
import torch
from helpers import oracle_S
from symo.compiler import bind, derive_structure, generate, parse_spec, repeated
from symo.compiler.codegen_repeated import generate_repeated
from symo.compiler.diagrams import N, diagrams, gram_matrix
from symo.compiler.repeated import check_pieces, derive_repeated, gram_inverse, has_repeated_spaces

import symo
from symo.train.rnn import RNN, TiedRNN

D = torch.float64
TOL = 1e-10
SPECS = Path(__file__).resolve().parent.parent / "specs"


def assert_near(actual: torch.Tensor, expected: torch.Tensor, tol: float = TOL) -> None:
    scale = max(1.0, float(expected.abs().max()))
    err = float((actual.to(D) - expected.to(D)).abs().max())
    assert err <= tol * scale, f"max abs error {err:.3e} > {tol:.0e} * {scale:.3e}"


def power_tol(S: torch.Tensor) -> float:
    ev = torch.linalg.eigvalsh((S + S.T) / 2)
    nz = ev[ev > 1e-12 * float(ev.abs().max()) * S.shape[0]]
    return max(TOL, 1e-13 * float(nz.max() / nz.min()))


def compile_text(text: str, shapes: dict) -> symo.CompiledSpec:
    return symo.compile(parse_spec(text, source="<test>"), shapes, disk_cache=False)


def rnn_case(group: str, n: int, d: int = 2, y: int = 2):
    text = (f'[spaces]\nh = {{ group = "{group}" }}\n[params]\n"W_ih" = ["h", "_"]\n"W_hh" = ["h", "h"]\n'
            '"b_h" = ["h"]\n"W_hy" = ["_", "h"]\n"b_y" = ["_"]\n')
    layout = [("W_ih", (n, d), ["h", "_"]), ("W_hh", (n, n), ["h", "h"]), ("b_h", (n,), ["h"]),
              ("W_hy", (y, n), ["_", "h"]), ("b_y", (y,), ["_"])]
    return text, layout


def tied_case(group: str, n: int, vocab: int = 3):
    text = (f'[spaces]\nh = {{ group = "{group}" }}\n[params]\n"E" = ["_", "h"]\n"W_hh" = ["h", "h"]\n'
            '"b_h" = ["h"]\n"b_y" = ["_"]\n')
    layout = [("E", (vocab, n), ["_", "h"]), ("W_hh", (n, n), ["h", "h"]), ("b_h", (n,), ["h"]),
              ("b_y", (vocab,), ["_"])]
    return text, layout


def random_tensors(layout, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(*shape, generator=g, dtype=D) for name, shape, _ in layout}


def check_against_oracle(compiled, S_ref: torch.Tensor, names, shapes, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1000)
    v = OD.unflatten(torch.randn(S_ref.shape[0], generator=g, dtype=D), names, shapes)
    S = compiled
    assert_near(S.dense(), S_ref)
    assert_near(OD.flatten(S.matvec(v), names), S_ref @ OD.flatten(v, names))
    root = S.power(-0.5)
    ref_root = OD.dense_power(S_ref, -0.5)
    assert_near(root.dense(), ref_root, power_tol(S_ref))
    assert_near(OD.flatten(root.matvec(v), names), ref_root @ OD.flatten(v, names), power_tol(S_ref))


CASES = [(maker, group, n) for maker in (rnn_case, tied_case)
         for group in ("perm", "signed_perm", "orthogonal") for n in (3, 4)]


@pytest.mark.parametrize("maker,group,n", CASES, ids=[f"{m.__name__}-{g}-{n}" for m, g, n in CASES])
def test_orbit_average_power_and_matvec_match_the_oracle(maker, group, n):
    text, layout = maker(group, n)
    shapes = {name: shape for name, shape, _ in layout}
    compiled = compile_text(text, shapes)
    names, covered = [x[0] for x in layout], [x[1] for x in layout]
    assert compiled.param_names == names
    grads = random_tensors(layout, seed=n)
    S_ref = oracle_S({"h": (group, n, None)}, layout, OD.flatten(grads, names))
    if group == "orthogonal":  # B_n is not a stand-in here: its fourth moment differs from Haar's
        S_bn = OD.dense_orbit_average(O.action_matrices({"h": (group, n, None)}, layout), OD.flatten(grads, names))
        assert float((S_bn - S_ref).abs().max()) > 1e-3
    check_against_oracle(compiled.orbit_average(grads), S_ref, names, covered, seed=n)
    # an EMA of two gradients is still exact (sum of two orbit averages)
    grads2 = random_tensors(layout, seed=n + 50)
    S2_ref = oracle_S({"h": (group, n, None)}, layout, OD.flatten(grads2, names))
    ema = 0.25 * compiled.orbit_average(grads) + 0.75 * compiled.orbit_average(grads2)
    check_against_oracle(ema, 0.25 * S_ref + 0.75 * S2_ref, names, covered, seed=n + 7)


@pytest.mark.parametrize("group", ["perm", "signed_perm"])
def test_two_spaces_with_a_repeated_one(group):
    """T (h, h, k) and V (k, h): a repeated space next to a single one, exhaustive over h x k."""
    n = 3
    text = (f'[spaces]\nh = {{ group = "{group}" }}\nk = {{ group = "perm" }}\n[params]\n'
            '"T" = ["h", "(h k)"]\n"V" = ["k", "h"]\n"c" = ["_"]\n')
    shapes = {"T": (n, 2 * n), "V": (2, n), "c": (2,)}
    layout = [("T", (n, 2 * n), ["h", ("h", "k")]), ("V", (2, n), ["k", "h"]), ("c", (2,), ["_"])]
    compiled = compile_text(text, shapes)
    names, covered = [x[0] for x in layout], [x[1] for x in layout]
    grads = random_tensors(layout, seed=3)
    S_ref = oracle_S({"h": (group, n, None), "k": ("perm", 2, None)}, layout, OD.flatten(grads, names))
    check_against_oracle(compiled.orbit_average(grads), S_ref, names, covered, seed=3)


@pytest.mark.parametrize("group", ["perm", "signed_perm", "orthogonal"])
def test_gather_is_orthogonal_and_s_is_invariant(group):
    text, layout = rnn_case(group, 5)
    compiled = compile_text(text, {name: shape for name, shape, _ in layout})
    grads = random_tensors(layout, seed=11)
    back = compiled.scatter(compiled.gather(grads))
    for name in grads:
        assert_near(back[name], grads[name], 1e-13)
    gen = torch.Generator().manual_seed(5)
    S = compiled.orbit_average(grads).dense()
    for _ in range(2):
        g = compiled.random_element(gen)
        moved = compiled.act(g, grads)
        assert_near(compiled.orbit_average(moved).dense(), S)


@pytest.mark.parametrize("group,expected", [("perm", 15), ("signed_perm", 4), ("orthogonal", 3)])
def test_commutant_dimension_of_rn_tensor_rn(group, expected):
    """sum over labels of multiplicity^2 = dim of the commutant on W_hh alone (n >= 4)."""
    for n in (4, 6):
        compiled = compile_text(f'[spaces]\nh = {{ group = "{group}" }}\n[params]\n"W" = ["h", "h"]\n',
                                {"W": (n, n)})
        assert sum(b.mult ** 2 for b in compiled.blocks) == expected
        assert sum(b.mult * b.dim for b in compiled.blocks) == n * n  # the pieces fill R^n (x) R^n
    if group == "perm":  # n = 3: the (n-2, 2) irrep of S_3 is empty, one fewer simple block
        compiled = compile_text('[spaces]\nh = { group = "perm" }\n[params]\n"W" = ["h", "h"]\n', {"W": (3, 3)})
        assert sum(b.mult ** 2 for b in compiled.blocks) == 14


EXPECTED_DIMS = {  # representation theory of R^n (x) R^n, written out independently
    "orthogonal": {"triv": 1, "sym": N * (N + 1) / 2 - 1, "alt": N * (N - 1) / 2},
    "signed_perm": {"triv": 1, "diag": N - 1, "sym": N * (N - 1) / 2, "alt": N * (N - 1) / 2},
    "perm": {"triv": 1, "std": N - 1, "alt": (N - 1) * (N - 2) / 2, "sym": N * (N - 3) / 2},
}


@pytest.mark.parametrize("group", ["orthogonal", "signed_perm", "perm"])
def test_symbolic_simple_blocks(group):
    """check_pieces verifies in the diagram algebra (exactly, in Q(n)) that the copy projectors are
    orthogonal idempotents summing to 1 and each irrep's sum is central; its dimensions are the
    textbook ones, and the central idempotents evaluated at n = 4, 5 are the projectors that the
    generated gather/scatter realise."""
    dims = check_pieces(group)
    copies = repeated.copy_projectors(group)
    assert set(dims) == set(EXPECTED_DIMS[group])
    for irrep, d in dims.items():
        assert sympy.simplify(d - EXPECTED_DIMS[group][irrep]) == 0
    assert sympy.simplify(sum(d * len(copies[k]) for k, d in dims.items()) - N ** 2) == 0
    for n in (4, 5):
        compiled = compile_text(f'[spaces]\nh = {{ group = "{group}" }}\n[params]\n"W" = ["h", "h"]\n', {"W": (n, n)})
        eye = torch.eye(n * n, dtype=D).reshape(n * n, n, n)
        for b in compiled.blocks:
            irrep = "triv" if b.name == "trivial" else b.name.split("(")[0]

            def project(x, block=b.id, comp=compiled):
                ys = comp.gather({"W": x})
                return comp.scatter({k: (y if k == block else torch.zeros_like(y)) for k, y in ys.items()})["W"]

            dense = torch.func.vmap(project)(eye).reshape(n * n, n * n).T
            central = repeated.piece_projectors(group)[irrep]
            symbolic = sum(float(repeated.K.to_sympy(c).subs(N, n)) * _delta(pi, n).reshape(n * n, n * n)
                           for pi, c in central.items())
            assert_near(dense, symbolic, 1e-12)
    # the check can fail: sym * alt is not sym
    proj = repeated.piece_projectors(group)
    with pytest.raises(RuntimeError):
        repeated._require_equal(repeated._multiply(proj["sym"], proj["alt"]), proj["sym"], "sym * alt")


@pytest.mark.parametrize("group", ["orthogonal", "signed_perm", "perm"])
def test_symbolic_gram_inverse_and_projection(group):
    """G^{-1} (sympy, rational in n) against numpy's inverse at several n, and the projection
    sum_pi (G^{-1} b)_pi delta_pi of v v^T onto the diagram span against the compiled S."""
    inv = gram_inverse(group)
    basis = diagrams(group, 4)
    for n in (4, 5, 7):
        numeric = torch.linalg.inv(torch.tensor(sympy.matrix2numpy(gram_matrix(group, 4).subs(N, n), dtype=float)))
        symbolic = torch.tensor(sympy.matrix2numpy(inv.subs(N, n), dtype=float))
        assert_near(symbolic, numeric, 1e-12)
    n = 4
    w = torch.randn(n, n, dtype=D, generator=torch.Generator().manual_seed(2))
    deltas = torch.stack([_delta(p, n) for p in basis])  # (|basis|, n, n, n, n): (i, j, k, l) = S[(ij),(kl)]
    b = torch.einsum("pijkl,ij,kl->p", deltas, w, w)
    coef = torch.tensor(sympy.matrix2numpy(inv.subs(N, n), dtype=float)) @ b
    projected = torch.einsum("p,pijkl->ijkl", coef, deltas).reshape(n * n, n * n)
    compiled = compile_text(f'[spaces]\nh = {{ group = "{group}" }}\n[params]\n"W" = ["h", "h"]\n', {"W": (n, n)})
    assert_near(compiled.orbit_average({"W": w}).dense(), projected)


def _delta(partition, n: int) -> torch.Tensor:
    t = torch.zeros((n,) * 4, dtype=D)
    for idx in itertools.product(range(n), repeat=4):
        if all(len({idx[i] for i in blk}) == 1 for blk in partition):
            t[idx] = 1.0
    return t


def test_both_derivations_agree_where_both_apply():
    """A spec without repeated spaces: compiler.repeated's general path gives compiler.structure's S
    (and the latter is what compile_spec emits for it)."""
    text = ('[spaces]\na = { group = "perm" }\nb = { group = "signed_perm" }\nd = { group = "orthogonal", '
            'per = "head" }\nhead = { group = "identity", size = 2 }\n[params]\n"W1" = ["a", "_"]\n'
            '"W2" = ["b", "a"]\n"Q" = ["(head d)", "b"]\n"c" = ["_"]\n')
    shapes = {"W1": (3, 2), "W2": (4, 3), "Q": (6, 4), "c": (2,)}
    spec = parse_spec(text, source="<test>")
    bound = bind(spec, shapes)
    assert not has_repeated_spaces(bound)
    single = symo.compile(spec, shapes, disk_cache=False)
    assert single.source == generate(derive_structure(bound), single.key).source
    from symo.compiler import GeneratedModule, _execute
    source = generate_repeated(derive_repeated(bound), "rep").source
    module = GeneratedModule("rep", source, None, _execute(source, Path("<rep>"), bound.sizes), bound, "built")
    paired = symo.CompiledSpec(module)
    grads = {k: torch.randn(*s, dtype=D, generator=torch.Generator().manual_seed(4)) for k, s in shapes.items()}
    assert_near(paired.orbit_average(grads).dense(), single.orbit_average(grads).dense())
    assert_near(paired.orbit_average(grads).power(-0.5).dense(), single.orbit_average(grads).power(-0.5).dense())


def test_bundled_rnn_specs_are_true_symmetries_and_compile():
    torch.manual_seed(0)
    x = torch.randn(4, 6, 2, dtype=D)
    for spec, act in (("rnn_tanh", "tanh"), ("rnn_relu", "relu")):
        model = RNN(2, 5, 1, act=act).double()
        compiled = symo.compile(symo.load_spec(spec), model, disk_cache=False)
        assert compiled.param_names == ["W_ih", "W_hh", "b_h", "W_hy", "b_y"] and not compiled.uncovered
        w = dict(model.named_parameters())
        loss = lambda p, m=model: torch.func.functional_call(m, p, (x,)).pow(2).mean()  # noqa: E731
        report = symo.check_symmetry(loss, compiled, w, trials=3)
        assert report.is_true_symmetry, report
    tied = TiedRNN(6, 5).double()
    compiled = symo.compile(symo.load_spec("rnn_tied"), tied, disk_cache=False)
    tokens = torch.randint(0, 6, (3, 5))
    loss = lambda p: torch.func.functional_call(tied, p, (tokens,)).pow(2).mean()  # noqa: E731
    assert symo.check_symmetry(loss, compiled, dict(tied.named_parameters()), trials=3).is_true_symmetry
    # and the ReLU model is NOT symmetric under sign flips: the check can fail
    relu = RNN(2, 5, 1, act="relu").double()
    signed = symo.compile(symo.load_spec("rnn_tanh"), relu, disk_cache=False)
    loss = lambda p: torch.func.functional_call(relu, p, (x,)).pow(2).mean()  # noqa: E731
    assert not symo.check_symmetry(loss, signed, dict(relu.named_parameters()), trials=3).is_true_symmetry


def test_optimizer_first_update_is_inverse_root_of_exact_s():
    """Symo on the tanh RNN (beta1 = 0, no damping): the first update is S_g^{-1/2} g, S_g from
    exhaustive B_3 enumeration."""
    torch.manual_seed(1)
    n = 3
    model = RNN(2, n, 2).double()
    x, y = torch.randn(8, 5, 2, dtype=D), torch.randn(8, 2, dtype=D)

    def loss_fn():
        return ((model(x) - y) ** 2).mean()

    loss_fn().backward()
    names = [name for name, _ in model.named_parameters()]
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    opt = symo.Symo(model.named_parameters(), SPECS / "rnn_tanh.toml", lr=0.1, beta1=0.0, damping=0.0,
                    backend="eigh")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss_fn().backward()
    opt.step()
    update = OD.flatten({k: (before[k] - p.detach()) / 0.1 for k, p in model.named_parameters()}, names)
    _, layout = rnn_case("signed_perm", n)
    g = OD.flatten(grads, names)
    S_ref = oracle_S({"h": ("signed_perm", n, None)}, layout, g)
    assert_near(update, OD.dense_power(S_ref, -0.5) @ g, power_tol(S_ref))


def test_unsupported_repeats_raise_located_spec_errors():
    cases = [
        ('[spaces]\nh = "signed_perm"\n[params]\n"T" = ["h", "(h h)"]\n', {"T": (3, 9)}, "3 times"),
        ('[spaces]\nh = "perm"\n[params]\n"W" = ["h", "h"]\n', {"W": (2, 2)}, "size >= 3"),
        ('[spaces]\nhead = { group = "identity", size = 2 }\nd = { group = "orthogonal", per = "head" }\n'
         '[params]\n"W" = ["(head d)", "(head d)"]\n', {"W": (4, 4)}, "per"),
    ]
    for text, shapes, words in cases:
        with pytest.raises(symo.SpecError) as info:
            compile_text(text, shapes)
        assert words in str(info.value) and info.value.key and info.value.hint, str(info.value)


def test_cost_is_linear_in_the_parameters():
    """Memory of the factors stays far below P^2 at a moderate width (no n^4 object anywhere)."""
    n = 64
    model = RNN(3, n, 2)
    compiled = symo.compile(symo.load_spec("rnn_relu"), model, disk_cache=False)
    mem = compiled.memory()
    assert mem["factors"] < mem["params"] and mem["factors"] * 1000 < mem["dense"]
    assert math.isclose(sum(b.mult * b.dim for b in compiled.blocks), mem["params"])


def test_haar_oracle_closed_forms():
    """The Weingarten oracle against moments of a uniform unit vector (a column of Haar Q):
    E[x_1^4] = 3 / (n (n + 2)), E[x_1^2 x_2^2] = 1 / (n (n + 2)); and E[tr(Q)^4] = 3 (Diaconis-Shahshahani)."""
    for n in (3, 4):
        m = oracles_haar.haar_moment(4, n)
        assert math.isclose(float(m[0, 0, 0, 0, 0, 0, 0, 0]), 3 / (n * (n + 2)), rel_tol=1e-12)
        assert math.isclose(float(m[0, 0, 1, 1, 0, 0, 0, 0]), 1 / (n * (n + 2)), rel_tol=1e-12)
        assert math.isclose(float(torch.einsum("ijklijkl->", m)), 3.0, rel_tol=1e-12)
        assert float(oracles_haar.haar_moment(3, n).abs().max()) == 0.0


@pytest.mark.parametrize("group", ["perm", "signed_perm"])
def test_fused_axis_and_per_space_next_to_a_repeated_space(group):
    """W = [[h | free], h] (one block repeats h, one does not) and a per-head O(2) space in Q, exhaustive
    (d occurs once per block, so B_2 is exact for it)."""
    n = 3
    text = (f'[spaces]\nh = {{ group = "{group}" }}\nhead = {{ group = "identity", size = 2 }}\n'
            'd = { group = "orthogonal", per = "head" }\n[params]\n"W" = [["h", "_"], "h"]\n"Q" = ["(head d)", "h"]\n')
    shapes = {"W": (n + 2, n), "Q": (4, n)}
    layout = [("W", (n + 2, n), [["h", ("_", 2)], "h"]), ("Q", (4, n), [("head", "d"), "h"])]
    spaces = {"h": (group, n, None), "head": ("identity", 2, None), "d": ("orthogonal", 2, "head")}
    compiled = compile_text(text, shapes)
    grads = random_tensors(layout, seed=21)
    S_ref = OD.dense_orbit_average(O.action_matrices(spaces, layout), OD.flatten(grads, ["W", "Q"]))
    check_against_oracle(compiled.orbit_average(grads), S_ref, ["W", "Q"], [(n + 2, n), (4, n)], seed=21)


def test_muons_scale_on_a_repeated_space_warns_naming_it():
    """docs/repeated_spaces.md, "Limits": Muon's per-shape scale does not fit a repeated space's pieces."""
    model = RNN(3, 6, 2, act="tanh")
    compiled = symo.compile("rnn_tanh", model, disk_cache=False)
    assert compiled.repeated_spaces == {"h": ["W_hh"]}
    with pytest.warns(UserWarning, match=r"space 'h' acts on two axes of W_hh \(a repeated space\).*pass "
                                         r"update_scale='natural' or 'adamw'"):
        symo.Symo(model, "rnn_tanh", update_scale="muon")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        symo.Symo(model, "rnn_tanh")  # the natural scale: no warning
        symo.Symo(model, "rnn_muon", update_scale="muon")  # no repeated space
    assert symo.compile("gpt_muon", symo.models.gpt_small(), disk_cache=False).repeated_spaces == {}
