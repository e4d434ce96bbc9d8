"""Symo's state and bookkeeping against hand-computed values and torch's own AdamW: the checkpoint's "symo"
record, where loaded state lives, the built-in AdamW's corner cases, float32 taylor statistics, and the
reports on batched blocks and geometric means. Mutation testing (scripts/mutation.sh) found each of these
unchecked before.
"""

from __future__ import annotations

import copy

import pytest
import torch
from cases import MUON, PER_HEAD, SIZES, SPECS, TANH, mlp_data, mse_loss
from helpers import ref_power, rel
from references import newton_schulz  # noqa: E402

import symo
from symo.optim import Symo
from symo.train.models import MLP

ROWS, COLS = SPECS / "shampoo_rows.toml", SPECS / "shampoo_cols.toml"


def trained(model, spec=TANH, steps: int = 2, **options) -> Symo:
    opt = Symo(model.named_parameters(), spec, lr=0.01, **options)
    dtype = next(model.parameters()).dtype
    x, y = (t.to(dtype) for t in mlp_data())
    for _ in range(steps):
        opt.zero_grad()
        mse_loss(model, x, y).backward()
        opt.step()
    return opt


# ------------------------------------------------------------------ the checkpoint's "symo" record
def test_state_dict_records_the_spec_and_its_widths():
    torch.manual_seed(0)
    opt = trained(MLP(SIZES).double(), preconditioner="root", beta2=0.9)
    meta = opt.state_dict()["symo"]
    assert meta == {"spec": "tanh MLP", "keys": [opt.compiled.key], "sizes": [dict(opt.compiled.sizes)],
                    "kind": "root"}
    assert meta["sizes"][0]["n_h1"] == 8 and meta["sizes"][0]["n_h2"] == 6      # the MLP's hidden widths


def test_load_state_dict_names_the_saved_spec_and_widths():
    """A checkpoint of another spec is refused naming the spec it was saved for; one of other widths (the
    "symo" record edited, shapes equal) naming the widths."""
    torch.manual_seed(0)
    model = MLP(SIZES).double()
    other = trained(copy.deepcopy(model), MUON).state_dict()
    opt = trained(model)
    with pytest.raises(ValueError, match="saved for spec 'Muon \\(per-matrix rows\\)' \\(or another parameter"):
        opt.load_state_dict(other)
    edited = copy.deepcopy(other)
    edited["symo"]["spec"] = opt.compiled.name  # the same name, another structure: the file was edited
    with pytest.raises(ValueError, match="the same name, but its spaces, rules or sizes differ: the spec file was "
                                         "edited"):
        opt.load_state_dict(edited)
    state = opt.state_dict()
    state["symo"]["sizes"][0]["n_h1"] = 9
    with pytest.raises(ValueError, match=r"other widths; \(saved, now\): \{'n_h1': \(9, 8\)\}"):
        opt.load_state_dict(state)


# ------------------------------------------------------------------ loaded state lives on the parameters' device
def test_loaded_state_moves_to_the_parameters_device():
    """Parameters on the meta device (a second device on every machine) load a CPU checkpoint: momentum,
    AdamW moments and the block statistics move to the parameters' device, AdamW's step counter stays
    where it was saved (as torch.optim does)."""
    torch.manual_seed(0)
    saved = trained(MLP(SIZES).double(), MUON, preconditioner="root", beta2=0.9).state_dict()
    meta_model = MLP(SIZES).double().to("meta")
    opt = Symo(meta_model.named_parameters(), MUON, preconditioner="root", lr=0.01, beta2=0.9)
    opt.load_state_dict(saved)
    kinds = set()
    for p in meta_model.parameters():
        for k, v in opt.state[p].items():
            if k == "symo_blocks":  # the block statistics on their anchor parameter: checked below
                continue
            kinds.add(k)
            assert v.device.type == ("cpu" if k == "step" else "meta"), k
    assert kinds == {"momentum_buffer", "step", "exp_avg", "exp_avg_sq"}
    blocks = opt.block_statistics()
    assert blocks and all(v.device.type == "meta" for st in blocks.values() for v in st.values() if torch.is_tensor(v))


