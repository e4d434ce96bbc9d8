"""`symo train` under faults: a flipped bit in a checkpoint, two runs on one folder, a killed run's lock and
temporary files, an unwritable --out-dir, a checkpoint without its step, a full disk, a step too large
for the machine, and a second Ctrl-C during one long torch operation. Each case fails on a version
without its fix (it trained on from altered weights, both runs succeeded, the folder was found
unwritable at the first checkpoint, KeyError: 'step', torch's "enforce fail", a quarter of an hour at
5 GB, or no exit until the operation returned)."""

from __future__ import annotations

import errno
import io
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch

from symo import cli
from symo.train import TrainConfig, train
from symo.train import checkpoint as checkpoint_module
from symo.train.checkpoint import CheckpointError, save_checkpoint
from symo.train.data import load_corpus
from symo.train.rundir import RunFolderError

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(200))


def tiny(tmp_path: Path, **overrides) -> TrainConfig:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    base = dict(data=str(data), cache_dir=str(tmp_path / "cache"), out_dir=str(tmp_path / "run"), n_layer=1,
                n_head=2, n_embd=16, block_size=16, batch_size=4, steps=2, eval_interval=2, eval_batches=1,
                warmup=1, sample_chars=0, progress=False, threads=1, optimizer="adamw")
    return TrainConfig(**{**base, **overrides})


def flip_bit(path: Path, at: int, mask: int) -> str:
    """Flip bits `mask` of byte `at` inside the largest tensor record of a zip archive (torch.save's format),
    as a failing disk or copy would; returns the record's name."""
    with zipfile.ZipFile(path) as archive:
        record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    header = record.header_offset  # the record's bytes follow its local header: 30 bytes, the name, the extra field
    start = header + 30 + int.from_bytes(raw[header + 26:header + 28], "little") + \
        int.from_bytes(raw[header + 28:header + 30], "little")
    raw[start + at] ^= mask
    path.write_bytes(bytes(raw))
    return record.filename


