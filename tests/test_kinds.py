"""The preconditioner kinds against references written here from their publications, in float64:

- published: the published Symo step on the dense matrices of a small MLP, with the group's first- and
  second-order orbit averages computed by enumerating every element of the group (no Symo code), over ten
  steps, on a model whose S_w is rank-deficient and which has parameters the group leaves fixed;
- eigen_adam with its older conventions (`LEGACY`: the first step taken, this step's statistic folded before the
  rotation, a fresh eigh, null directions dropped, Adam's eps) on a weight matrix with the row and column specs,
  and its one-sided form with one spec (SOAP itself is tested against the libraries in tests/test_soap.py);
- then_orthogonalize: PMuon (tests/references.py), polar(L^-gamma M R^-gamma) with EMA covariances of the raw
  gradient, with the exact polar factor;
- every kind: a change of the power (or beta2) and of the learning rate in the middle of a run takes effect at
  the next step, as a new optimizer built with the new values and the same state does.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from cases import MLP_SPEC
from helpers import rel
from references import pmuon_reference

import symo
from symo.optim import Symo
from symo.optim.bases import Eigh

F64 = torch.float64


# ------------------------------------------------------------------ published: the dense reference
HIDDEN = MLP_SPEC + '"fc2.bias" = ["_"]\n'  # every parameter in the dense reference: HIDDEN % group


def group_matrices(group: str, n: int, shapes: dict[str, tuple[int, ...]]) -> list[torch.Tensor]:
    """Every element of the hidden space's group as a matrix on the flattened parameters (fc1.weight rows,
    fc1.bias, fc2.weight columns move with the hidden unit; fc2.bias stays)."""
    signs = [(1,) * n] if group == "perm" else list(itertools.product((1, -1), repeat=n))
    mats = []
    for perm in itertools.permutations(range(n)):
        for sign in signs:
            p = torch.zeros(n, n, dtype=F64)
            for i, j in enumerate(perm):
                p[i, j] = sign[i]
            blocks = [torch.kron(p, torch.eye(shapes["fc1.weight"][1], dtype=F64)), p,
                      torch.kron(torch.eye(shapes["fc2.weight"][0], dtype=F64), p),
                      torch.eye(shapes["fc2.bias"][0], dtype=F64)]
            mats.append(torch.block_diag(*blocks))
    return mats


def damped_power(x: torch.Tensor, p: float, d: float) -> torch.Tensor:
    """The method's P(X, p): U diag((d s_max + s)^p) U^T with s = |eigenvalues|, 0 where that is 0."""
    evals, evecs = torch.linalg.eigh(x)
    s = evals.abs()
    s = s + d * s.max()
    f = torch.where(s > 0, s.pow(p), torch.zeros_like(s)) if p < 0 else s.pow(p)
    return (evecs * f) @ evecs.T


