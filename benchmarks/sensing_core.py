"""Shared pieces of the matrix-sensing experiments (Singh 2026, protocol §1-3): problem, rules, training.

Imported by benchmarks/matrix_sensing.py and by the tests; every function is deterministic in its seed.
"""

from __future__ import annotations

import math

import torch

import symo
from symo.experiments import zoo

N, RANK, K = 40, 3, 40
DOF = RANK * (2 * N - RANK)
M = int(2 * DOF)  # 462
MAX_STEPS = 20_000
STOP_EVERY, STOP_LOSS, DIVERGED = 200, 1e-7, 1e8

# rules of the zoo beyond symo.experiments.zoo.RULES: Symo (O(k) gauge, defaults) and a variant
SYMO_RULES = {
    "symo": {},                                           # Gram polar rule, momentum 0.95 Nesterov
    # an Adam-like EMA of the Gram statistic
    "symo_ema": {"preconditioner": "root", "beta2": 0.999, "statistic": "gradient"},
    # the notebook preset (averaged S_g^{-1/2} g, no momentum, float64 statistics). The O(k) gauge on U (m x k)
    # and V (n x k) makes one block of multiplicity m + n, so its inverse root is an (m+n)-square eigh every
    # step. It is not refreshed less often: an undamped root that misses the newest gradient amplifies that
    # gradient's part in the statistic's weakest directions (every hyperspectral run diverged by step 13 so).
    "symo_notebook": {"preset": "notebook"},
}


def make_problem(seed: int, tau: float | None = None, n: int = N, rank: int = RANK, m: int = M,
                 dtype: torch.dtype = torch.float32):
    """(X target, A, y) in the protocol's generator order; tau given = the spectral-tail target (§3)."""
    g = torch.Generator().manual_seed(seed)
    us = torch.randn(n, rank, generator=g) / math.sqrt(rank)
    vs = torch.randn(n, rank, generator=g) / math.sqrt(rank)
    x = us @ vs.T
    if tau is not None:
        e = torch.randn(n, n, generator=g)
        qu, qv = torch.linalg.qr(us).Q, torch.linalg.qr(vs).Q
        e = e - qu @ (qu.T @ e)
        e = e - (e @ qv) @ qv.T
        e = e * (x.norm() / e.norm())
        x = math.sqrt(1 - tau ** 2) * x + tau * e
    a = torch.randn(m, n * n, generator=g)
    y = a @ x.reshape(-1)
    return x.to(dtype), a.to(dtype), y.to(dtype)


def make_init(seed: int, n: int = N, k: int = K, scale: float = 1e-3, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed + 7)
    u = torch.randn(n, k, generator=g) * scale
    v = torch.randn(n, k, generator=g) * scale
    return u.to(dtype), v.to(dtype)


def effective_rank(w: torch.Tensor) -> float:
    s = torch.linalg.svdvals(w.double())
    p = s / (s.sum() + 1e-12)
    return float(torch.exp(-(p * torch.log(p + 1e-12)).sum()))


def build(rule: str, params: list, lr: float, p: float | None = None) -> torch.optim.Optimizer:
    """A zoo rule, "adam_p" (the dial, power p), "symo"/"symo_ema", or "symo_p" (Symo with power p)."""
    if rule == "adam_p":
        return zoo.AdamP(params, lr, p=p)
    if rule in SYMO_RULES:
        return symo.Symo(params, "factored", lr=lr, **SYMO_RULES[rule])
    if rule == "symo_p":
        return symo.Symo(params, "factored", lr=lr, power=min(p, -1e-12))
    return zoo.make(rule, params, lr)


def schedule_of(rule: str, tail: bool = False) -> str:
    if tail:
        return "cos" if rule == "muon" else "const"   # §3: only Muon decayed
    return zoo.RULES[rule][2] if rule in zoo.RULES else "const"