def test_a_flipped_bit_in_a_tensor_record_is_refused_naming_the_file(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    train(cfg)
    ckpt = Path(cfg.out_dir) / "ckpt.pt"
    record = flip_bit(ckpt, 5, 0x10)  # in the largest tensor: the token embedding
    raw = ckpt.read_bytes()
    assert isinstance(torch.load(ckpt, weights_only=True), dict)  # torch alone loads it without a word
    with pytest.raises(CheckpointError, match="CRC-32") as err:
        train(tiny(tmp_path, resume=True, steps=4))
    assert str(ckpt) in str(err.value) and record in str(err.value)
    assert ckpt.read_bytes() == raw  # left as it was


def test_a_checkpoint_without_its_step_names_the_file(tmp_path: Path) -> None:
    cfg = tiny(tmp_path)
    train(cfg)
    ckpt = Path(cfg.out_dir) / "ckpt.pt"
    blob = torch.load(ckpt, weights_only=True)
    del blob["step"]
    save_checkpoint(ckpt, blob)
    with pytest.raises(CheckpointError, match="lacks 'step'") as err:
        train(tiny(tmp_path, resume=True, steps=4))
    assert str(ckpt) in str(err.value)


HOLDER = textwrap.dedent("""
    import sys, time
    from symo.train import TrainConfig, train
    def hold(step, row):
        print("holding", flush=True)
        time.sleep(120)
    cfg = TrainConfig(data=sys.argv[1], cache_dir=sys.argv[2], out_dir=sys.argv[3], n_layer=1, n_head=2, n_embd=16,
                      block_size=16, batch_size=4, steps=2, eval_interval=2, eval_batches=1, warmup=1,
                      sample_chars=0, progress=False, threads=1, optimizer="adamw")
    train(cfg, callback=hold)
""")


def test_a_run_folder_is_held_for_the_life_of_a_run(tmp_path: Path) -> None:
    """A run that is training holds its folder: a second run with the same --out-dir is refused at start,
    naming the folder and the holder. Killed with kill -9, it leaves its lock file (and here two temporary
    files, as a kill during a checkpoint write does): the next run takes the folder over and removes them."""
    cfg = tiny(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, cfg.data, cfg.cache_dir, cfg.out_dir],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding", holder.stderr.read()
        started = []
        with pytest.raises(RunFolderError, match="another symo train run is using this folder") as err:
            train(cfg, callback=lambda step, row: started.append(step))
        assert cfg.out_dir in str(err.value) and f"process {holder.pid}" in str(err.value) and started == []
        assert cli.main(["train", "--data", cfg.data, "--cache-dir", cfg.cache_dir, "--out-dir", cfg.out_dir,
                         "--optimizer", "adamw", "--steps", "1", "--no-progress"]) == 1
    finally:
        holder.kill()
        holder.wait()
    stale = [Path(cfg.out_dir) / f".ckpt.pt.tmp{holder.pid}", Path(cfg.out_dir) / f".log.csv.tmp{holder.pid}"]
    for path in stale:
        path.write_bytes(b"partial")
    result = train(cfg)
    assert result["steps"] == 2 and (Path(cfg.out_dir) / "ckpt.pt").is_file()
    assert not any(path.exists() for path in stale)


def test_an_unusable_out_dir_is_found_before_the_first_step(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    steps = []
    with pytest.raises(RunFolderError, match="cannot write in this folder") as err:
        train(tiny(tmp_path, out_dir=str(blocker / "run")), callback=lambda step, row: steps.append(step))
    assert str(blocker / "run") in str(err.value) and steps == []
    if os.name == "posix" and os.geteuid() != 0:  # permissions do not bind root
        locked = tmp_path / "read-only"
        locked.mkdir(mode=0o500)
        with pytest.raises(RunFolderError, match="cannot write in this folder"):
            train(tiny(tmp_path, out_dir=str(locked)), callback=lambda step, row: steps.append(step))
        assert steps == []


class FullDisk(io.RawIOBase):
    """A file whose writes fail with ENOSPC after `room` bytes, as on a full disk."""

    def __init__(self, path: Path, room: int) -> None:
        self.fh, self.room = open(path, "wb"), room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.fh.write(data)

    def fileno(self) -> int:
        return self.fh.fileno()

    def close(self) -> None:
        self.fh.close()
        super().close()


def test_a_full_disk_says_so_and_keeps_the_previous_checkpoint(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint_module, "open", lambda p, mode: FullDisk(Path(p), 600), raising=False)
    with pytest.raises(OSError, match="the disk is full") as err:
        save_checkpoint(path, {"step": 2, "w": torch.ones(10_000)})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert "previous one was kept" in str(err.value) and "enforce fail" not in str(err.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_a_step_too_large_for_the_machine_is_refused_with_its_estimate(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, block_size=10_000_000, batch_size=64)  # terabytes: larger than any machine
    with pytest.raises(ValueError, match=r"--block-size 10000000, --batch-size 64.* needs at least [\d.]+ GB") as err:
        train(cfg)
    assert "more than this machine's" in str(err.value)
    assert not Path(cfg.out_dir).exists()  # refused before the run folder is made


def test_a_spec_declaring_other_head_widths_is_refused_naming_the_fix(tmp_path: Path) -> None:
    """gpt.toml declares heads of 64; the run's are n_embd / n_head: another width is refused before the run
    folder is made, and the width it declares trains."""
    cfg = tiny(tmp_path, optimizer="symo", spec="gpt", n_embd=128, n_head=4)
    with pytest.raises(ValueError, match=r"--spec gpt: its per-head bases 'dqk\{i\}' \(64\), 'dvo\{i\}' \(64\) are "
                                         r"declared at another width than this run's heads, 32 \(--n-embd 128 / "
                                         r"--n-head 4\).*--spec gpt_true.* or --n-head 2"):
        train(cfg)
    assert not Path(cfg.out_dir).exists()
    assert math.isfinite(train(tiny(tmp_path, optimizer="symo", spec="gpt", n_embd=128, n_head=2))["final_val"])


def test_train_header_names_the_preset_and_resume_refuses_ignored_options(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    cfg = tiny(tmp_path)
    common = ["train", "--data", cfg.data, "--cache-dir", cfg.cache_dir, "--n-layer", "1", "--n-head", "2",
              "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--steps", "1", "--eval-batches", "1",
              "--sample-chars", "0", "--threads", "1", "--no-progress"]
    assert cli.main([*common, "--out-dir", str(tmp_path / "notebook"), "--spec", "gpt_true", "--preset",
                     "notebook"]) == 0
    assert "symo train: symo (preset notebook, lr 0.01, weight decay 0.05, spec gpt_true)" in capsys.readouterr().out
    assert cli.main([*common, "--out-dir", str(tmp_path / "adamw"), "--optimizer", "adamw"]) == 0
    assert "symo train: adamw (lr 0.004, weight decay 0)" in capsys.readouterr().out
    assert cli.main(["train", "--resume", str(tmp_path / "adamw"), "--spec", "gpt_true"]) == 2
    assert "--spec: not used by --optimizer adamw" in capsys.readouterr().err


LONG_OPERATION = textwrap.dedent("""
    import torch
    from symo.cli.train import ConsoleReport
    with ConsoleReport(show_bar=False):
        print("ready", flush=True)
        torch.futures.Future().wait()  # one torch call that does not return: no Python handler can run
""")


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT to a child process")
def test_a_second_ctrl_c_stops_at_once_during_a_long_torch_operation() -> None:
    child = subprocess.Popen([sys.executable, "-c", LONG_OPERATION], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        child.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert child.poll() is None  # the first Ctrl-C only asks to stop after the step
        child.send_signal(signal.SIGINT)
        status = child.wait(timeout=20)
    finally:
        child.kill()
    stderr = child.stderr.read()
    assert status == 130, stderr
    assert "stopping after the current step" in stderr and "second Ctrl-C: stopped at once" in stderr
    assert "no checkpoint had been written yet" in stderr  # no run started here


def test_a_flipped_bit_in_the_corpus_cache_is_rebuilt(tmp_path: Path) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    fresh = load_corpus(data, tmp_path / "cache")
    (entry,) = (tmp_path / "cache").glob("*.pt")
    flip_bit(entry, 7, 0x01)  # one character id changes
    assert not torch.equal(torch.load(entry, weights_only=True)["ids"].long(), fresh.ids)
    assert torch.equal(load_corpus(data, tmp_path / "cache").ids, fresh.ids)
