"""Packaging: the wheel holds the compiler as symo.compiler and the bundled specs as symo.specs, and an
installed copy resolves specs by name from any folder; `import symo` gives `symo.models`; the README
links only to files inside the repository.

The wheel is built from a copy of the sources (no build isolation: nothing is downloaded) and
installed into a fresh virtual environment that sees the test environment's site-packages (torch,
sympy, ...) as plain paths, where no symo is importable, so the import can only come from the wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import symo

REPO = Path(__file__).resolve().parents[1]
SPECS = sorted(p.name for p in (REPO / "specs").glob("*.toml"))


def run(args: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for item in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / item, src / item)
    for folder in ("symo", "compiler", "specs"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                 "-w", out, src])
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("symo-*.whl")
    return path


def test_wheel_contents(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n.removeprefix("symo/specs/") for n in names if n.startswith("symo/specs/") and
                  n.endswith(".toml")) == SPECS
    assert "symo/specs/gpt_muon.toml" in names and "symo/specs/gpt2_conv1d.toml" in names
    compiler_files = sorted(p.name for p in (REPO / "compiler").glob("*.py"))
    assert sorted(n.removeprefix("symo/compiler/") for n in names if n.startswith("symo/compiler/")) == compiler_files
    assert not [n for n in names if n.startswith(("compiler/", "specs/", "tests/", "benchmarks/"))]
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"symo"}


def test_installed_wheel_works_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", env_dir]).returncode == 0
    python = env_dir / "bin" / "python"
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # install = unpack into site-packages (pip from the outer environment, targeting the new one)
    installed = run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", site,
                     wheel])
    assert installed.returncode == 0, installed.stderr
    # the dependencies (torch, sympy, ...) come from the environment running the tests, which is not
    # the system one under scripts/setup.sh: a plain path line puts its site-packages on sys.path
    # without running its .pth files, so the editable symo install there stays invisible
    import sysconfig

    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "outer_environment.pth").write_text("".join(f"{p}\n" for p in sorted(outer)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SYMO_CACHE_DIR"] = str(tmp_path / "cache")
    script = (
        "import symo, symo.train.models, symo.compiler, importlib.util\n"
        f"assert symo.__file__.startswith({site!r}), symo.__file__\n"
        "assert importlib.util.find_spec('compiler') is None  # no generic top-level package\n"
        "spec = symo.load_spec('gpt_muon')\n"
        "c = symo.compile('gpt_muon', symo.models.gpt_small())\n"
        "opt = symo.Symo(symo.models.mlp_tanh().named_parameters(), 'mlp_tanh')\n"
        "print(spec.name, '|', len(c.blocks), '|', len(opt.compiled.blocks))\n"
        "import symo.cli\n"  # the CLI by bundled name, in the same interpreter (one torch import)
        "assert symo.cli.main(['compile', 'gpt_muon', '--model', 'symo.train.models:gpt_small',\n"
        "                      '--no-disk-cache']) == 0\n"
    )
    ran = run([python, "-c", script], cwd=elsewhere, env=env)
    assert ran.returncode == 0, ran.stderr
    first, _, report = ran.stdout.partition("\n")
    assert "Muon-style" in report and "isotypic blocks" in report
    name, blocks, mlp_blocks = (x.strip() for x in first.split("|"))
    assert name == symo.load_spec("gpt_muon").name
    assert int(blocks) == len(symo.compile("gpt_muon", symo.models.gpt_small(), disk_cache=False).blocks)
    assert int(mlp_blocks) == len(symo.compile("mlp_tanh", symo.models.mlp_tanh(), disk_cache=False).blocks)


def test_bundled_names_resolve_and_paths_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from symo.compiler.parse import bundled_specs, resolve_spec_path

    bundled = bundled_specs()
    assert sorted(f"{k}.toml" for k in bundled) == SPECS
    monkeypatch.chdir(tmp_path)
    assert symo.load_spec("gpt_muon").name == symo.load_spec("gpt_muon.toml").name
    assert resolve_spec_path("gpt_muon") == bundled["gpt_muon"]
    (tmp_path / "gpt_muon").write_text('name = "mine"\n[params]\nw = ["_"]\n')
    assert symo.load_spec("gpt_muon").name == "mine"  # an existing path wins over a bundled name
    with pytest.raises(symo.SpecError, match="bundled spec"):
        symo.load_spec("no_such_spec")
    model = symo.models.mlp_tanh()
    assert symo.Symo(model.named_parameters(), "mlp_tanh").compiled.name == "tanh MLP"


def test_import_symo_exposes_models_and_version() -> None:
    assert symo.models.gpt_small is not None and symo.models.MLP is not None
    assert re.fullmatch(r"\d+\.\d+\.\d+", symo.__version__)
    text = (REPO / "pyproject.toml").read_text()
    assert f'version = "{symo.__version__}"' in text


def test_readme_links_stay_inside_the_repository() -> None:
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert "../shared" not in text and "MATH.md" not in text, doc
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            assert not target.startswith(("http:", "https:", "/")), (doc, target)
            resolved = (doc.parent / target).resolve()
            assert resolved.is_relative_to(REPO.resolve()), (doc, target)  # e.g. docs/ -> ../benchmarks is fine
            assert resolved.exists(), (doc, target)
    readme = (REPO / "README.md").read_text()
    assert "docs/theory.md" in readme and "docs/specs.md" in readme