def train(rule: str, lr: float, seed: int, *, tau: float | None = None, max_steps: int = MAX_STEPS,
          schedule: str = "const", p: float | None = None, p_schedule=None, problem=None) -> dict:
    """Train U, V from the protocol's init to interpolation; return the protocol's metrics.

    `p_schedule(t, max_steps) -> p` changes Symo's power during training (rule "symo_p")."""
    x, a, y = problem if problem is not None else make_problem(seed, tau)
    u0, v0 = make_init(seed)
    u, v = u0.clone().requires_grad_(True), v0.clone().requires_grad_(True)
    opt = build(rule, [("U", u), ("V", v)], lr, p=p_schedule(1, max_steps) if p_schedule else p)
    n_meas = a.shape[0]
    loss_val, steps, diverged = float("inf"), max_steps, False
    with torch.no_grad():
        for t in range(max_steps):
            w = u @ v.T
            r = a @ w.reshape(-1) - y
            loss_val = float(r.square().mean()) if t % STOP_EVERY == 0 else None
            if loss_val is not None:
                if not math.isfinite(loss_val) or loss_val > DIVERGED:
                    diverged, steps = True, t
                    break
                if loss_val < STOP_LOSS:
                    steps = t
                    break
            gw = (a.T @ r).reshape(w.shape) * (2.0 / n_meas)
            u.grad, v.grad = gw @ v, gw.T @ u
            if schedule == "cos":
                for group in opt.param_groups:
                    group["lr"] = zoo.cosine_lr(lr, t + 1, MAX_STEPS)
            if p_schedule is not None:
                opt.config.power = min(p_schedule(t + 1, max_steps), -1e-12)
            opt.step()
        w = u @ v.T
        final = float((a @ w.reshape(-1) - y).square().mean())
    if not math.isfinite(final) or final > DIVERGED:
        diverged = True
    rec = float((w - x).norm() / x.norm()) if not diverged else float("inf")
    return {"rule": rule, "lr": lr, "seed": seed, "tau": tau, "p": p, "recovery": rec,
            "erank": effective_rank(w) if not diverged else float("nan"),
            "balancedness": float((u.T @ u - v.T @ v).detach().norm()) if not diverged else float("nan"),
            "steps": steps, "final_loss": final if not diverged else float("inf"), "diverged": diverged}


def select_lr(runs: list[dict]) -> tuple[float, list[dict]]:
    """The protocol's rule: score = mean recovery if the worst seed's final loss < 1e-7, else mean
    recovery + 10 + mean loss (selection against the ground truth). -> (lr, that lr's runs)."""
    by_lr: dict[float, list[dict]] = {}
    for r in runs:
        by_lr.setdefault(r["lr"], []).append(r)

    def score(rs):
        rec = sum(r["recovery"] for r in rs) / len(rs)
        if max(r["final_loss"] for r in rs) < STOP_LOSS:
            return rec
        return rec + 10 + sum(r["final_loss"] for r in rs) / len(rs)

    best = min(by_lr, key=lambda lr: (score(by_lr[lr]), lr))
    return best, by_lr[best]


