"""The GPT, the GPT specs and the optimizers `symo train` builds, against references written here."""

import math

import pytest
import torch
from references import ReferenceMuon  # noqa: E402
from torch.func import functional_call
from torch.nn import functional as F

import symo
from symo.train import TrainConfig, build_optimizer
from symo.train.models import GPT, GPTConfig
from symo.train.muon import Muon

TINY = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11)


def reference_gpt_logits(w: dict[str, torch.Tensor], idx: torch.Tensor, n_layer: int, n_head: int) -> torch.Tensor:
    """nanoGPT's forward written out: pre-LN blocks, causal softmax attention with an explicit mask,
    exact (erf) GELU MLP, final LayerNorm, logits = x @ wte^T (the tied output head)."""
    b, t = idx.shape
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][:t]
    c = x.shape[-1]
    d = c // n_head

    def ln(z, name):
        mu = z.mean(-1, keepdim=True)
        var = ((z - mu) ** 2).mean(-1, keepdim=True)
        return (z - mu) / torch.sqrt(var + 1e-5) * w[f"{name}.weight"] + w[f"{name}.bias"]

    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for i in range(n_layer):
        p = f"transformer.h.{i}"
        h = ln(x, f"{p}.ln_1")
        qkv = h @ w[f"{p}.attn.c_attn.weight"].T + w[f"{p}.attn.c_attn.bias"]
        q, k, v = (z.reshape(b, t, n_head, d).transpose(1, 2) for z in qkv.split(c, -1))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + y @ w[f"{p}.attn.c_proj.weight"].T + w[f"{p}.attn.c_proj.bias"]
        h = ln(x, f"{p}.ln_2")
        u = h @ w[f"{p}.mlp.c_fc.weight"].T + w[f"{p}.mlp.c_fc.bias"]
        u = 0.5 * u * (1 + torch.erf(u / math.sqrt(2)))
        x = x + u @ w[f"{p}.mlp.c_proj.weight"].T + w[f"{p}.mlp.c_proj.bias"]
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T


def tiny_model(dtype=torch.float64, seed=0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**TINY)).to(dtype)
    with torch.no_grad():  # non-zero biases and gains, so the reference sees every term
        for n, p in model.named_parameters():
            if n.endswith("bias") or "ln_" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model


def test_forward_matches_plain_reference():
    model = tiny_model()
    assert model.lm_head.weight is model.transformer.wte.weight  # weight tying
    assert model.transformer.h[0].attn.c_attn.bias is not None
    idx = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    targets = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    logits, loss = model(idx, targets)
    ref = reference_gpt_logits(dict(model.named_parameters()), idx, TINY["n_layer"], TINY["n_head"])
    torch.testing.assert_close(logits, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss, F.cross_entropy(ref.reshape(-1, ref.shape[-1]), targets.reshape(-1)))


@pytest.mark.parametrize("spec", ["gpt_muon", "gpt_true"])
def test_gpt_specs_cover_every_block_matrix(spec):
    model = tiny_model()
    d_head = TINY["n_embd"] // TINY["n_head"]
    opt = symo.Symo(model.named_parameters(), spec, sizes={"dqk{i}": d_head, "dvo{i}": d_head}
                    if spec == "gpt_true" else None)
    block_matrices = {n for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("transformer.h.")}
    covered = {n for n, k in opt.assignment.items() if k == "symo"}
    assert block_matrices <= covered
    adamw = {n for n, k in opt.assignment.items() if k == "adamw"}
    expected_adamw = {n for n in dict(model.named_parameters()) if n not in block_matrices}
    if spec == "gpt_true":  # the true-symmetry spec also moves c_attn's and c_fc's biases
        expected_adamw -= {n for n in expected_adamw if n.endswith(("c_attn.bias", "c_fc.bias"))}
    assert adamw == expected_adamw
    assert "AdamW: transformer.wte.weight" in opt.describe()


