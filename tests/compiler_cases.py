"""The cases of tests/test_compiler_oracles.py, each written twice: as a spec (what the library compiles) and as
an oracle layout (tests/oracles.py's own description, which never goes through the spec language); and the
helpers that build a case's compiled spec, its dense group elements and random tensors (also used by
test_compiler_closed_forms.py). float64 throughout."""

from __future__ import annotations

from dataclasses import dataclass

import oracles as O
import oracles_dense as OD
import torch
from cases import MLP_SPEC
from helpers import oracle_S

import symo

D = torch.float64
TOL = 1e-10


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_near(actual: torch.Tensor, expected: torch.Tensor, tol: float = TOL) -> None:
    """max |actual - expected| <= tol * max(1, max |expected|): relative to the data's scale."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    err = float((actual.to(D) - expected.to(D)).abs().max()) if expected.numel() else 0.0
    assert err <= tol * scale, f"max abs error {err:.3e} > {tol:.0e} * {scale:.3e}"


def power_tol(S: torch.Tensor) -> float:
    """Tolerance for S^p with p < 1 against the dense oracle: the oracle's own eigenvalues carry an
    absolute error ~ P eps lambda_max, so its small ones are only relatively accurate to ~ eps cond."""
    ev = torch.linalg.eigvalsh((S + S.T) / 2)
    top = float(ev.abs().max()) if ev.numel() else 0.0
    nz = ev[ev > 1e-12 * top * S.shape[0]]
    cond = float(nz.max() / nz.min()) if nz.numel() else 1.0
    return max(TOL, 1e-13 * cond)


def compile_text(text: str, shapes: dict, sizes: dict | None = None) -> symo.CompiledSpec:
    return symo.compile(symo.parse_spec(text, source="<test>"), shapes, sizes=sizes, disk_cache=False)


@dataclass(frozen=True)
class Case:
    """A spec and the same layout described independently for the oracle."""

    id: str
    spec: str
    shapes: tuple  # ((name, shape), ...) in model order, uncovered parameters included
    spaces: tuple  # ((space, (kind, size, per)), ...) for the oracle
    layout: tuple  # ((name, shape, axes), ...) covered parameters, model order, oracle syntax
    sizes: tuple = ()
    n_blocks: int | None = None  # expected number of isotypic blocks, where counted by hand

    @property
    def shape_dict(self) -> dict:
        return {n: tuple(s) for n, s in self.shapes}

    @property
    def names(self) -> list[str]:
        return [n for n, _, _ in self.layout]

    @property
    def covered_shapes(self) -> list:
        return [tuple(s) for _, s, _ in self.layout]

    @property
    def oracle_spaces(self) -> dict:
        return dict(self.spaces)


def mlp_case(kind: str, n: int) -> Case:
    """The permutation MLP: W1 (h x 3), b1 (h), W2 (2 x h) share h; b2 is moved by nothing."""
    spec = MLP_SPEC % kind + '"fc2.bias" = ["_"]\n'
    shapes = (("fc1.weight", (n, 3)), ("fc1.bias", (n,)), ("fc2.weight", (2, n)), ("fc2.bias", (2,)))
    layout = (("fc1.weight", (n, 3), ["h", "_"]), ("fc1.bias", (n,), ["h"]),
              ("fc2.weight", (2, n), ["_", "h"]), ("fc2.bias", (2,), ["_"]))
    blocks = {"perm": 2, "signed_perm": 2, "orthogonal": 2, "identity": 1}[kind]
    if kind == "perm" and n == 1:
        blocks = 1  # S_1 has no standard piece: only the trivial block remains
    return Case(f"mlp-{kind}{n}", spec, shapes, (("h", (kind, n, None)),), layout, n_blocks=blocks)


def h2h_case(ka: str, na: int, kb: str, nb: int) -> Case:
    """Two group spaces on one parameter: w (b x a), plus u (a x 2) so labels meet across params."""
    spec = f"""
[spaces]
a = {{ group = "{ka}" }}
b = {{ group = "{kb}" }}
[params]
"w" = ["b", "a"]
"u" = ["a", "_"]
"""
    shapes = (("w", (nb, na)), ("u", (na, 2)))
    layout = (("w", (nb, na), ["b", "a"]), ("u", (na, 2), ["a", "_"]))
    return Case(f"h2h-{ka}{na}-{kb}{nb}", spec, shapes, (("a", (ka, na, None)), ("b", (kb, nb, None))), layout)


S3xS3 = Case(
    "S3xS3-four-labels",
    """