def test_loaded_moments_take_the_dtype_a_fresh_optimizer_keeps():
    """A float32 run's checkpoint loaded for a float64 model: momentum and AdamW moments in float64, as a fresh
    float64 optimizer keeps them (and a bfloat16 model's in float32); the step counter as saved."""
    torch.manual_seed(0)
    saved = trained(MLP(SIZES), MUON).state_dict()
    for dtype, kept in ((torch.float64, torch.float64), (torch.bfloat16, torch.float32)):
        model = MLP(SIZES).to(dtype)
        opt = Symo(model.named_parameters(), MUON, lr=0.01)
        opt.load_state_dict(saved)
        moments = {k: v.dtype for p in model.parameters() for k, v in opt.state[p].items() if k != "step"}
        assert moments and set(moments.values()) == {kept}, (dtype, moments)


def test_describe_shows_the_groups_beta1_after_a_load():
    """torch's load_state_dict takes the checkpoint's group values: describe() shows what the groups hold."""
    torch.manual_seed(0)
    saved = trained(MLP(SIZES), MUON, beta1=0.5).state_dict()
    model = MLP(SIZES)
    opt = Symo(model.named_parameters(), MUON, lr=0.01)
    assert "beta1=0.95 " in opt.describe()
    opt.load_state_dict(saved)
    assert "beta1=0.5 " in opt.describe()


def test_a_model_that_changes_dtype_takes_its_moments_along():
    """model.double() after some steps: the next step keeps momentum and AdamW moments in float64, as a fresh
    float64 optimizer would, instead of stepping float64 weights with float32 moments."""
    torch.manual_seed(0)
    model = MLP(SIZES)
    opt = trained(model, MUON)
    model.double()
    x, y = (t.double() for t in mlp_data())
    opt.zero_grad()
    mse_loss(model, x, y).backward()
    opt.step()
    moments = {k: v.dtype for p in model.parameters() for k, v in opt.state[p].items() if k != "step"}
    assert moments and set(moments.values()) == {torch.float64}, moments


@pytest.mark.parametrize("preset", [None, "soap_muon"])
def test_deepcopy_gives_an_optimizer_that_steps_as_the_original_and_pickling_says_what_to_do(preset):
    """copy.deepcopy((model, opt)): the copy steps bit for bit as the original from there on; pickling is refused
    with the state_dict route."""
    import pickle

    torch.manual_seed(0)
    model = MLP(SIZES)
    x, y = mlp_data()
    opt = Symo(model.named_parameters(), MUON, lr=0.01, preset=preset)

    def step(m, o):
        o.zero_grad()
        mse_loss(m, x.float(), y.float()).backward()
        o.step()

    for _ in range(3):
        step(model, opt)
    twin, twin_opt = copy.deepcopy((model, opt))
    assert {id(p) for g in twin_opt.param_groups for p in g["params"]} == {id(p) for p in twin.parameters()}
    for _ in range(4):
        step(model, opt)
        step(twin, twin_opt)
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(TypeError, match=r"Symo cannot be pickled.*opt.state_dict\(\).*copy.deepcopy"):
        pickle.dumps(opt)


def test_a_checkpoint_with_a_parameter_that_never_had_a_gradient_loads():
    """fc1.bias never gets a gradient, so the checkpoint holds no state for it: loading works, and the loaded
    optimizer continues exactly like the saved one."""
    torch.manual_seed(0)
    x, y = mlp_data()
    model = MLP(SIZES).double()
    opt = Symo(model.named_parameters(), MUON, preconditioner="root", lr=0.01, beta2=0.9)

    def steps(m, o, k):
        for _ in range(k):
            o.zero_grad()
            mse_loss(m, x, y).backward()
            m.fc1.bias.grad = None
            o.step()

    steps(model, opt, 2)
    assert model.fc1.bias not in opt.state
    twin = copy.deepcopy(model)
    opt2 = Symo(twin.named_parameters(), MUON, preconditioner="root", lr=0.01, beta2=0.9)
    opt2.load_state_dict(opt.state_dict())
    steps(model, opt, 2)
    steps(twin, opt2, 2)
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n


# ------------------------------------------------------------------ the built-in AdamW against torch's
def test_builtin_adamw_equals_torch_adamw_with_a_gradless_parameter_and_unit_weight_decay():
    """The uncovered biases follow torch.optim.AdamW (single-tensor path) bit for bit, with weight decay 1
    and the first bias of the group without a gradient (skipped, the others still updated). The covered
    weights get lr 0, so both models see the same gradients at every step."""
    torch.manual_seed(0)
    x, y = mlp_data()
    model = MLP(SIZES).double()
    twin = copy.deepcopy(model)
    kw = dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=1.0)
    opt = Symo(model.named_parameters(), MUON, lr=0.0, adamw_lr=0.05, adamw_betas=kw["betas"],
               adamw_eps=kw["eps"], adamw_wd=kw["weight_decay"])
    assert opt.param_groups[1]["param_names"] == ["fc1.bias", "fc2.bias", "fc3.bias"]
    ref = torch.optim.AdamW([twin.fc1.bias, twin.fc2.bias, twin.fc3.bias], lr=0.05, foreach=False, **kw)
    for _ in range(3):
        for m, o in ((model, opt), (twin, ref)):
            o.zero_grad()
            mse_loss(m, x, y).backward()
            m.fc1.bias.grad = None
            o.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n
    assert not torch.equal(model.fc2.bias, MLP(SIZES).double().fc2.bias)   # sanity: the biases moved


