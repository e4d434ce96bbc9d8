"""benchmarks/nanogpt_compare.py --quick: the outputs, the command written at the top of the md, and a
second invocation that rebuilds the same report from the run cache without training."""

import json

from benchmarks import nanogpt_compare as ng


def test_quick_mode_writes_the_outputs_and_a_second_run_trains_nothing(tmp_path):
    ng.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    for name in ("nanogpt_compare.md", "nanogpt_compare.json", "nanogpt_compare_runs.json"):
        assert (tmp_path / name).exists(), name
    md = (tmp_path / "nanogpt_compare.md").read_text()
    runs = 3 * len(ng.VARIANTS)  # every optimizer: 2 grid rates + 1 more seed
    assert md.splitlines()[2].startswith(f"Command: `python -m benchmarks.nanogpt_compare --quick` ({runs} runs")
    cache = json.loads((tmp_path / "nanogpt_compare_runs.json").read_text())
    assert len(cache) == runs + 1  # and the timing
    ng.main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "nanogpt_compare_runs.json").read_text()) == cache
    assert (tmp_path / "nanogpt_compare.md").read_text() == md