[spaces]
a = { group = "perm" }
b = { group = "perm" }
[params]
W1 = ["a", "_"]
W2 = ["b", "a"]
b2 = ["b"]
W3 = ["_", "b"]
""",
    (("W1", (3, 2)), ("W2", (3, 3)), ("b2", (3,)), ("W3", (2, 3))),
    (("a", ("perm", 3, None)), ("b", ("perm", 3, None))),
    (("W1", (3, 2), ["a", "_"]), ("W2", (3, 3), ["b", "a"]), ("b2", (3,), ["b"]), ("W3", (2, 3), ["_", "b"])),
    n_blocks=4,
)

_ATTN = [("head", "dqk"), ("head", "dqk"), ("head", "dvo")]
PER_HEAD = Case(
    "per-head-attention",
    """
[spaces]
head = { group = "identity", size = 2 }
dqk = { group = "orthogonal", per = "head", size = 2 }
dvo = { group = "perm", per = "head" }
[params]
"attn.c_attn.weight" = [["(head dqk)", "(head dqk)", "(head dvo)"], "_"]
"attn.c_attn.bias" = [["(head dqk)", "(head dqk)", "(head dvo)"]]
"attn.c_proj.weight" = ["_", "(head dvo)"]
"attn.k3" = ["head", "dqk", "_"]
"attn.qv" = ["head", "dqk", "dvo"]
""",
    (("attn.c_attn.weight", (12, 3)), ("attn.c_attn.bias", (12,)), ("attn.c_proj.weight", (3, 4)),
     ("attn.k3", (2, 2, 2)), ("attn.qv", (2, 2, 2))),
    (("head", ("identity", 2, None)), ("dqk", ("orthogonal", 2, "head")), ("dvo", ("perm", 2, "head"))),
    (("attn.c_attn.weight", (12, 3), [list(_ATTN), "_"]), ("attn.c_attn.bias", (12,), [list(_ATTN)]),
     ("attn.c_proj.weight", (3, 4), ["_", ("head", "dvo")]), ("attn.k3", (2, 2, 2), ["head", "dqk", "_"]),
     ("attn.qv", (2, 2, 2), ["head", "dqk", "dvo"])),
    n_blocks=4,  # nat(dqk), std(dvo), nat(dqk) x std(dvo) (each per head) and trivial
)

FUSED = Case(
    "fused-free-segment-and-product",
    """
[spaces]
h = { group = "perm", size = 3 }
s = { group = "signed_perm", size = 2 }
[params]
"w" = [["h", "_", "s"], "_"]
"v" = ["s", ["_", "h"]]
"x" = ["(h s)"]
"z" = [["h", "_"], ["_", "s"]]
"y" = [["h", "h"]]
""",
    (("w", (6, 2)), ("v", (2, 5)), ("x", (6,)), ("z", (4, 3)), ("y", (6,))),
    (("h", ("perm", 3, None)), ("s", ("signed_perm", 2, None))),
    (("w", (6, 2), [["h", ("_", 1), "s"], "_"]), ("v", (2, 5), ["s", [("_", 2), "h"]]), ("x", (6,), [("h", "s")]),
     ("z", (4, 3), [["h", ("_", 1)], [("_", 1), "s"]]), ("y", (6,), [["h", "h"]])),
)

CAPTURES = Case(
    "captures-families-uncovered",
    """
[spaces]
"h{i}" = { group = "perm" }
"g{i}" = { group = "signed_perm" }
[params]
"layers.{i}.weight" = ["h{i}", "_"]
"layers.{i}.bias" = ["h{i}"]
"layers.{i}.proj" = ["g{i}", "h{i}"]
""",
    (("embed.weight", (4, 2)), ("layers.0.weight", (2, 2)), ("layers.0.bias", (2,)), ("layers.0.proj", (2, 2)),
     ("layers.1.weight", (3, 2)), ("layers.1.bias", (3,)), ("layers.1.proj", (1, 3)),
     ("layers.2.weight", (2, 2)), ("layers.2.bias", (2,)), ("layers.2.proj", (1, 2)), ("head.weight", (2, 3))),
    (("h0", ("perm", 2, None)), ("h1", ("perm", 3, None)), ("h2", ("perm", 2, None)),
     ("g0", ("signed_perm", 2, None)), ("g1", ("signed_perm", 1, None)), ("g2", ("signed_perm", 1, None))),
    tuple((f"layers.{i}.{p}", s, ax) for i, (h, g) in enumerate([(2, 2), (3, 1), (2, 1)])
          for p, s, ax in [("weight", (h, 2), [f"h{i}", "_"]), ("bias", (h,), [f"h{i}"]),
                           ("proj", (g, h), [f"g{i}", f"h{i}"])]),
)

OVERLAPPING = Case(
    "families-whose-instances-overlap",
    # "mlp{i}" also matches "mlp_gate0" (i = "_gate0"): each rule's space must keep the family the rule wrote
    """