def test_adamw_moments_of_bfloat16_parameters_are_float32():
    torch.manual_seed(0)
    model = MLP(SIZES).to(torch.bfloat16)
    opt = Symo(model.named_parameters(), MUON, lr=0.01)
    x, y = mlp_data()
    mse_loss(model, x.bfloat16(), y.bfloat16()).backward()
    opt.step()
    for p in (model.fc1.bias, model.fc2.bias, model.fc3.bias):
        assert opt.state[p]["exp_avg"].dtype == opt.state[p]["exp_avg_sq"].dtype == torch.float32


# ------------------------------------------------------------------ taylor with float32 statistics
def test_taylor_on_float32_statistics_follows_float64():
    """The taylor kind on a float32 model with stats_dtype="float32" keeps float32 statistics and
    preconditioners and tracks the
    same run in float64 to float32 accuracy (b3's block statistic has an eigenvalue at 4e-6 of its largest,
    which float32 holds to about 10%: that parameter agrees to 1e-2, every other to 1e-4)."""
    torch.manual_seed(0)
    base = MLP(SIZES).double()
    runs = []
    for dtype in (torch.float64, torch.float32):
        model = copy.deepcopy(base).to(dtype)
        opt = trained(model, steps=3, preconditioner="taylor", beta2=0.9, damping=1e-3,
                      stats_dtype="float32" if dtype == torch.float32 else "auto")
        runs.append(model)
        if dtype == torch.float32:
            assert all(st["precond"].dtype == torch.float32 for st in opt.block_statistics().values())
    for (n, a), b in zip(runs[0].named_parameters(), runs[1].parameters()):
        assert rel(b.detach().double(), a.detach()) < (1e-2 if n == "fc3.bias" else 1e-4), n
    assert rel(runs[0].fc2.weight.detach(), base.fc2.weight.detach()) > 1e-3


# ------------------------------------------------------------------ reports
def test_describe_counts_and_tags():
    """Bias-free: 3 preconditioned, 0 to AdamW; with a geometric mean every block line names its spec."""
    model = MLP(SIZES, bias=False)
    first = Symo(model.named_parameters(), MUON).describe().splitlines()[0]
    assert first == "Symo: 3 parameters preconditioned by spec 'Muon (per-matrix rows)', 0 to AdamW"
    text = Symo(model.named_parameters(), ROWS, preconditioner="root", geometric_mean_with=COLS).describe().splitlines()
    rows = [ln for ln in text if ln.startswith("  [Shampoo row group (right factor)] L")]
    cols = [ln for ln in text if ln.startswith("  [Shampoo column group (left factor)] L")]
    assert len(rows) == len(cols) == 3, text


def test_memory_report_of_a_batched_block():
    """One weight (12 x 5) with a per-head gauge: a block of batch 3, mult 5; stored statistics are an EMA
    and its matrix function per head, 2 * 3 * 5 * 5 = 150 numbers, which the state then holds."""
    w = torch.nn.Parameter(torch.randn(12, 5, dtype=torch.float64))
    opt = Symo({"w": w}, symo.parse_spec(PER_HEAD), preconditioner="root", beta2=0.9)
    assert [(b.batch, b.mult) for b in opt.compiled.blocks] == [(3, 5)]
    report = opt.memory_report()
    assert report["symo_block_statistics"] == 150 and report["symo"] == 60 + 150
    w.grad = torch.randn(12, 5, dtype=torch.float64)
    opt.step()
    assert opt.state_bytes() == 8 * report["symo"]


