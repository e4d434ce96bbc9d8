"""Symo on 2 and 4 gloo processes (FSDP2 and DDP) against one process: the same parameters after 5 float64
steps, each block's matrix function on exactly one rank, a fixed number of collectives per step, and a
torch.distributed.checkpoint save -> load -> resume bit-identical to the uninterrupted run.

Every case has a stored statistic (the root kind; eigen_adam's two sides for SOAP-Muon; NorMuon's rows for the
NorMuon one; none for the Muon-path one), a frozen covered parameter, two parameter groups and widths no world
size divides (tests/distributed_cases.py). One spawn per world size trains them all.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from distributed_cases import (
    CASES,
    STEPS,
    batch,
    build,
    deep_spec,
    free_port,
    full_params,
    init,
    loss_of,
    make_optimizer,
    train,
    two_branches_spec,
    wrap,
)
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from symo.optim import PRESETS, DistributedConfig, Symo, SymoConfig
from symo.optim.distributed import assign_owners, coupling_components, resolve_mode
from symo.runtime.compiled import NonFiniteGradientError
from symo.train.models import MLP

MODES = ("fsdp", "replicated")
EQUIVALENCE = ("mlp_tanh", "gpt_muon", "gpt_muon_path", "gpt_true", "rnn_tanh", "mlp_gradient", "shampoo_gm",
               "mixed_dtypes", "gpt_soap_muon", "gpt_qkv_soap_muon", "gpt_normuon")
_RUNS: dict[int, dict] = {}


def _worker(rank: int, world: int, port: int, spec_dir: str) -> None:
    init(rank, world, port)
    try:
        out = {}
        for mode in MODES:
            for name in EQUIVALENCE + (("mlp_deep",) if mode == "fsdp" else ()):
                record: dict = {}
                model, _ = train(name, spec_dir, mode, record=record)
                params = full_params(model.module if mode == "replicated" else model)
                out[mode, name] = {"params": params if rank == 0 else None, **record}
        torch.save(out, os.path.join(spec_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def runs(world: int, tmp_path_factory) -> dict:
    """{"ranks": [per rank {(mode, case): record}], "one": {case: one process's record}}, computed once."""
    if world not in _RUNS:
        spec_dir = str(tmp_path_factory.mktemp(f"world{world}"))
        for spec_name, text in (("mlp_tanh_deep", deep_spec()), ("two_branches", two_branches_spec())):
            with open(os.path.join(spec_dir, f"{spec_name}.toml"), "w") as f:
                f.write(text)
        mp.start_processes(_worker, args=(world, free_port(), spec_dir), nprocs=world, start_method="fork")
        ranks = [torch.load(os.path.join(spec_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]
        one = {}
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as each rank (init): a matmul's summation order depends on the thread count
        try:
            for name in EQUIVALENCE:
                record: dict = {}
                model, _ = train(name, spec_dir, "off", record=record)
                one[name] = {"params": full_params(model), **record}
        finally:
            torch.set_num_threads(threads)
        _RUNS[world] = {"ranks": ranks, "one": one}
    return _RUNS[world]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode", MODES)
def test_equal_to_one_process_after_five_steps(world, mode, tmp_path_factory):
    """float64: the sharded or replicated run's parameters equal one process's to 1e-10 (relative to the
    parameter's largest entry; what differs is only the order of the gradients' sums). The mixed-dtype
    case to 1e-5: its float32 branch's rounding reaches the float64 one through the loss. SOAP-Muon, whose Adam
    step in a rotated basis turns that rounding into O(1) moves (one process with gradients 1e-15 apart ends
    up to 15% apart), trains every rank on the whole batch, so its averaged gradients are exact and it must be
    bit-identical."""
    results = runs(world, tmp_path_factory)
    for name in EQUIVALENCE:
        got, want = results["ranks"][0][mode, name]["params"], results["one"][name]["params"]
        assert set(got) == set(want), name
        for n, w in want.items():
            err = float((got[n] - w).abs().max() / w.abs().max().clamp_min(1e-300))
            assert err < (1e-5 if name == "mixed_dtypes" else 1e-10), (name, n, err)
            assert not CASES[name].whole_batch or torch.equal(got[n], w), (name, n, err)
        frozen = CASES[name].frozen
        assert torch.equal(got[frozen], build(name, "")[0].get_parameter(frozen).detach()), (name, "frozen moved")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode", MODES)
def test_each_block_is_computed_on_exactly_one_rank(world, mode, tmp_path_factory):
    """The matrix functions one process computes (per block, 5 steps) are each computed by exactly one
    rank, as often; summed over the ranks nothing is repeated."""
    results = runs(world, tmp_path_factory)
    for name in EQUIVALENCE:
        alone: Counter = results["one"][name]["calls"]
        per_rank = [r[mode, name]["calls"] for r in results["ranks"]]
        assert alone, name
        assert sum(per_rank, Counter()) == alone, name
        for block in alone:
            assert sum(1 for calls in per_rank if calls[block]) == 1, (name, block)
        if world == 2:  # the components are spread: no rank computes everything
            assert all(len(calls) < len(alone) for calls in per_rank), (name, per_rank)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_per_step_do_not_grow_with_the_parameters(world, tmp_path_factory):
    """FSDP2: one all-reduce (the finite-gradient check) and one all-to-all each way per dtype (the raw
    gradients' statistics: one more, for the gradients; NorMuon's rows: one all-reduce of every sharded matrix's
    norms); DDP: the updates' all-to-all alone, per dtype.
    The same for a 3-layer MLP, a 7-layer one and the GPTs."""
    results = runs(world, tmp_path_factory)
    for rank_results in results["ranks"]:
        for name in EQUIVALENCE + ("mlp_deep",):
            dtypes = 2 if name == "mixed_dtypes" else 1
            ways = 2 + raw_gradient_statistic(name)
            rows = "neuron_norm_beta2" in CASES[name].options  # NorMuon's norms of the sharded matrices
            assert rank_results["fsdp", name]["collectives"] == [1 + dtypes * ways + rows] * STEPS, name
        for name in EQUIVALENCE:
            dtypes = 2 if name == "mixed_dtypes" else 1
            assert rank_results["replicated", name]["collectives"] == [dtypes] * STEPS, name


def raw_gradient_statistic(name: str) -> bool:
    """Whether the case's kind keeps the raw gradient's statistic (by its options or its preset), whose gradients
    travel to the owners too."""
    options = dict(CASES[name].options)
    preset = options.pop("preset", None)
    config = (SymoConfig(**PRESETS[preset].values) if preset else SymoConfig()).replace(**options)
    preconditioner = config.preconditioner
    return getattr(getattr(preconditioner, "inner", preconditioner), "statistic", None) == "gradient"


def _resume_worker(rank: int, world: int, port: int, folder: str) -> None:
    init(rank, world, port)
    try:
        same = {}
        for mode, name in (("fsdp", "mlp_tanh"), ("fsdp", "gpt_true"), ("replicated", "rnn_tanh"),
                           ("fsdp", "gpt_normuon")):
            ckpt = os.path.join(folder, f"{mode}_{name}")
            model, opt = _fresh(name, mode, seed=0)
            train(name, "", mode, range(3), model, opt)
            inner = model.module if mode == "replicated" else model
            dcp.save({"model": get_model_state_dict(inner), "optim": get_optimizer_state_dict(inner, opt)},
                     checkpoint_id=ckpt)
            train(name, "", mode, range(3, STEPS), model, opt)
            uninterrupted = full_params(inner)
            model, opt = _fresh(name, mode, seed=1)  # other initial weights: everything must come from disk
            inner = model.module if mode == "replicated" else model
            state = {"model": get_model_state_dict(inner), "optim": get_optimizer_state_dict(inner, opt)}
            dcp.load(state, checkpoint_id=ckpt)
            set_model_state_dict(inner, state["model"])
            set_optimizer_state_dict(inner, opt, state["optim"])
            train(name, "", mode, range(3, STEPS), model, opt)
            resumed = full_params(inner)
            same[mode, name] = all(torch.equal(uninterrupted[n], resumed[n]) for n in resumed)
        # a NaN in one rank's shard only: every rank raises, none steps
        model, opt = _fresh("mlp_tanh", "fsdp", seed=0)
        before = full_params(model)
        loss_of("mlp_tanh", model, tuple(t[rank * 4:(rank + 1) * 4] for t in batch("mlp_tanh", 0))).backward()
        if rank == 1:
            model.fc1.weight.grad.to_local()[0, 0] = float("nan")
        try:
            opt.step()
            same["nan raised"] = False
        except NonFiniteGradientError:
            same["nan raised"] = True
        after = full_params(model)
        same["nan left the weights"] = all(torch.equal(before[n], after[n]) for n in before)
        torch.save(same, os.path.join(folder, f"same{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _fresh(name: str, mode: str, seed: int):
    model, case = build(name, "", seed=seed)
    model = wrap(model, mode)
    return model, make_optimizer(name, model.module if mode == "replicated" else model, case, "", mode)


@pytest.mark.slow
def test_checkpoint_save_load_resume_is_bit_identical(tmp_path):
    """get_/set_optimizer_state_dict with dcp.save / dcp.load after 3 of 5 steps (beta2 > 0: the block
    statistics must travel too; NorMuon's row statistics, sharded as their parameters), into an optimizer built on
    other weights: the same bits as no stop.
    And a NaN gradient on one rank stops the step on every rank (no rank hangs in the exchange)."""
    world = 2
    mp.start_processes(_resume_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, start_method="fork")
    for r in range(world):
        same = torch.load(tmp_path / f"same{r}.pt")
        assert same and all(same.values()), same
    shutil.rmtree(tmp_path, ignore_errors=True)


# ---------------------------------------------------------------- one process: the plan and the config
def test_fsdp_mode_on_unsharded_parameters_says_to_shard_first():
    model, case = build("gpt_muon", "")
    with pytest.raises(ValueError, match=r"distributed_mode='fsdp' needs the model sharded first: its parameters are "
                                         r"plain tensors, not DTensors. Call torch.distributed.fsdp.fully_shard"):
        Symo(model.named_parameters(), case.spec, sizes=case.sizes, distributed_mode="fsdp")


def test_components_couple_blocks_that_share_a_parameter():
    """gpt_true: each layer's attention blocks form a component; the MLPs' trivial block couples every
    layer's MLP into one. The owners are balanced by cost, the costliest first."""
    model, case = build("gpt_true", "")
    opt = Symo(model.named_parameters(), case.spec, preconditioner="root", sizes=case.sizes, beta2=0.9)
    found = coupling_components(opt.plan)
    as_blocks = sorted(sorted(b for _, b in blocks) for _, blocks in found)
    assert as_blocks == [["L0", "L1"], ["L2", "L3", "L6"], ["L4", "L5"]]
    params = [set(ps) for ps, _ in found]
    assert all(a.isdisjoint(b) for i, a in enumerate(params) for b in params[i + 1:])
    assert set().union(*params) == set(opt.compiled.param_names)
    assert assign_owners([5.0, 4.0, 3.0, 3.0], 2) == [0, 1, 1, 0]
    assert assign_owners([1.0, 1.0], 4) == [0, 1]


def test_the_mode_resolves_from_the_parameters():
    plain = dict(MLP((2, 3, 2)).named_parameters())
    assert resolve_mode(DistributedConfig(), plain) == "off"
    assert resolve_mode(DistributedConfig(mode="replicated"), plain) == "replicated"
    assert SymoConfig(distributed_mode="fsdp").distributed.mode == "fsdp"
    assert SymoConfig(distributed=DistributedConfig(bucket_mb=1.0)).distributed_bucket_mb == 1.0
    for bad in ({"distributed_mode": "ddp"}, {"distributed_comm_dtype": "int8"}, {"distributed_bucket_mb": 0}):
        with pytest.raises(ValueError, match="distributed_"):
            SymoConfig(**bad)


def test_replicated_alone_equals_one_process_and_loads_either_layout():
    """The replicated mode without a process group (one rank) keeps each block's statistics on its anchor
    parameter, steps bit-identically to the plain optimizer, and loads a plain checkpoint (and the plain
    optimizer loads its checkpoint): the layouts convert both ways."""
    model, case = build("mlp_tanh", "")
    twin = build("mlp_tanh", "")[0]
    plain = make_optimizer("mlp_tanh", model, case, "", "off")
    anchored = make_optimizer("mlp_tanh", twin, case, "", "replicated")
    train("mlp_tanh", "", "off", range(2), model, plain)
    train("mlp_tanh", "", "off", range(2), twin, anchored)
    assert "symo_blocks" not in plain.state and "symo_blocks" not in anchored.state  # both on anchors
    assert "distributed (replicated): rank 0 of 1 computes 4 of 4 coupling components" in anchored.describe()
    assert "coupling components" not in plain.describe()
    for o in (plain, anchored):
        assert any("symo_blocks" in st for st in o.state.values() if isinstance(st, dict))
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    swapped_plain = make_optimizer("mlp_tanh", model, case, "", "off")
    swapped_plain.load_state_dict(anchored.state_dict())
    swapped_anchored = make_optimizer("mlp_tanh", twin, case, "", "replicated")
    swapped_anchored.load_state_dict(plain.state_dict())
    train("mlp_tanh", "", "off", range(2, 4), model, swapped_plain)
    train("mlp_tanh", "", "off", range(2, 4), twin, swapped_anchored)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_one_process_checkpoints_through_dcp_in_the_replicated_mode(tmp_path):
    """Without a process group the replicated mode is one rank with anchored statistics: DCP saves and
    restores them (beta2 > 0), and the resumed run is bit-identical."""
    model, case = build("mlp_tanh", "")
    opt = make_optimizer("mlp_tanh", model, case, "", "replicated")
    train("mlp_tanh", "", "off", range(3), model, opt)
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=tmp_path)
    train("mlp_tanh", "", "off", range(3, STEPS), model, opt)
    fresh = build("mlp_tanh", "", seed=1)[0]
    fresh_opt = make_optimizer("mlp_tanh", fresh, case, "", "replicated")
    state = {"model": get_model_state_dict(fresh), "optim": get_optimizer_state_dict(fresh, fresh_opt)}
    dcp.load(state, checkpoint_id=tmp_path)
    set_model_state_dict(fresh, state["model"])
    set_optimizer_state_dict(fresh, fresh_opt, state["optim"])
    train("mlp_tanh", "", "off", range(3, STEPS), fresh, fresh_opt)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def _save_worker(rank: int, world: int, port: int, folder: str) -> None:
    init(rank, world, port)
    try:
        model, opt = _fresh("gpt_true", "fsdp", seed=0)
        train("gpt_true", "", "fsdp", range(3), model, opt)
        dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
                 checkpoint_id=os.path.join(folder, "ckpt"))
        train("gpt_true", "", "fsdp", range(3, STEPS), model, opt)
        params = full_params(model)
        if rank == 0:
            torch.save(params, os.path.join(folder, "uninterrupted.pt"))
    finally:
        dist.destroy_process_group()


def _reshard_worker(rank: int, world: int, port: int, folder: str) -> None:
    init(rank, world, port)
    try:
        model, opt = _fresh("gpt_true", "fsdp", seed=1)
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=os.path.join(folder, "ckpt"))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
        train("gpt_true", "", "fsdp", range(3, STEPS), model, opt)
        params = full_params(model)
        if rank == 0:
            torch.save(params, os.path.join(folder, "resharded.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_checkpoint_saved_on_two_ranks_resumes_on_four(tmp_path):
    """The block statistics are saved under their anchor parameter's name, not their rank: a DCP checkpoint
    of 2 ranks loads on 4, each rank taking the blocks it owns there, and the run continues as the
    uninterrupted one (to summation order: 4 ranks reduce the gradients in another order)."""
    mp.start_processes(_save_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    mp.start_processes(_reshard_worker, args=(4, free_port(), str(tmp_path)), nprocs=4, start_method="fork")
    want, got = torch.load(tmp_path / "uninterrupted.pt"), torch.load(tmp_path / "resharded.pt")
    for n, w in want.items():
        assert float((got[n] - w).abs().max() / w.abs().max().clamp_min(1e-300)) < 1e-10, n
