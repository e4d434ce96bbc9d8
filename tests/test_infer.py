"""symo.infer_spec: inferred specs against hand-written ones, numeric truth, and deliberately broken models.

Oracles: the bundled hand specs (mlp_tanh, mlp_relu, gpt, gpt_muon), hand specs written here from the
published architectures (Hugging Face GPT-2's Conv1D layout, torchvision's ResNet-18), the existing
`symo.check_symmetry` (dense group matrices through `CompiledSpec.act`, independent of the inference's
own index-based action), and closed-form reasons a symmetry must break (a fixed buffer, rotary cos/sin).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from cases import HF_GPT2_SPEC, MLP_SPEC
from helpers import assert_all_true, assert_covers, assignment, independent_check
from symo.compiler import bind, load_spec, parse_spec
from symo.compiler.parse import bundled_specs
from torch import nn
from torch.nn import functional as F

import symo
from symo.infer import check_spec, infer, infer_spec
from symo.infer.verify import act, element_matrices, sample_element
from symo.train.models import GPT, MLP, GPTConfig
from symo.train.models_resnet import resnet_tiny

pytestmark = pytest.mark.usefixtures("one_thread_module")  # tiny float64 work: one torch thread


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11))


# ---------------------------------------------------------------- serialisation


@pytest.mark.parametrize("name", sorted(bundled_specs()))
def test_to_toml_round_trips_every_bundled_spec(name):
    spec = load_spec(name)
    again = parse_spec(spec.to_toml(header="a comment\nover two lines"), source=spec.source)
    assert again == spec


def test_inferred_toml_round_trips_and_compiles():
    model = tiny_gpt()
    spec = infer_spec(model)
    text = spec.to_toml()
    again = parse_spec(text)
    assert dataclasses.replace(again, source=spec.source) == spec
    assert "{i}" in text  # repeated blocks are folded into patterns
    assert len(text.splitlines()) < 30
    symo.compile(again, model, disk_cache=False)


# ---------------------------------------------------------------- the zoo


@pytest.mark.parametrize("act_name, hand, group", [("tanh", "mlp_tanh", "signed_perm"), ("relu", "mlp_relu", "perm"),
                                                   ("gelu", "mlp_relu", "perm")])
def test_mlp_matches_the_hand_spec(act_name, hand, group):
    torch.manual_seed(0)
    model = MLP((8, 16, 16, 4), act=act_name)
    result = infer(model)
    assert_all_true(result)
    assert {s.group for s in result.spaces} == {group}
    assert_covers(load_spec(hand), result.spec, model, same_group=["h1", "h2"] if act_name != "gelu" else None)
    assert list(result.uncovered) == ["fc3.bias"]  # nothing moves it: the hand spec writes it all-free
    assert independent_check(model, result.spec, (torch.randn(3, 8, dtype=torch.float64),)).is_true_symmetry


def test_gpt_covers_the_per_head_hand_spec():
    model = tiny_gpt()
    result = infer(model)
    assert_all_true(result)
    rename, bound = assert_covers(load_spec("gpt"), result.spec, model, hand_sizes={"dqk{i}": 8, "dvo{i}": 8},
                                  same_group=["dqk0", "dvo0", "dqk1", "dvo1"])
    # the hand spec keeps heads in place (identity owners): inferred, they are permuted as wholes (a larger group)
    assert [bound.spaces[next(iter(rename[h]))].group for h in ("head0", "head1")] == ["perm", "perm"]
    # the hand spec's MLP space is a relaxed signed_perm (GELU is not odd): the inferred one is the true perm
    assert bound.spaces[next(iter(rename["mlp0"]))].group == "perm"
    # beyond the hand spec: the residual stream is one perm space shared by every block (LayerNorm)
    res = [s for s in result.spaces if s.name == "res"]
    assert res and res[0].group == "perm" and "transformer.wte.weight" in res[0].params
    assert result.covered_params == result.total_params
    ids = torch.randint(0, 11, (2, 8))
    assert independent_check(model, result.spec, (ids,)).is_true_symmetry


def test_muon_relaxation_is_the_bundled_muon_spec():
    model = tiny_gpt()
    result = infer(model, relax="muon")
    assert all(s.status == "relaxed" for s in result.spaces)
    assert_covers(load_spec("gpt_muon"), result.spec, model, same_group=["attn0", "aproj0", "fc0", "mproj0"])
    assert sorted(symo.compile(result.spec, model, disk_cache=False).param_names) == \
        sorted(symo.compile("gpt_muon", model, disk_cache=False).param_names)


def test_muon_pieces_relaxation_is_the_bundled_qkv_spec():
    """c_attn is split into query, key and value in the trace: the relaxation with pieces gives each its own
    block, as the hand-written gpt_muon_qkv does (symo train's default spec), and the same steps follow."""
    model = tiny_gpt()
    result = infer(model, relax="muon_pieces")
    assert all(s.status in ("relaxed", "identity") for s in result.spaces)
    assert [s.size for s in result.spaces if s.group == "identity"] == [3, 3]  # one piece count per layer
    assert_covers(load_spec("gpt_muon_qkv"), result.spec, model,
                  same_group=["qkv0", "attn0", "aproj0", "fc0", "mproj0"])
    inferred = symo.compile(result.spec, model, disk_cache=False)
    hand = symo.compile("gpt_muon_qkv", model, disk_cache=False)
    assert sorted(inferred.param_names) == sorted(hand.param_names)
    assert sorted((b.batch, b.mult, b.width) for b in inferred.blocks) == \
        sorted((b.batch, b.mult, b.width) for b in hand.blocks)
    weights = []
    for spec in (result.spec, "gpt_muon_qkv"):
        twin = tiny_gpt()
        opt = symo.Symo(twin, spec, preset="soap_muon", lr=0.02)
        for step in range(3):
            twin.zero_grad()
            torch.manual_seed(step)
            twin(torch.randint(0, 11, (2, 8)))[0].pow(2).mean().backward()
            opt.step()
        weights.append(twin.transformer.h[0].attn.c_attn.weight.detach().clone())
    assert not torch.equal(weights[0], tiny_gpt().transformer.h[0].attn.c_attn.weight.detach())
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=1e-6)


