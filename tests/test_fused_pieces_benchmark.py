"""benchmarks/fused_pieces.py: its committed report follows from its committed run cache, without training."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks import fused_pieces

RESULTS = Path(fused_pieces.__file__).resolve().parent / "results"


def test_report_is_rebuilt_from_the_run_cache(tmp_path: Path) -> None:
    shutil.copy(RESULTS / "fused_pieces_runs.json", tmp_path / "fused_pieces_runs.json")
    before = (tmp_path / "fused_pieces_runs.json").read_text()
    assert fused_pieces.main(["--out", str(tmp_path), "--workers", "1"]) == 0
    assert (tmp_path / "fused_pieces_runs.json").read_text() == before  # nothing was trained
    assert (tmp_path / "fused_pieces.md").read_text() == (RESULTS / "fused_pieces.md").read_text()
