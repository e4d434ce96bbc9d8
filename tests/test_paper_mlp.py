"""benchmarks/paper_mlp.py: a tiny end-to-end run (JSON keys, finite losses) and its two hand-written
baselines (benchmarks/paper_mlp_baselines.py) against dense float64 formulas."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import paper_mlp as pm
from benchmarks.paper_mlp_baselines import KFAC, Shampoo

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = {"sizes": (6, 5, 4), "n_train": 40, "n_test": 30}


def test_tiny_run_writes_json_md_and_png(tmp_path):
    results = pm.benchmark(("tanh", "linear"), seeds=2, steps=3,
                           grids={"symo_defaults": (1e-3, 3e-3, 1e-2), "symo_published": (0.03, 0.1, 0.3)},
                           checkpoints=(1, 3), **TINY)
    fit = {act: [pm.linear_fit_test_loss(act, s, **TINY) for s in range(2)] for act in results}
    pm.write(results, fit, {"command": "test", "wall_s": 0.0, "steps": 3, "seeds": 2}, tmp_path)
    saved = json.loads((tmp_path / "paper_mlp.json").read_text())
    assert set(saved) == {"tanh", "linear", "machine"} and saved.pop("machine")["cpus"] >= 1
    for act, res in saved.items():
        assert set(pm.OPTIMIZERS) <= set(res)
        assert res["symo"]["lr"] == pm.SETTINGS[act]["symo"]
        for kind, entry in res.items():
            assert set(entry["test_loss_mean"]) == set(entry["test_loss_std"]) == {"1", "3"}, (act, kind)
            assert len(entry["curve_mean"]) == 4 and all(map(math.isfinite, entry["curve_mean"])), (act, kind)
            assert entry["curve_mean"][-1] < entry["curve_mean"][0], (act, kind)  # every optimizer descends
    text = (tmp_path / "paper_mlp.md").read_text()
    assert "## tanh" in text and "## linear" in text and "`symo_defaults`" in text and "`symo_published`" in text
    assert (tmp_path / "paper_mlp.png").stat().st_size > 0


def test_problem_is_the_teacher_student_setup():
    net, x, y, xt, yt = pm.problem("linear", 0, (6, 5, 4), 50, 20)
    assert x.dtype == torch.float32 and x.shape == (50, 6) and xt.shape == (20, 6) and y.shape == (50, 4)
    assert net.fc1.bias is None and net.fc2.bias is None
    # a linear teacher: the targets are an exact linear map of the inputs, which the student is not
    w = torch.linalg.lstsq(x.double(), y.double()).solution
    assert torch.allclose(xt.double() @ w, yt.double(), atol=1e-5)
    assert pm.mse(net(xt), yt) > 1e-3


def test_shampoo_step_is_the_two_sided_inverse_fourth_root():
    torch.manual_seed(0)
    net = pm.Net((5, 4, 3), "tanh").double()
    opt = Shampoo(net, lr=0.5, eps=1e-3)
    w0 = [net.fc1.weight.detach().clone(), net.fc2.weight.detach().clone()]
    grads = [torch.randn_like(w) for w in w0]
    for _ in range(2):  # two steps with the same gradient: sums 2 G G^T + eps I
        for layer, g in zip((net.fc1, net.fc2), grads):
            layer.weight.grad = g.clone()
        opt.step()
    for layer, w, g in zip((net.fc1, net.fc2), w0, grads):
        def root(m):
            e, v = torch.linalg.eigh(m)
            return v @ torch.diag(e ** -0.25) @ v.T
        eye_l, eye_r = torch.eye(g.shape[0], dtype=g.dtype), torch.eye(g.shape[1], dtype=g.dtype)
        first = root(g @ g.T + 1e-3 * eye_l) @ g @ root(g.T @ g + 1e-3 * eye_r)
        second = root(2 * g @ g.T + 1e-3 * eye_l) @ g @ root(2 * g.T @ g + 1e-3 * eye_r)
        torch.testing.assert_close(layer.weight.detach(), w - 0.5 * (first + second), rtol=1e-9, atol=1e-9)


def test_kfac_step_is_the_kronecker_inverse():
    """One step: vec(update) = (A + dI)^{-1} (x) (G + dI)^{-1} vec(grad), factors built here from the
    layer inputs and the mean loss's pre-activation gradients (by autograd on a separate copy)."""
    torch.manual_seed(1)
    net = pm.Net((5, 4, 3), "tanh").double()
    x, y = torch.randn(20, 5, dtype=torch.float64), torch.randn(20, 3, dtype=torch.float64)
    w1, w2 = (net.fc1.weight.detach().clone().requires_grad_(), net.fc2.weight.detach().clone().requires_grad_())
    z1 = x @ w1.T
    h = torch.tanh(z1)
    z2 = h @ w2.T
    loss = pm.mse(z2, y)
    g1, g2, dz1, dz2 = torch.autograd.grad(loss, [w1, w2, z1, z2])
    d, lr = 0.05, 0.1
    expected = []
    for w, grad, a, dz in ((w1, g1, x, dz1), (w2, g2, h, dz2)):
        fa = a.T @ a / 20 + d * torch.eye(a.shape[1], dtype=a.dtype)
        fg = dz.T @ dz / 20 + d * torch.eye(dz.shape[1], dtype=a.dtype)
        # row-major vec(G^-1 grad A^-1) = (G^-1 (x) A^-T) vec(grad)
        kron = torch.kron(torch.linalg.inv(fg).contiguous(), torch.linalg.inv(fa).T.contiguous())
        expected.append(w.detach() - lr * (kron @ grad.reshape(-1)).reshape(grad.shape))
    opt = KFAC(net, lr=lr, damping=d)
    net.cache = []
    opt.backward(pm.mse(net(x), y))
    opt.step()
    torch.testing.assert_close(net.fc1.weight.detach(), expected[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(net.fc2.weight.detach(), expected[1], rtol=1e-10, atol=1e-12)