class FusedGatedMLP(nn.Module):
    """A gated MLP with its gate and up projections in one Linear, and grouped-query attention's uneven q, k, v:
    fused matrices whose pieces are equal (gate, up) and unequal (q 16 rows, k and v 8 each)."""

    def __init__(self, d: int = 16, hidden: int = 24):
        super().__init__()
        self.embed = nn.Embedding(11, d)
        self.qkv = nn.Linear(d, 32, bias=False)
        self.o = nn.Linear(16, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.head = nn.Linear(d, 11, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([16, 8, 8], dim=-1)
        q = q.view(b, t, 2, 8).transpose(1, 2)  # two query heads share one key and value head
        scores = (q @ k.unsqueeze(1).transpose(-1, -2)).softmax(-1)
        x = x + self.o((scores @ v.unsqueeze(1)).transpose(1, 2).reshape(b, t, 16))
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.head(x + self.down(F.silu(gate) * up))


def test_muon_pieces_relaxation_splits_fused_matrices_into_their_pieces():
    model = FusedGatedMLP()
    ids = torch.randint(0, 11, (2, 5))
    whole = symo.compile(infer(model, ids, relax="muon").spec, model, disk_cache=False)
    assert sorted((b.params[0], b.batch, b.mult, b.width) for b in whole.blocks) == [
        ("down.weight", 1, 24, 16), ("gate_up.weight", 1, 16, 48), ("o.weight", 1, 16, 16), ("qkv.weight", 1, 16, 32)]
    spec = infer(model, ids, relax="muon_pieces").spec
    compiled = symo.compile(spec, model, disk_cache=False)
    shapes = {}
    for b in compiled.blocks:
        (name,) = b.params
        shapes.setdefault(name, []).append((b.batch, b.mult, b.width))
    # every piece a block of its own: its rows (mult) x the matrix's input width
    assert sorted(shapes["gate_up.weight"]) == [(2, 16, 24)]
    assert sorted(shapes["qkv.weight"]) == [(1, 16, 8), (1, 16, 8), (1, 16, 16)]
    assert shapes["o.weight"] == [(1, 16, 16)] and shapes["down.weight"] == [(1, 24, 16)]
    text = spec.to_toml()
    assert '"gate_up_pieces" = { group = "identity", size = 2 }' in text
    assert "piece1" in text and "piece3" in text


def test_hugging_face_gpt2_conv1d_layout():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=13, n_positions=8, bos_token_id=0,
                                  eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)  # random init, train mode: dropout is taken as the identity
    result = infer(model)
    assert_all_true(result)
    hand = parse_spec(HF_GPT2_SPEC)
    rename, bound = assert_covers(hand, result.spec, model, same_group=[f"{s}{i}" for s in ("dqk", "dvo", "mlp")
                                                                        for i in (0, 1)] + ["res"])
    # the hand spec keeps heads in place; inferred, they are permuted as wholes
    assert {bound.spaces[next(iter(rename[h]))].group for h in ("head0", "head1")} == {"perm"}
    assert result.covered_params == result.total_params
    muon = infer(model, relax="muon").spec.to_toml()
    assert '"transformer.h.{i}.attn.c_attn.weight" = ["_", ' in muon  # Conv1D rows are the second axis
    ids = torch.randint(0, 13, (2, 6))
    model.eval()
    assert independent_check(model, result.spec, (ids,)).is_true_symmetry


RESNET_SPEC = """
[spaces]
s1 = "perm"
s2 = "perm"
s3 = "perm"
s4 = "perm"
"b{n}_{i}" = "perm"
[params]
"conv1.weight" = ["s1", "_", "_", "_"]
"bn1.{w}" = ["s1"]
"layer1.{i}.conv1.weight" = ["b1_{i}", "s1", "_", "_"]
"layer1.{i}.conv2.weight" = ["s1", "b1_{i}", "_", "_"]
"layer1.{i}.bn1.{w}" = ["b1_{i}"]
"layer1.{i}.bn2.{w}" = ["s1"]
"layer2.0.conv1.weight" = ["b2_0", "s1", "_", "_"]
"layer2.1.conv1.weight" = ["b2_1", "s2", "_", "_"]
"layer2.{i}.conv2.weight" = ["s2", "b2_{i}", "_", "_"]
"layer2.{i}.bn1.{w}" = ["b2_{i}"]
"layer2.{i}.bn2.{w}" = ["s2"]
"layer2.0.downsample.0.weight" = ["s2", "s1", "_", "_"]
"layer2.0.downsample.1.{w}" = ["s2"]
"fc.weight" = ["_", "s2"]
"""


def test_resnet_torchvision_layout():
    torch.manual_seed(0)
    model = resnet_tiny()
    result = infer(model)
    assert_all_true(result)
    assert {s.group for s in result.spaces} == {"perm"}  # BatchNorm gains and ReLU
    assert len(result.spaces) == 12  # 4 stage streams + 8 block-internal spaces
    assert list(result.uncovered) == ["fc.bias"]
    # the first two stages written by hand (the later ones repeat the pattern)
    sub = nn.Module()
    for name in ("conv1", "bn1", "layer1", "layer2"):
        setattr(sub, name, getattr(model, name))
    sub.fc = nn.Linear(8, 10)
    hand = parse_spec(RESNET_SPEC)
    h, _ = assignment(hand, sub)
    i, _ = assignment(result.spec, model)
    pairs = {}
    for key, space in h.items():
        if not key[0].startswith("fc."):
            pairs.setdefault(space, set()).add(i[key])
    assert all(len(v) == 1 for v in pairs.values()) and len({next(iter(v)) for v in pairs.values()}) == len(pairs)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    assert independent_check(model, result.spec, (x,)).is_true_symmetry


def test_torchvision_resnet18_same_names_and_inference():
    tv = pytest.importorskip("torchvision")
    ours = symo.train.models_resnet.resnet18()
    theirs = tv.models.resnet18(weights=None)
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
    result = infer(theirs, torch.randn(2, 3, 32, 32))
    assert_all_true(result)
    assert infer(ours).spec == result.spec


# ------------------------------------------- the action (models broken on purpose: test_infer_broken.py)


def test_index_action_matches_dense_group_matrices():
    """The verifier's gather/sign action equals CompiledSpec.act with the same element as matrices."""
    model = tiny_gpt()
    spec = infer_spec(model)
    compiled = symo.compile(spec, model, disk_cache=False)
    bound = bind(spec, symo.compiler.shapes_of(model))
    gen = torch.Generator().manual_seed(3)
    spaces = {n: (sp.group, sp.size, bound.spaces[sp.per].size if sp.per else 1) for n, sp in bound.spaces.items()}
    spaces["c_fc0"] = ("signed_perm",) + spaces["c_fc0"][1:]  # exercise sign flips too
    element = sample_element(spaces, gen)
    w = {n: torch.randn(p.shape, dtype=torch.float64) for n, p in model.named_parameters()}
    dense = element_matrices(element)
    dense.update({n: torch.eye(sp.size, dtype=torch.float64).expand(spaces[n][2], -1, -1)
                  for n, sp in bound.spaces.items() if n not in element})
    ours, ref = act(bound, element, w), compiled.act(dense, w)
    for n in w:
        torch.testing.assert_close(ours[n], ref[n], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_in_place_action_matches_dense_matrices_across_successive_elements(dtype):
    """The check's in-place workspace (A_g w written from the originals, tensors put back when the next element
    leaves them alone) equals CompiledSpec.act with dense matrices on fresh float64 copies, element after element
    on different sets of spaces, and never writes the model's own parameters (a float64 model shares dtype)."""
    from symo.infer.verify import Workspace, act_in_place

    model = tiny_gpt().to(dtype)
    spec = infer_spec(model)
    compiled = symo.compile(spec, model, disk_cache=False)
    bound = bind(spec, symo.compiler.shapes_of(model))
    originals = {n: p.detach().clone() for n, p in model.named_parameters()}
    w = {n: t.to(torch.float64) for n, t in originals.items()}
    ws = Workspace({n: p.detach() for n, p in model.named_parameters()})
    spaces = {n: (sp.group, sp.size, bound.spaces[sp.per].size if sp.per else 1) for n, sp in bound.spaces.items()}
    spaces["c_fc0"] = ("signed_perm",) + spaces["c_fc0"][1:]  # exercise sign flips too
    names = sorted(spaces)
    gen = torch.Generator().manual_seed(5)
    for subset in (names, names[::2], names[1::2], ["c_fc0"], names):
        element = sample_element({n: spaces[n] for n in subset}, gen)
        dense = element_matrices(element)
        dense.update({n: torch.eye(sp.size, dtype=torch.float64).expand(spaces[n][2], -1, -1)
                      for n, sp in bound.spaces.items() if n not in element})
        ours, ref = act_in_place(bound, element, ws), compiled.act(dense, w)
        for n in w:
            assert ours[n].dtype == torch.float64
            torch.testing.assert_close(ours[n], ref[n], rtol=0, atol=1e-12)
    moved = sum(not torch.equal(ours[n], w[n]) for n in w)
    assert moved > 0
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), originals[n])