def test_gpt_true_is_a_true_symmetry_and_gpt_muon_is_not():
    model = tiny_model()
    params = dict(model.named_parameters())
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]))
    tgt = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]))

    def loss(w):
        return functional_call(model, {**params, **w}, (idx, tgt))[1]

    d_head = TINY["n_embd"] // TINY["n_head"]
    true = symo.compile("gpt_true", model, sizes={"dqk{i}": d_head, "dvo{i}": d_head})
    assert symo.check_symmetry(loss, true, {n: params[n] for n in true.param_names}).is_true_symmetry
    relaxed = symo.compile("gpt_muon", model)
    assert not symo.check_symmetry(loss, relaxed, {n: params[n] for n in relaxed.param_names}).is_true_symmetry


@pytest.mark.parametrize("optimizer,spec", [("symo", "gpt_muon"), ("symo", "gpt_true"), ("muon", None),
                                            ("adamw", None)])
def test_one_step_lowers_the_loss(optimizer, spec):
    model = tiny_model(torch.float32)
    cfg = TrainConfig(optimizer=optimizer, spec=spec or "gpt_muon", n_layer=TINY["n_layer"], n_head=TINY["n_head"],
                      n_embd=TINY["n_embd"], lr=0.01 if optimizer != "adamw" else 1e-3, adamw_lr=1e-3)
    opt = build_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, TINY["vocab_size"], (4, TINY["block_size"]), generator=gen)
    y = torch.randint(0, TINY["vocab_size"], (4, TINY["block_size"]), generator=gen)
    before = model(x, y)[1]
    before.backward()
    opt.step()
    with torch.no_grad():
        after = model(x, y)[1]
    assert after < before - 1e-3, (float(before), float(after))


def test_muon_equals_reference_muon_and_torch_adamw():
    torch.manual_seed(0)
    ours = GPT(GPTConfig(**TINY))
    ref = GPT(GPTConfig(**TINY))
    ref.load_state_dict(ours.state_dict())
    opt = Muon(ours.named_parameters(), lr=0.02, adamw_lr=1e-3, weight_decay=0.1)
    hidden = {n for n, k in opt.assignment.items() if k == "muon"}
    assert hidden == {n for n, p in ours.named_parameters() if p.ndim == 2 and n.startswith("transformer.h.")}
    named = dict(ref.named_parameters())
    ref_muon = ReferenceMuon([named[n] for n in sorted(hidden)], lr=0.02, weight_decay=0.1)
    ref_adam = torch.optim.AdamW([p for n, p in named.items() if n not in hidden], lr=1e-3, betas=(0.9, 0.95),
                                 weight_decay=0.0, foreach=False)
    for _ in range(3):
        x = torch.randint(0, TINY["vocab_size"], (4, TINY["block_size"]))
        for model, opts in ((ours, [opt]), (ref, [ref_muon, ref_adam])):
            for o in opts:
                o.zero_grad()
            model(x, x.roll(1, 1))[1].backward()
            for o in opts:
                o.step()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=n)


def test_ns_method_reaches_the_optimizer_and_the_command_line(monkeypatch):
    import symo.train
    from symo.cli import main

    model = tiny_model(torch.float32)
    for method in ("iterate", "spectral"):
        cfg = TrainConfig(n_layer=TINY["n_layer"], n_head=TINY["n_head"], n_embd=TINY["n_embd"], ns_method=method)
        assert build_optimizer(model, cfg).config.ns_method == method
    with pytest.raises(ValueError, match=r"^ns_method must be one of 'auto', 'iterate', 'spectral'; got 'svd'$"):
        build_optimizer(model, TrainConfig(n_layer=TINY["n_layer"], n_head=TINY["n_head"], n_embd=TINY["n_embd"],
                                           ns_method="svd"))
    seen = []

    class Stop(Exception):
        pass

    def fake_train(cfg, **hooks):  # hooks: the command line's observer
        seen.append(cfg.ns_method)
        raise Stop

    monkeypatch.setattr(symo.train, "train", fake_train)
    for argv, expected in ((["train", "--ns-method", "iterate"], "iterate"), (["train"], "auto")):
        assert main(argv) == 1 and seen[-1] == expected  # Stop is reported as an error, after the config
    with pytest.raises(SystemExit):
        main(["train", "--ns-method", "svd"])