def nuclear_norm_interpolant(a: torch.Tensor, y: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """argmin ||X||_* subject to A vec(X) = y (vec row-major), by cvxpy (SCS/Clarabel), in float64."""
    import cvxpy as cp
    import numpy as np

    x = cp.Variable(shape)
    a_np, y_np = a.double().numpy(), y.double().numpy()
    constraints = [a_np @ cp.vec(x, order="C") == y_np]
    problem = cp.Problem(cp.Minimize(cp.normNuc(x)), constraints)
    solver = "CLARABEL" if "CLARABEL" in cp.installed_solvers() else "SCS"
    problem.solve(solver=solver)
    if x.value is None:
        raise RuntimeError(f"cvxpy ({solver}) did not solve the nuclear-norm problem: {problem.status}")
    return torch.from_numpy(np.asarray(x.value))


# ------------------------------------------------------------------ batched training (dial and tail)
BATCHED_RULES = ("gd", "adam", "scalar_adam", "adam_p", "muon", "shampoo", "symo_p")
SYMO_BETA1, SYMO_DAMPING = 0.95, 1e-6  # symo.SymoConfig defaults: Muon-form Nesterov momentum, relative damping


def _batched_direction(rule: str, st: dict, gs: list[torch.Tensor], t: int, p: float | None) -> list[torch.Tensor]:
    """One step's directions for factors stacked over a leading batch axis (each member its own run).

    The same formulas as symo.experiments.zoo / symo.Symo (the tests compare them step for step)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    if rule == "gd":
        return gs
    if rule in ("adam", "scalar_adam", "adam_p"):
        ms = st.setdefault("m", [torch.zeros_like(g) for g in gs])
        vs = st.setdefault("v", [torch.zeros_like(g) for g in gs])
        for g, m, v in zip(gs, ms, vs):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m_hats = [m / (1 - b1 ** t) for m in ms]
        v_hats = [v / (1 - b2 ** t) for v in vs]
        if rule == "adam":
            return [mh / (vh.sqrt() + eps) for mh, vh in zip(m_hats, v_hats)]
        s_bar = torch.sqrt(sum(vh.sum(dim=(-2, -1), keepdim=True) for vh in v_hats)
                           / sum(vh[0].numel() for vh in v_hats))
        if rule == "scalar_adam":
            return [mh / (s_bar + eps) for mh in m_hats]
        return [mh / ((vh.sqrt() + eps).pow(p) * (s_bar + eps) ** (1 - p) + eps) for mh, vh in zip(m_hats, v_hats)]
    if rule == "muon":
        ms = st.setdefault("m", [torch.zeros_like(g) for g in gs])
        for g, m in zip(gs, ms):
            m.mul_(0.9).add_(g)
        return [zoo.ns5(m) for m in ms]
    if rule == "shampoo":
        if "L" not in st:
            st["L"] = [torch.zeros(*g.shape[:-1], g.shape[-2], dtype=g.dtype) for g in gs]
            st["R"] = [torch.zeros(*g.shape[:-2], g.shape[-1], g.shape[-1], dtype=g.dtype) for g in gs]
        out = []
        for i, g in enumerate(gs):
            st["L"][i].add_(g @ g.transpose(-1, -2))
            st["R"][i].add_(g.transpose(-1, -2) @ g)
            if (t - 1) % 20 == 0:
                st.setdefault("Li", [None] * len(gs))[i] = zoo._inv_root4(st["L"][i], 1.0)
                st.setdefault("Ri", [None] * len(gs))[i] = zoo._inv_root4(st["R"][i], 1.0)
            out.append(st["Li"][i] @ g @ st["Ri"][i])
        return out
    if rule == "symo_p":  # Symo on specs/factored.toml: u = Nesterov(lerp momentum); (Y Y^T / k)^p Y
        from symo.runtime.linalg import gram_power_apply

        ms = st.setdefault("m", [torch.zeros_like(g) for g in gs])
        us = []
        for g, m in zip(gs, ms):
            m.lerp_(g, 1 - SYMO_BETA1)
            us.append(g.lerp(m, SYMO_BETA1))
        y = torch.cat(us, dim=-2)
        if p == 0.0:
            z = y
        else:
            z = gram_power_apply(y, p, y.shape[-1], SYMO_DAMPING)
        return list(z.split([u.shape[-2] for u in us], dim=-2))
    raise ValueError(f"no batched form of rule {rule!r}; choose from {BATCHED_RULES}")


def train_batched(rule: str, lrs: list[float], seeds: list[int], *, tau: float | None = None,
                  max_steps: int = MAX_STEPS, schedule: str = "const", p: float | None = None,
                  p_schedule: tuple[float, float, int] | None = None, label: str | None = None) -> list[dict]:
    """`train` for every (lr, seed) at once, stacked on a batch axis; the same stop rule per member.

    `p_schedule` = (p_start, p_end, horizon): Symo's power moves linearly from p_start to p_end over
    the first `horizon` steps. A member whose loss leaves the finite range (or exceeds 1e8) at any step
    is frozen as diverged (the protocol checks every 200 steps; freezing keeps NaN out of batched eigh)."""
    members = [(lr, s) for lr in lrs for s in seeds]
    problems = {s: make_problem(s, tau) for s in seeds}
    x = torch.stack([problems[s][0] for _, s in members])
    # members sharing a seed share A: one GEMM per seed (a batched GEMV is ~10x slower on CPU)
    groups = [(problems[s][1], problems[s][2], torch.tensor([i for i, (_, s2) in enumerate(members) if s2 == s]))
              for s in seeds]
    inits = {s: make_init(s) for s in seeds}
    u = torch.stack([inits[s][0] for _, s in members])
    v = torch.stack([inits[s][1] for _, s in members])
    lr0 = torch.tensor([lr for lr, _ in members]).view(-1, 1, 1)
    bsz, n_meas = len(members), groups[0][0].shape[0]
    active = torch.ones(bsz, dtype=torch.bool)
    result: list[dict | None] = [None] * bsz
    st: dict = {}

    def record(i: int, steps: int, diverged: bool, loss: float) -> None:
        lr, s = members[i]
        w = u[i] @ v[i].T
        result[i] = {"rule": label or rule, "lr": lr, "seed": s, "tau": tau, "p": p, "steps": steps,
                     "diverged": diverged, "final_loss": float("inf") if diverged else loss,
                     "recovery": float("inf") if diverged else float((w - x[i]).norm() / x[i].norm()),
                     "erank": float("nan") if diverged else effective_rank(w),
                     "balancedness": float("nan") if diverged else float((u[i].T @ u[i] - v[i].T @ v[i]).norm())}

    for t in range(max_steps + 1):
        w = u @ v.transpose(-1, -2)
        wf = w.reshape(bsz, -1)
        r = torch.empty(bsz, n_meas, dtype=w.dtype)
        for a_s, y_s, idx in groups:
            r[idx] = wf[idx] @ a_s.T - y_s
        loss = r.square().mean(dim=-1)
        bad = active & (~torch.isfinite(loss) | (loss > DIVERGED))
        for i in bad.nonzero().flatten().tolist():
            record(i, t, True, float("inf"))
        if bad.any():
            active &= ~bad
            u[bad], v[bad], r[bad] = 0.0, 0.0, 0.0
            for val in st.values():  # keep optimizer state of frozen members finite too
                for tensor in val if isinstance(val, list) else []:
                    if tensor is not None:
                        tensor[bad] = 0.0
        if t % STOP_EVERY == 0 or t == max_steps:
            done = active & (loss < STOP_LOSS) if t < max_steps else active.clone()
            for i in done.nonzero().flatten().tolist():
                record(i, t, False, float(loss[i]))
            active &= ~done
        if not active.any():
            break
        gw = torch.empty_like(wf)
        for a_s, _, idx in groups:
            gw[idx] = r[idx] @ a_s
        gw = gw.reshape(w.shape) * (2.0 / n_meas)
        gw[~active] = 0.0
        gs = [gw @ v, gw.transpose(-1, -2) @ u]
        pt = p
        if p_schedule is not None:
            p0, p1, horizon = p_schedule
            pt = p0 + (p1 - p0) * min((t + 1) / horizon, 1.0)
        dirs = _batched_direction(rule, st, gs, t + 1, pt)
        scale = lr0 * ((1 + math.cos(math.pi * (t + 1) / MAX_STEPS)) / 2 if schedule == "cos" else 1.0)
        scale = scale * active.view(-1, 1, 1)
        u -= scale * dirs[0]
        v -= scale * dirs[1]
    return result  # type: ignore[return-value]