# ------------------------------------------------------------------ the Muon path's less common branches
def _one_step(model, spec, **options):
    """Gradients of one loss, the parameters before, and the update lr * direction after one step (lr = 1)."""
    gen = torch.Generator().manual_seed(1)
    dtype = next(model.parameters()).dtype
    x, y = (torch.randn(16, n, generator=gen, dtype=dtype) for n in (model.fc1.in_features, model.fc3.out_features))
    mse_loss(model, x, y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = Symo(model.named_parameters(), spec, lr=1.0, beta1=0.0, **options)
    opt.step()
    return grads, {n: before[n] - p.detach() for n, p in model.named_parameters()}, opt


@pytest.mark.parametrize("backend", ["eigh", "newton_schulz"])
def test_blocks_of_one_shape_batched_or_not_give_muons_update(backend):
    """MLP (4, 4, 4, 4): three 4 x 4 blocks with equal constants, stacked into one batched call by default.
    batch_blocks False and True both give sqrt(d) times the polar factor (eigh) or Muon's quintic (newton_schulz)
    of each gradient, per layer."""
    torch.manual_seed(0)
    base = MLP((4, 4, 4, 4), bias=False).double()
    for batch in (True, False):
        grads, upd, _ = _one_step(copy.deepcopy(base), MUON, backend=backend, batch_blocks=batch, damping=0.0)
        for n, g in grads.items():
            if backend == "eigh":
                u, _, vh = torch.linalg.svd(g)
                want = 2.0 * u @ vh
            else:
                want = 2.0 * newton_schulz(g, dtype=torch.float64)
            assert rel(upd[n], want) < 1e-10, (batch, n)


def test_statistic_gradient_with_a_gradless_parameter_counts_it_as_zero():
    """Muon path with statistic="gradient": a covered parameter without a gradient counts as zero in its block
    (the same update as an explicit zero gradient for the others) and does not move."""
    torch.manual_seed(0)
    base = MLP(SIZES).double()
    x, y = mlp_data()
    runs = []
    for drop in (True, False):
        model = copy.deepcopy(base)
        opt = Symo(model.named_parameters(), TANH, lr=0.1, statistic="gradient", beta1=0.5)
        for _ in range(2):
            opt.zero_grad()
            mse_loss(model, x, y).backward()
            if drop:
                model.fc3.bias.grad = None
            else:
                model.fc3.bias.grad.zero_()
            opt.step()
        runs.append(model)
    assert torch.equal(runs[0].fc3.bias, base.fc3.bias)
    for (n, a), b in zip(runs[0].named_parameters(), runs[1].parameters()):
        if n != "fc3.bias":
            assert rel(a.detach(), b.detach()) < 1e-12, n


def test_ns_dtype_bfloat16_runs_the_quintic_in_bfloat16():
    """ns_dtype="bfloat16": Muon's quintic in bfloat16 (as the published Muon on GPUs), its result used in the
    parameters' precision: the update is sqrt(max(1, rows / cols)) NS_bf16(G), not the float32 iteration."""
    torch.manual_seed(0)
    grads, upd, _ = _one_step(MLP(SIZES, bias=False).double(), MUON, backend="newton_schulz", update_scale="muon",
                              ns_dtype="bfloat16")
    for n, g in grads.items():
        scale = max(1.0, g.shape[0] / g.shape[1]) ** 0.5
        want = scale * newton_schulz(g, dtype=torch.bfloat16).double()
        f32 = scale * newton_schulz(g, dtype=torch.float32).double()
        assert rel(upd[n], want) < 1e-3 and rel(upd[n], f32) > 5 * rel(upd[n], want), n


def test_adamw_scale_on_the_newton_schulz_polar_path():
    """update_scale="adamw" with the polar Newton–Schulz path: each layer's update is NS(G) rescaled to RMS
    adamw_rms."""
    torch.manual_seed(0)
    grads, upd, _ = _one_step(MLP(SIZES, bias=False).double(), MUON, backend="newton_schulz", update_scale="adamw",
                              adamw_rms=0.3)
    for n, g in grads.items():
        ns = newton_schulz(g, dtype=torch.float64)
        want = 0.3 * ns / ns.square().mean().sqrt()
        assert rel(upd[n], want) < 1e-12, n


def test_statistic_gradient_newton_schulz_backend_is_the_coupled_inverse_root():
    """beta2 = 0, statistic="gradient", newton_schulz backend: a wide block (fc1, Y = G^T 5 x 8) gets
    (A + damping ||A||_F I)^{-1/2} Y from the coupled iteration; tall blocks (fc2, fc3) go through the low-rank
    root with damping * lambda_max."""
    torch.manual_seed(0)
    damping = 0.2
    grads, upd, _ = _one_step(MLP(SIZES, bias=False).double(), MUON, backend="newton_schulz", statistic="gradient",
                              damping=damping, ns_inverse_steps=60)
    for n, g in grads.items():
        a = g.T @ g / g.shape[0]
        lam = ref_power(a, -0.5, damping) @ g.T
        if n == "fc1.weight":
            frob = float(torch.sqrt((a * a).sum()))
            want = ref_power(a + damping * frob * torch.eye(len(a), dtype=a.dtype), -0.5) @ g.T
            assert rel(upd[n].T, want) < 1e-10 and rel(upd[n].T, lam) > 1e-2, n
        else:
            assert rel(upd[n].T, lam) < 1e-10, n


def test_weight_decay_of_one_on_covered_parameters():
    """Decoupled weight decay 1 (lr 1): w <- (1 - lr wd) w - lr u removes w entirely, whatever u is."""
    torch.manual_seed(0)
    base = MLP(SIZES, bias=False).double()
    _, plain, _ = _one_step(copy.deepcopy(base), MUON)
    _, decayed, _ = _one_step(copy.deepcopy(base), MUON, weight_decay=1.0)
    for n, p in base.named_parameters():
        # lr = 1: the decayed step is w - (1 - 1) w + u = w + u, i.e. the plain update plus w itself
        assert rel(decayed[n], plain[n] + p.detach()) < 1e-12, n


def test_bfloat16_parameters_get_float32_statistics_like_float32_parameters():
    """bfloat16 parameters with statistic="gradient" and the taylor estimator: gradients and weights are taken
    to float32 before any statistic, so the preconditioners equal those of float32 parameters holding the same
    values and gradients, bit for bit."""
    torch.manual_seed(0)
    base = MLP(SIZES).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    grads = {n: torch.randn(p.shape, generator=gen).to(torch.bfloat16) for n, p in base.named_parameters()}
    opts = []
    for dtype in (torch.bfloat16, torch.float32):
        model = copy.deepcopy(base).to(dtype)
        opt = Symo(model.named_parameters(), TANH, preconditioner="taylor", lr=0.01, beta2=0.9, statistic="gradient",
                   damping=1e-3, stats_dtype="float32")
        for n, p in model.named_parameters():
            p.grad = grads[n].to(dtype)
        opt.step()
        opts.append(opt)
    for b, st in opts[1].block_statistics().items():
        assert st["precond"].dtype == torch.float32
        assert torch.equal(opts[0].block_statistics()[b]["precond"], st["precond"]), b


def test_bfloat16_parameters_on_the_muon_path_with_gradient_statistics():
    """beta2 = 0, statistic="gradient" on bfloat16 parameters: the gradients are taken to float32 like the
    momentum, and the step agrees with the same step on float32 parameters to bfloat16 precision."""
    torch.manual_seed(0)
    base = MLP(SIZES).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(4)
    grads = {n: torch.randn(p.shape, generator=gen).to(torch.bfloat16) for n, p in base.named_parameters()}
    models = []
    for dtype in (torch.bfloat16, torch.float32):
        model = copy.deepcopy(base).to(dtype)
        opt = Symo(model.named_parameters(), TANH, lr=0.1, statistic="gradient", beta1=0.5)
        for n, p in model.named_parameters():
            p.grad = grads[n].to(dtype)
        opt.step()
        models.append(model)
    for (n, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert rel(a.detach().double(), b.detach().double()) < 1e-2, n
    assert rel(models[1].fc2.weight.detach().double(), base.fc2.weight.detach().double()) > 5e-2



def test_torch_distributed_checkpoint_round_trip_in_one_process(tmp_path) -> None:
    """torch.distributed.checkpoint in one process, stored statistics included (beta2 > 0, the paper
    preset): get_optimizer_state_dict, dcp.save, dcp.load, set_optimizer_state_dict, then two more steps
    equal two uninterrupted ones bit for bit."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    torch.manual_seed(0)
    model = MLP(SIZES).double()
    opt = trained(model, TANH, preset="notebook")
    twin = copy.deepcopy(model)
    state = {"optim": get_optimizer_state_dict(model, opt)}
    assert any("symo_blocks" in v for v in state["optim"]["state"].values())  # keyed by parameter name
    dcp.save(state, checkpoint_id=tmp_path)
    resumed = Symo(twin.named_parameters(), TANH, lr=0.01, preset="notebook")
    loaded = {"optim": get_optimizer_state_dict(twin, resumed)}
    dcp.load(loaded, checkpoint_id=tmp_path)
    set_optimizer_state_dict(twin, resumed, loaded["optim"])
    x, y = mlp_data(7)
    for m, o in ((model, opt), (twin, resumed)):
        for _ in range(2):
            o.zero_grad()
            mse_loss(m, x, y).backward()
            o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