def test_cli_infer_writes_a_spec_and_check_reads_it(tmp_path, capsys):
    from symo.cli import main

    out = tmp_path / "mlp.toml"
    assert main(["infer", "--model", "symo.train.models:mlp_relu", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "isotypic blocks" in text and "true" in text
    assert load_spec(out).spaces[0].group == "perm"
    assert main(["check", str(out), "--model", "symo.train.models:mlp_relu"]) == 0
    assert "2 true, 0 relaxed" in capsys.readouterr().out
    assert main(["check", "mlp_tanh", "--model", "symo.train.models:mlp_relu"]) == 0
    assert "0 true, 2 relaxed" in capsys.readouterr().out


def test_cli_infer_muon_pieces_writes_the_bundled_qkv_spec(tmp_path, capsys):
    from symo.cli import main

    out = tmp_path / "gpt_pieces.toml"
    assert main(["infer", "--model", "symo.train.models:gpt_small", "--relax", "muon_pieces", "-o", str(out)]) == 0
    assert "use: training. This is the Muon-style relaxation with each piece of a fused matrix" in \
        capsys.readouterr().out
    model = symo.train.models.gpt_small()
    pieces = symo.compile(load_spec(out), model, disk_cache=False)
    hand = symo.compile("gpt_muon_qkv", model, disk_cache=False)
    assert sorted((b.params, b.batch, b.mult, b.width) for b in pieces.blocks) == \
        sorted((b.params, b.batch, b.mult, b.width) for b in hand.blocks)


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="relax must be None or one of \\['muon', 'muon_pieces'\\]"):
        infer(MLP(), relax="adam")
    with pytest.raises(TypeError, match="example_inputs"):
        infer(MLP(), example_inputs=3.0)
    assert math.isfinite(infer(MLP()).seconds["total"])


class SingleHead(nn.Module):
    """Attention on the full width: the graph shows no head split."""

    def __init__(self, d=8, vocab=11):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        y = F.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), is_causal=True)
        return self.head(x + self.o(y))