class PublishedReference:
    """The published step on dense matrices: R1 and R2 by averaging over the enumerated group."""

    def __init__(self, mats: list[torch.Tensor], lr: float, beta1: float = 0.9, beta2: float = 0.99,
                 damping: float = 1e-4):
        self.mats, self.lr, self.b1, self.b2, self.d = mats, lr, beta1, beta2, damping
        self.m = self.sg = None
        self.t = 0

    def r1(self, v):
        return sum(a @ v for a in self.mats) / len(self.mats)

    def r2(self, v):
        return sum(torch.outer(a @ v, a @ v) for a in self.mats) / len(self.mats)

    def step(self, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        self.t += 1
        self.m = (1 - self.b1) * g if self.m is None else self.b1 * self.m + (1 - self.b1) * g
        m_hat = self.m / (1 - max(self.b1 ** self.t, 1e-4))
        stat = self.r2(m_hat - self.r1(m_hat))
        self.sg = (1 - self.b2) * stat if self.sg is None else self.b2 * self.sg + (1 - self.b2) * stat
        sg_hat = self.sg / (1 - max(self.b2 ** self.t, 1e-4))
        sw = self.r2(w - self.r1(w))
        half = damped_power(sw, 0.5, self.d)
        h_inv = half @ damped_power(half @ sg_hat @ half, -0.5, self.d) @ half
        return w - self.lr * h_inv @ self.m


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("group", ["signed_perm", "perm"])
def test_published_equals_the_dense_published_step_over_ten_steps(group):
    """Hidden space of 3 units, 2 inputs, 2 outputs: S_w = R2(w - R1 w) has rank <= 3 in a 5-dimensional block
    (rank-deficient), and fc2.bias (and, for perm, the units' means) is left fixed by the group (delta = 0)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.fc1, model.act, model.fc2 = torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)
    model = model.double()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 2, generator=gen, dtype=F64), torch.randn(16, 2, generator=gen, dtype=F64)
    opt = Symo(model.named_parameters(), symo.parse_spec(HIDDEN % group), preset="published", lr=0.05)
    assert opt.config.kind == "published" and set(opt.assignment.values()) == {"symo"}
    ref = PublishedReference(group_matrices(group, 3, shapes), lr=0.05)
    w_ref = flat(model)
    for t in range(10):
        with torch.no_grad():  # the reference's gradient at its own weights
            offset = 0
            for p in model.parameters():
                p.copy_(w_ref[offset:offset + p.numel()].reshape(p.shape))
                offset += p.numel()
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        w_ref = ref.step(w_ref, g)
        opt.step()
        assert rel(flat(model), w_ref) < 1e-8, t
    assert rel(w_ref, flat(model)) < 1e-8 and float((w_ref - ref.r1(w_ref)).norm()) > 0


def test_published_damping_scope_block_damps_each_layer_on_its_own_scale():
    """damping_scope="all" damps every block by the largest eigenvalue of the whole matrix, so scaling one
    layer's weights by 1e3 changes the other layer's step; "block" damps each block on its own scale, so the
    other layer's first step does not change."""
    spec = symo.parse_spec('[spaces]\n"r{i}" = "signed_perm"\n[params]\n"{i}.weight" = ["r{i}", "_"]\n')

    def first_step(scope: str, scale: float) -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Tanh(),
                                    torch.nn.Linear(6, 3, bias=False)).double()
        with torch.no_grad():
            model[2].weight.mul_(scale)
        opt = Symo(model.named_parameters(), spec, preset="published", damping_scope=scope, lr=1.0)
        before = model[0].weight.detach().clone()
        model(torch.randn(8, 4, dtype=F64, generator=torch.Generator().manual_seed(3))).square().sum().backward()
        model[2].weight.grad.div_(scale)   # the same gradient statistics apart from the weights' scale
        opt.step()
        return before - model[0].weight.detach()

    assert rel(first_step("block", 1e3), first_step("block", 1.0)) < 1e-10
    assert rel(first_step("all", 1e3), first_step("all", 1.0)) > 1e-2


# ------------------------------------------------------------------ eigen_adam: its older conventions
LEGACY = {"first_step": "update", "statistic_timing": "before", "refresh": Eigh(), "null_directions": "drop",
          "eps_placement": "adam", "max_precond_dim": 2048}


def train_matrix(opt: Symo, w: torch.nn.Parameter, target: torch.Tensor, steps: int = 10
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Ten steps on a fixed non-quadratic loss of one weight matrix: its gradients and its updates."""
    grads, updates = [], []
    for _ in range(steps):
        opt.zero_grad()
        (((w - target) ** 3).sum() + (w @ w.T).square().sum()).backward()
        grads.append(w.grad.clone())
        before = w.detach().clone()
        opt.step()
        updates.append(before - w.detach())
    return grads, updates


def legacy_reference(grads: list[torch.Tensor], lr: float, two_sided: bool, beta1=0.95, shampoo_beta=0.95,
                     adam_beta2=0.95, eps=1e-8, frequency=3) -> list[torch.Tensor]:
    """eigen_adam's older conventions, written out (they are not SOAP's: tests/test_soap.py runs SOAP itself):
    the momentum in the original space, L and R EMAs of G G^T and G^T G including this step's, their eigenbases
    by a fresh eigh every `frequency` steps from the first step on, Adam's second moment of Q_L^T G Q_R,
    N = Q_L (M' / (sqrt(V) + eps)) Q_R^T with Adam's bias corrections. Returns the updates (lr included)."""
    m, n = grads[0].shape
    mom = torch.zeros(m, n, dtype=F64)
    left, right = torch.zeros(m, m, dtype=F64), torch.zeros(n, n, dtype=F64)
    v = torch.zeros(m, n, dtype=F64)
    ql, qr = torch.eye(m, dtype=F64), torch.eye(n, dtype=F64)
    out = []
    for t, g in enumerate(grads, start=1):
        mom = beta1 * mom + (1 - beta1) * g
        left = shampoo_beta * left + (1 - shampoo_beta) * g @ g.T
        right = shampoo_beta * right + (1 - shampoo_beta) * g.T @ g
        if (t - 1) % frequency == 0:
            qr = torch.linalg.eigh(right)[1]
            if two_sided:
                ql = torch.linalg.eigh(left)[1]
        g_rot, m_rot = ql.T @ g @ qr, ql.T @ mom @ qr
        v = adam_beta2 * v + (1 - adam_beta2) * g_rot ** 2
        n_rot = (m_rot / (1 - beta1 ** t)) / ((v / (1 - adam_beta2 ** t)).sqrt() + eps)
        out.append(lr * ql @ n_rot @ qr.T)
    return out


@pytest.mark.parametrize("two_sided", [True, False])
def test_eigen_adam_legacy_conventions_on_a_weight_matrix(two_sided):
    """A 4 x 4 weight (one-sided: 6 x 4), so that every statistic has full rank from the first step on. On the
    first step the rotated gradient Q_L^T G Q_R is G's own singular values (the bases are G's singular
    vectors), and its off-diagonal entries are rounding noise (~1e-13) that Adam divides by eps: two correct
    implementations agree there only to ~1e-13 / eps, so eps is 1e-4 here."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4 if two_sided else 6, 4, dtype=F64))
    target = torch.randn(*w.shape, dtype=F64)
    rows = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n')
    cols = symo.parse_spec('[spaces]\nc = "signed_perm"\n[params]\nw = ["_", "c"]\n')
    extra = {"geometric_mean_with": cols} if two_sided else {}
    opt = Symo({"w": w}, rows, preset="eigen_adam", lr=0.1, precondition_frequency=3, eps=1e-4, stats_dtype="float64",
               **extra, **LEGACY)
    grads, updates = train_matrix(opt, w, target)
    for t, (got, want) in enumerate(zip(updates, legacy_reference(grads, 0.1, two_sided, eps=1e-4))):
        assert rel(got, want) < 1e-6, t


