"""symo.experiments.zoo: each rule's first step on a 2 x 2 example, computed by hand from the published
rule (the published protocol of Singh 2026, §1), and the dial's end points. float64."""

import math

import pytest
import torch

from symo.experiments import zoo

G = [[1.0, -2.0], [3.0, 0.5]]
LR = 0.1
EPS = 1e-8


def first_step(opt_cls, grad=G, **kw):
    w = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    opt = opt_cls([w], lr=LR, **kw)
    w.grad = torch.tensor(grad, dtype=torch.float64)
    opt.step()
    return w.detach()


def expect(rows):
    return torch.tensor(rows, dtype=torch.float64)


def sgn(x):
    return math.copysign(1.0, x)


def test_gd():
    assert torch.allclose(first_step(zoo.GD), expect([[-0.1, 0.2], [-0.3, -0.05]]), atol=1e-15)


def test_adam_first_step_is_sign_like():
    # m_hat = g, v_hat = g^2: step -lr g / (|g| + eps)
    want = [[-LR * g / (abs(g) + EPS) for g in row] for row in G]
    assert torch.allclose(first_step(zoo.Adam), expect(want), atol=1e-15)


def test_shared_scalar_adam():
    s = math.sqrt((1 + 4 + 9 + 0.25) / 4) + EPS  # sqrt(mean g^2) = sqrt(3.5625) = 1.8875
    want = [[-LR * g / s for g in row] for row in G]
    assert torch.allclose(first_step(zoo.ScalarAdam), expect(want), atol=1e-15)


def test_shared_scalar_adam_pools_over_all_parameters():
    a = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = zoo.ScalarAdam([a, b], lr=1.0)
    a.grad, b.grad = torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([4.0], dtype=torch.float64)
    opt.step()
    s = math.sqrt((9 + 0 + 16) / 3) + EPS
    assert torch.allclose(torch.cat([a, b]).detach(), torch.tensor([-3 / s, 0.0, -4 / s], dtype=torch.float64))


def test_rmsprop():
    # v = 0.01 g^2 (no bias correction): step -lr g / (0.1 |g| + eps) ~ -10 lr sign(g)
    want = [[-LR * g / (0.1 * abs(g) + EPS) for g in row] for row in G]
    assert torch.allclose(first_step(zoo.RMSProp), expect(want), atol=1e-12)


@pytest.mark.parametrize("cls", [zoo.Signum, zoo.Lion])
def test_sign_rules(cls):
    want = [[-LR * sgn(g) for g in row] for row in G]
    assert torch.allclose(first_step(cls), expect(want), atol=1e-15)


def test_lion_second_step_uses_the_interpolation_not_the_ema():
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = zoo.Lion([w], lr=1.0)
    w.grad = torch.tensor([1.0], dtype=torch.float64)
    opt.step()  # m = 0.01
    w.grad = torch.tensor([-0.5], dtype=torch.float64)
    opt.step()  # c = sign(0.9 * 0.01 - 0.1 * 0.5) = sign(-0.041) = -1  -> w = -1 + 1
    assert float(w.detach()) == 0.0
    # Signum's EMA m = 0.9 * 0.1 - 0.1 * 0.5 = 0.04 > 0 instead: the step keeps going down
    w2 = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt2 = zoo.Signum([w2], lr=1.0)
    for g in (1.0, -0.5):
        w2.grad = torch.tensor([g], dtype=torch.float64)
        opt2.step()
    assert float(w2.detach()) == -2.0


def test_adafactor():
    """r, c are EMAs of the row / column means of G^2 *without* bias correction (the protocol's Adafactor:
    the correction would divide r and c by 1 - beta2^t, 1000x at step 1)."""
    # row means of g^2: [2.5, 4.625]; column means: [5, 2.125]; after one step r, c = 0.001 x those
    b2 = 0.999
    r, c = [(1 - b2) * 2.5, (1 - b2) * 4.625], [(1 - b2) * 5.0, (1 - b2) * 2.125]
    mr = (r[0] + r[1]) / 2
    want = [[-LR * G[i][j] / (math.sqrt(r[i] * c[j] / mr + 1e-30) + EPS) for j in range(2)] for i in range(2)]
    assert torch.allclose(first_step(zoo.Adafactor), expect(want), atol=1e-14)
    # a second step: the EMAs continue uncorrected (a plain loop over the entries)
    G2 = [[0.5, 1.0], [-1.0, 2.0]]
    w = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    opt = zoo.Adafactor([w], lr=LR)
    for grad in (G, G2):
        w.grad = torch.tensor(grad, dtype=torch.float64)
        opt.step()
    r2 = [b2 * r[i] + (1 - b2) * (G2[i][0] ** 2 + G2[i][1] ** 2) / 2 for i in range(2)]
    c2 = [b2 * c[j] + (1 - b2) * (G2[0][j] ** 2 + G2[1][j] ** 2) / 2 for j in range(2)]
    mr2 = (r2[0] + r2[1]) / 2
    step2 = [[-LR * G2[i][j] / (math.sqrt(r2[i] * c2[j] / mr2 + 1e-30) + EPS) for j in range(2)] for i in range(2)]
    assert torch.allclose(w.detach(), expect(want) + expect(step2), atol=1e-13)
    # 1-D tensors: an unfactored v, also uncorrected
    b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = zoo.Adafactor([b], lr=LR)
    b.grad = torch.tensor([2.0, -1.0], dtype=torch.float64)
    opt.step()
    want_1d = [-LR * g / (math.sqrt((1 - b2) * g * g) + EPS) for g in (2.0, -1.0)]
    assert torch.allclose(b.detach(), torch.tensor(want_1d, dtype=torch.float64), atol=1e-14)