def test_heads_splits_attention_that_the_graph_shows_whole():
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (2, 5))
    whole = infer(SingleHead(), ids)
    assert_all_true(whole)
    qk = [s for s in whole.spaces if "q.weight" in s.params and "k.weight" in s.params and s.name != "res"]
    assert len(qk) == 1 and qk[0].group == "orthogonal" and qk[0].per is None and qk[0].size == 8
    split = infer(SingleHead(), ids, heads=2)
    assert_all_true(split)
    per = [s for s in split.spaces if s.per is not None]
    assert sorted((s.size, split.spaces[[x.name for x in split.spaces].index(s.per)].size) for s in per) == \
        [(4, 2), (4, 2)]  # dqk and dvo: O(4) per head, 2 heads


def test_inferred_spec_drives_the_optimizer():
    model = tiny_gpt()
    spec = infer_spec(model)
    opt = symo.Symo(model.named_parameters(), spec, lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 11, (2, 8))
    for _ in range(2):
        opt.zero_grad()
        model(ids, ids)[1].backward()
        opt.step()
    for n, p in model.named_parameters():
        assert torch.isfinite(p).all() and not torch.equal(p, before[n]), n


def test_hugging_face_llama_rotary_swiglu_rmsnorm():
    """LLaMA: RoPE drops the q/k gauge, SwiGLU's gate and up share one perm space, the RMSNorm gain makes
    the stream perm, and the float32 RMSNorm inside the float64 check sets its resolution."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=2, num_key_value_heads=2,
                                   num_hidden_layers=2, vocab_size=13, max_position_embeddings=8)
    model = transformers.LlamaForCausalLM(cfg)
    result = infer(model, {"input_ids": torch.randint(0, 13, (1, 6)), "use_cache": False})
    assert_all_true(result)
    assert 1e-9 < result.tolerance < 1e-4 and any("float32" in n for n in result.notes)
    groups = {s.name: (s.group, s.per) for s in result.spaces}
    assert groups["res"] == ("perm", None)
    assert groups["dvo0"] == ("orthogonal", "head0") and not any(n.startswith("dqk") for n in groups)
    mlp = [s for s in result.spaces if "model.layers.0.mlp.up_proj.weight" in s.params and s.name != "res"]
    assert len(mlp) == 1 and mlp[0].group == "perm" and "model.layers.0.mlp.gate_proj.weight" in mlp[0].params
    assert any("q_proj" in " ".join(d.params) and "rotary" in d.reason for d in result.dropped)


def test_sampled_elements_always_move_something():
    """Never the identity; a signed element flips a sign: a 2-unit ReLU layer declared signed_perm is
    relaxed for every seed (with plain random sampling, 1 in 16 double trials would call it true)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        el = sample_element({"p": ("perm", 2, 1), "s": ("signed_perm", 2, 3)}, gen)
        assert el["p"][1].tolist() == [[1, 0]]
        assert (el["s"][2] < 0).any(dim=1).all()
    model = MLP((3, 2, 3), act="relu")
    hand = parse_spec(MLP_SPEC % "signed_perm")
    x = torch.randn(16, 3)
    with torch.no_grad():
        model.fc1.bias.fill_(0.5)  # every unit active somewhere, so a sign flip is visible
    assert all(check_spec(hand, model, x, seed=s)[0].status == "relaxed" for s in range(5))


class TorchMHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Linear(3, 8), nn.Linear(8, 2)
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        h = torch.tanh(self.emb(x))
        return self.out(self.att(h, h, h, need_weights=False)[0])


def test_torch_multihead_attention_and_sequential_names():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3)
    model = TorchMHA()
    result = infer(model, x)
    assert_all_true(result)
    groups = {s.name: (s.group, s.per, s.size) for s in result.spaces}
    assert groups["dqk"] == ("orthogonal", "head", 4) and groups["dvo"] == ("orthogonal", "head", 4)
    assert groups["emb"] == ("signed_perm", None, 8)  # tanh before the attention
    assert "att.in_proj_weight" in result.spec.to_toml()
    assert independent_check(model, result.spec, (x.double(),)).is_true_symmetry
    seq = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    names = {s.name: s.group for s in infer(seq, torch.randn(3, 4)).spaces}
    assert names == {"h0": "signed_perm", "h2": "perm"}


class SlicedPositions(nn.Module):
    """Learned positions sliced to the input's length (`pos[:, :t]`, as many users write it): the slice pins
    the position axis, while the width axis keeps its space."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.pos = nn.Parameter(0.1 * torch.randn(1, 5, 6))
        self.fc = nn.Linear(6, 6)
        self.out = nn.Linear(6, 7)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos[:, :idx.shape[1]]
        return self.out(torch.tanh(self.fc(x)))


def test_report_does_not_call_a_covered_parameter_dropped():
    torch.manual_seed(0)
    result = infer(SlicedPositions(), (torch.randint(0, 7, (2, 4)),))
    assert "pos" in {r.pattern for r in result.spec.params} and "pos" not in result.uncovered
    assert any("pos" in d.params for d in result.dropped)  # a would-be space on its position axis
    line = next(x for x in result.report().splitlines() if x.startswith("dropped"))
    assert "still covered on other axes: pos" in line and "uncovered as a result" not in line