def test_eigen_adam_drop_moves_nothing_where_the_statistic_is_zero():
    """A 6 x 4 gradient: G G^T has rank 4 of 6, and its two null directions hold only rounding noise, which
    null_directions="drop" leaves out (Adam would divide it by eps): the first update lies in G's column space."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    rows = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n')
    cols = symo.parse_spec('[spaces]\nc = "signed_perm"\n[params]\nw = ["_", "c"]\n')
    opt = Symo({"w": w}, rows, preset="eigen_adam", lr=1.0, geometric_mean_with=cols, stats_dtype="float64", **LEGACY)
    w.grad = 1e3 * torch.randn(6, 4, dtype=F64)
    before = w.detach().clone()
    opt.step()
    update = before - w.detach()
    u, _, _ = torch.linalg.svd(w.grad)
    null = u[:, 4:]
    assert float((null.T @ update).norm()) < 1e-12 * float(update.norm())


# ------------------------------------------------------------------ then_orthogonalize: PMuon
@pytest.mark.parametrize("two_sided", [True, False])
def test_then_orthogonalize_is_pmuon_with_an_exact_polar_factor(two_sided):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    target = torch.randn(6, 4, dtype=F64)
    rows = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n')
    cols = symo.parse_spec('[spaces]\nc = "signed_perm"\n[params]\nw = ["_", "c"]\n')
    # the inner root's power is the whole curvature's: -0.3 on each side is -0.6 over the two stages
    extra = {"geometric_mean_with": cols, "power": -0.6} if two_sided else {}
    opt = Symo({"w": w}, rows, preset="then_orthogonalize", lr=0.1, precondition_frequency=2, backend="eigh",
               stats_dtype="float64", **extra)
    grads, updates = train_matrix(opt, w, target)
    for t, (got, want) in enumerate(zip(updates, pmuon_reference(grads, 0.1, two_sided))):
        assert rel(got, want) < 1e-8, t


# ------------------------------------------------------------------ options changed in the middle of a run
KIND_CASES = [  # (preset or options, the option changed and its new value)
    ({"preconditioner": "polar"}, "power", -0.25),
    ({"preconditioner": "root", "beta2": 0.9, "precondition_frequency": 3}, "power", -0.25),
    ({"preconditioner": "root", "beta2": 0.9}, "beta2", 0.5),
    ({"preconditioner": "taylor", "beta2": 0.9, "precondition_frequency": 2}, "power", -0.25),
    ({"preset": "published"}, "beta2", 0.9),
    ({"preset": "published"}, "damping", 1e-2),
    ({"preset": "eigen_adam"}, "adam_beta2", 0.5),
    ({"preset": "then_orthogonalize", "precondition_frequency": 3}, "power", -0.6),
    ({"preset": "then_orthogonalize", "inner": "eigen_adam", "two_sided": True}, "adam_beta2", 0.5),
]


@pytest.mark.parametrize("options,name,value", KIND_CASES, ids=[f"{c[0].get('preset', c[0].get('preconditioner'))}"
                                                                 f"-{c[1]}" for c in KIND_CASES])
def test_an_option_changed_mid_run_takes_effect_at_the_next_step(options, name, value):
    """After 4 steps, `opt.config.<option> = value` and a new lr in the param groups: the next step equals that
    of a new optimizer built with the new values and loaded with the same state, and differs from a step
    with the old values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    spec = symo.parse_spec((HIDDEN % "perm").replace("fc1", "0").replace("fc2", "2"))
    x, y = torch.randn(16, 5, dtype=F64), torch.randn(16, 3, dtype=F64)

    def step(m, o):
        o.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        o.step()

    opt = Symo(model.named_parameters(), spec, lr=0.02, **options)
    for _ in range(4):
        step(model, opt)
    changed_model = copy.deepcopy(model)
    changed = Symo(changed_model.named_parameters(), spec, lr=0.02, **options)
    changed.load_state_dict(opt.state_dict())
    setattr(changed.config, name, value)
    for g in changed.param_groups:
        g["lr"] *= 0.5
    fresh_model = copy.deepcopy(model)
    fresh = Symo(fresh_model.named_parameters(), spec, lr=0.01, **{**options, name: value})
    fresh.load_state_dict(opt.state_dict())
    for g, lr in zip(fresh.param_groups, (g["lr"] * 0.5 for g in opt.param_groups)):
        g["lr"] = lr
    step(changed_model, changed)
    step(fresh_model, fresh)
    step(model, opt)
    assert rel(flat(changed_model), flat(fresh_model)) < 1e-12
    assert rel(flat(changed_model), flat(model)) > 1e-6