def _ns5_scalar(s):
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(5):
        s = a * s + b * s ** 3 + c * s ** 5
    return s


def test_muon_on_a_rotated_diagonal():
    # G = Q diag(3, 4) R: NS5 acts on the singular values 3/5, 4/5 (||G||_F = 5) as a scalar quintic
    th, ph = 0.3, -1.1
    q = torch.tensor([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]], dtype=torch.float64)
    r = torch.tensor([[math.cos(ph), math.sin(ph)], [-math.sin(ph), math.cos(ph)]], dtype=torch.float64)
    g = q @ torch.diag(torch.tensor([3.0, 4.0], dtype=torch.float64)) @ r
    f = torch.tensor([_ns5_scalar(3 / (5 + 1e-7)), _ns5_scalar(4 / (5 + 1e-7))], dtype=torch.float64)
    want = -LR * q @ torch.diag(f) @ r
    assert torch.allclose(first_step(zoo.Muon, grad=g.tolist()), want, atol=1e-12)


def test_muon_momentum_is_a_plain_sum():
    w = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    opt = zoo.Muon([w], lr=1.0)
    for _ in range(2):
        w.grad = torch.eye(2, dtype=torch.float64)
        opt.step()
    assert torch.allclose(opt.state[w]["m"], 1.9 * torch.eye(2, dtype=torch.float64))


def test_shampoo():
    # G = diag(3, 4): L = R = diag(9, 16); (L + I)^(-1/4) = diag(10^-1/4, 17^-1/4); step -lr diag(3/sqrt 10, 4/sqrt 17)
    want = [[-LR * 3 / math.sqrt(10), 0.0], [0.0, -LR * 4 / math.sqrt(17)]]
    assert torch.allclose(first_step(zoo.Shampoo, grad=[[3.0, 0.0], [0.0, 4.0]]), expect(want), atol=1e-14)


def test_shampoo_refreshes_every_twenty_steps():
    w = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    opt = zoo.Shampoo([w], lr=1.0)
    for t in range(1, 22):
        w.grad = torch.eye(2, dtype=torch.float64)
        opt.step()
        # the inverse roots were taken at steps 1 and 21, from L = t I then
        t_inv = 1 if t < 21 else 21
        want = (t_inv + 1.0) ** -0.25
        assert math.isclose(float(opt.state[w]["L_inv"][0, 0]), want, rel_tol=1e-12)


def _run(cls, steps=5, **kw):
    torch.manual_seed(0)
    w = [torch.randn(3, 2, dtype=torch.float64, requires_grad=True), torch.randn(2, dtype=torch.float64,
                                                                             requires_grad=True)]
    opt = cls(w, lr=1e-2, **kw)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in w:
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in w])


def test_dial_end_points():
    """p = 1 is Adam and p = 0 shared-scalar Adam (up to the one extra eps of the dial's denominator)."""
    assert torch.allclose(_run(zoo.AdamP, p=1.0, eps=0.0), _run(zoo.Adam, eps=0.0), rtol=0, atol=1e-15)
    assert torch.allclose(_run(zoo.AdamP, p=0.0, eps=0.0), _run(zoo.ScalarAdam, eps=0.0), rtol=0, atol=1e-15)
    # with eps = 1e-8 the extra eps moves a step by at most lr * eps / |m_hat| relative
    assert torch.allclose(_run(zoo.AdamP, p=1.0), _run(zoo.Adam), rtol=0, atol=1e-8)
    assert torch.allclose(_run(zoo.AdamP, p=0.0), _run(zoo.ScalarAdam), rtol=0, atol=1e-8)
    assert not torch.allclose(_run(zoo.AdamP, p=0.5), _run(zoo.Adam), atol=1e-4)


def test_torch_adam_agrees_with_the_zoo_adam():
    w = [torch.zeros(3, dtype=torch.float64, requires_grad=True)]
    ref = torch.optim.Adam(w, lr=1e-2)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        w[0].grad = torch.randn(3, generator=gen, dtype=torch.float64)
        ref.step()
    w2 = [torch.zeros(3, dtype=torch.float64, requires_grad=True)]
    mine = zoo.Adam(w2, lr=1e-2)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        w2[0].grad = torch.randn(3, generator=gen, dtype=torch.float64)
        mine.step()
    assert torch.allclose(w[0], w2[0], atol=1e-12)


def test_make_and_errors():
    w = torch.zeros(2, 2, requires_grad=True)
    assert isinstance(zoo.make("muon", [("W", w)]), zoo.Muon)
    with pytest.raises(ValueError, match="unknown zoo rule"):
        zoo.make("nesterov_adam", [w])
    with pytest.raises(ValueError, match="matrices only"):
        zoo.Muon([torch.zeros(3, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="lr must be > 0"):
        zoo.Adam([w], lr=0.0)