[spaces]
"mlp{i}" = { group = "perm" }
"mlp_gate{i}" = { group = "signed_perm" }
[params]
"h.{i}.fc" = ["mlp{i}", "_"]
"h.{i}.gate" = ["mlp_gate{i}", "_"]
""",
    (("h.0.fc", (3, 2)), ("h.0.gate", (3, 2))),
    (("mlp0", ("perm", 3, None)), ("mlp_gate0", ("signed_perm", 3, None))),
    (("h.0.fc", (3, 2), ["mlp0", "_"]), ("h.0.gate", (3, 2), ["mlp_gate0", "_"])),
)

PER_CAPTURES = Case(
    "per-families-over-layers",
    """
[spaces]
"head{i}" = { group = "identity" }
"d{i}" = { group = "orthogonal", per = "head{i}" }
[params]
"blk.{i}.q" = ["(head{i} d{i})", "_"]
"blk.{i}.k" = ["(head{i} d{i})", "_"]
""",
    (("blk.0.q", (4, 2)), ("blk.0.k", (4, 2)), ("blk.1.q", (2, 3)), ("blk.1.k", (2, 3))),
    (("head0", ("identity", 2, None)), ("d0", ("orthogonal", 2, "head0")),
     ("head1", ("identity", 2, None)), ("d1", ("orthogonal", 1, "head1"))),
    (("blk.0.q", (4, 2), [("head0", "d0"), "_"]), ("blk.0.k", (4, 2), [("head0", "d0"), "_"]),
     ("blk.1.q", (2, 3), [("head1", "d1"), "_"]), ("blk.1.k", (2, 3), [("head1", "d1"), "_"])),
    sizes=(("head{i}", 2),),
)

REVERSED = Case(
    "same-label-transposed-axes",
    """
[spaces]
a = { group = "signed_perm" }
b = { group = "orthogonal" }
[params]
W = ["a", "b"]
V = ["b", "a"]
c = ["b"]
""",
    (("W", (2, 3)), ("V", (3, 2)), ("c", (3,))),
    (("a", ("signed_perm", 2, None)), ("b", ("orthogonal", 3, None))),
    (("W", (2, 3), ["a", "b"]), ("V", (3, 2), ["b", "a"]), ("c", (3,), ["b"])),
)

CASES = [
    mlp_case("perm", 4), mlp_case("signed_perm", 3), mlp_case("orthogonal", 3), mlp_case("identity", 3),
    mlp_case("perm", 2), mlp_case("perm", 1), mlp_case("orthogonal", 1),
    h2h_case("perm", 3, "signed_perm", 2), h2h_case("signed_perm", 2, "orthogonal", 3),
    h2h_case("orthogonal", 2, "perm", 3), h2h_case("perm", 3, "perm", 3), h2h_case("identity", 2, "perm", 3),
    S3xS3, PER_HEAD, FUSED, CAPTURES, OVERLAPPING, PER_CAPTURES, REVERSED,
]
CASE_IDS = [c.id for c in CASES]
_STATE: dict[str, tuple] = {}


def setup(case: Case) -> tuple[symo.CompiledSpec, list[torch.Tensor]]:
    """(compiled spec, every dense A_g), built once per case."""
    if case.id not in _STATE:
        compiled = compile_text(case.spec, case.shape_dict, dict(case.sizes) or None)
        actions = O.action_matrices(case.oracle_spaces, list(case.layout))
        _STATE[case.id] = (compiled, actions)
    return _STATE[case.id]


def grads(case: Case, seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random float64 tensors for EVERY parameter of the model (uncovered ones included)."""
    g = gen(seed)
    return {n: scale * torch.randn(*s, dtype=D, generator=g) for n, s in case.shapes}


def flat(case: Case, tensors: dict) -> torch.Tensor:
    return OD.flatten(tensors, case.names)


def unflat(case: Case, vec: torch.Tensor) -> dict[str, torch.Tensor]:
    return OD.unflatten(vec, case.names, case.covered_shapes)


def case_S(case: Case, tensors: dict) -> torch.Tensor:
    """The oracle's S for a case, from the group elements `setup` keeps."""
    return oracle_S(case.oracle_spaces, list(case.layout), flat(case, tensors), setup(case)[1])


def to_oracle_element(compiled: symo.CompiledSpec, element: dict) -> dict:
    """The library's element {space: (copies, n, n)} in the oracle's format."""
    out = {}
    for s, m in element.items():
        out[s] = tuple(m) if compiled.spaces[s]["per"] else m[0]
    return out