def test_options_of_another_kind_are_refused_with_the_kinds_that_have_them():
    model = torch.nn.Linear(4, 3)
    spec = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nweight = ["r", "_"]\n')
    with pytest.raises(TypeError, match="two_sided is not an option of preconditioner 'root'.*eigen_adam"):
        Symo(model.named_parameters(), spec, preconditioner="root", two_sided=True)
    with pytest.raises(TypeError, match="power is not an option of preconditioner 'then_orthogonalize' with inner "
                                        "'eigen_adam'; its options are .*'two_sided'"):
        Symo(model.named_parameters(), spec, preconditioner="then_orthogonalize", inner="eigen_adam", power=-0.3)
    with pytest.raises(ValueError, match="update_scale='muon' has no meaning for preconditioner 'eigen_adam'"):
        Symo(model.named_parameters(), spec, preset="eigen_adam", update_scale="muon")
    # the published step has one stage: a second spec is refused with the option, before any stage is built
    with pytest.raises(TypeError, match="geometric_mean_with is not an option of preconditioner 'published'.*"
                                        "root, eigen_adam, then_orthogonalize"):
        Symo(model.named_parameters(), spec, preset="published", geometric_mean_with=spec)


# ------------------------------------------------------------------ the size cap
def test_above_max_precond_dim_eigen_adam_is_adam_and_root_is_diagonal():
    """A block whose multiplicity exceeds max_precond_dim keeps only the diagonal of its statistic: eigen_adam
    there is torch's Adam (the identity basis; with the first step taken and Adam's eps), root applies
    (diag A + damping lambda_max)^power elementwise."""
    torch.manual_seed(0)
    rows = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n')
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    twin = torch.nn.Parameter(w.detach().clone())
    opt = Symo({"w": w}, rows, preset="eigen_adam", lr=0.01, stats_dtype="float64", **{**LEGACY, "max_precond_dim": 3})
    adam = torch.optim.Adam([twin], lr=0.01, betas=(0.95, 0.95), eps=1e-8)
    for _ in range(5):
        for p, o in ((w, opt), (twin, adam)):
            o.zero_grad()
            (p ** 3).sum().backward()
            o.step()
    assert rel(w.detach(), twin.detach()) < 1e-12
    assert set(opt.block_statistics()["L0"]) == {"step", "exp_avg_sq", "adam_step"}

    v = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    start = v.detach().clone()
    opt = Symo({"w": v}, rows, preconditioner="root", beta2=0.0, damping=1e-3, lr=1.0, beta1=0.0,
               max_precond_dim=3)
    v.grad = torch.randn(6, 4, dtype=F64)
    opt.step()
    y = v.grad.T                                    # block coordinates: mult 4 (> 3) x width 6
    diag = (y * y).sum(dim=1, keepdim=True) / 6
    want = (diag + 1e-3 * diag.max()) ** -0.5 * y
    assert rel((start - v.detach()).T, want) < 1e-12
    assert opt.block_statistics()["L0"]["precond"].shape == (1, 4, 1)
