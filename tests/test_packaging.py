"""Packaging: the wheel holds the compiler as symo.compiler and the bundled specs as symo.specs, and an
installed copy resolves specs by name from any folder; `import symo` gives `symo.models`; no tracked
file points outside the repository.

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


@pytest.mark.slow
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
    with pytest.warns(symo.compiler.SpecShadowWarning):  # an existing file wins over a bundled name, said so
        assert symo.load_spec("gpt_muon").name == "mine"
    with pytest.raises(symo.SpecError, match="bundled spec"):
        symo.load_spec("no_such_spec")
    model = symo.models.mlp_tanh()
    assert symo.Symo(model.named_parameters(), "mlp_tanh").compiled.name == "tanh MLP"


def test_import_symo_exposes_models_and_version() -> None:
    assert symo.models.gpt_small is not None and symo.models.MLP is not None
    assert re.fullmatch(r"\d+\.\d+\.\d+", symo.__version__)
    text = (REPO / "pyproject.toml").read_text()
    assert f'version = "{symo.__version__}"' in text


# References that point outside the repository: a private maths file, issue-tracker numbers, the folder
# beside the checkout. Tests cite publications instead (by title), and docs/ holds the maths.
OUTSIDE = re.compile(r"MATH\.md|\bissues? #?[0-9]+|\.\./shared", re.IGNORECASE)
# A path written in a text file: it starts at a top-level folder of the repository, or climbs with ../
# (a {md,json} alternation or a * stands for the files it names)
WRITTEN_PATH = re.compile(r"(?<![\w./-])((?:\.\./)*(?:docs|benchmarks|tests|symo|compiler|specs|scripts|\.ci)/"
                          r"(?:[\w./-]|\{[\w,.]+\}|\*)*(?:[\w*]|\{[\w,.]+\})|(?:\.\./)+[\w.-]+)")
# A markdown file named without its folder (e.g. theory.md) must be one of the repository's.
MD_NAME = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
# A placeholder in a written path (benchmarks/results/NAME.md) stands for any name.
PLACEHOLDER = re.compile(r"(^|/)NAME(\.|$)")
# Paths of files that no longer exist, written where a past measurement names them, each with why.
MOVED_PENDING = {
    "symo/optim.py": "the mutation results (benchmarks/results/mutation.*, docs/testing.md) were measured on the "
                     "optimizer when it was this one file, before the split into symo/optim/",
}


def _tracked_text_files() -> list[Path]:
    listing = run(["git", "-C", REPO, "ls-files", "-z"])
    if listing.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = []
    for name in listing.stdout.split("\0"):
        path = REPO / name
        if name and path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def _exists_in_repository(written: str, where: Path, installed_as: dict[str, str]) -> bool:
    """A written path resolves from the repository root or from its file's folder, and stays inside the
    repository; an installed package's path (symo/compiler/...) maps to its source folder (compiler/...)."""
    for prefix, source in installed_as.items():
        if written == prefix or written.startswith(prefix + "/"):
            written = source + written[len(prefix):]
    if PLACEHOLDER.search(written) or written in MOVED_PENDING:
        return True
    alternation = re.search(r"\{([\w,.]+)\}", written)
    if alternation:
        return all(_exists_in_repository(written.replace(alternation.group(0), choice, 1), where, {})
                   for choice in alternation.group(1).split(","))
    for base in (REPO, where.parent):
        resolved = (base / written).resolve()
        if resolved.is_relative_to(REPO.resolve()) and (resolved.exists() or any(base.glob(written))):
            return True
    # A generated output the repository ignores (a cache folder) is named but never committed.
    return any(subprocess.run(["git", "check-ignore", "-q", "--no-index", candidate], cwd=REPO).returncode == 0
               for candidate in (written, written.rstrip("/") + "/"))


def test_tracked_files_stay_inside_the_repository() -> None:
    """Every tracked text file: markdown links are relative and resolve to a file inside the repository,
    written paths (docs/theory.md, ../benchmarks/results) exist inside it, and nothing cites a private file or an
    issue number (this file holds the pattern it searches for, so only it may contain that)."""
    package_dir = re.search(r"\[tool\.setuptools\.package-dir\]\n((?:.+\n)+)", (REPO / "pyproject.toml").read_text())
    installed_as = {k.replace(".", "/"): v for k, v in re.findall(r'"([\w.]+)" = "([\w/]+)"', package_dir.group(1))}
    problems = []
    files = _tracked_text_files()
    md_names = {p.name for p in files if p.suffix == ".md"}
    for path in files:
        name = path.relative_to(REPO).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if path != Path(__file__).resolve():
            problems += [(name, m.group(0)) for m in OUTSIDE.finditer(text)]
            problems += [(name, md) for md in MD_NAME.findall(text)
                         if md not in md_names and not PLACEHOLDER.search(md)]
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http:", "https:", "/")):
                problems.append((name, target))
            elif path.suffix == ".md" and not _exists_in_repository(target, path, {}):
                problems.append((name, target))
        problems += [(name, w) for w in WRITTEN_PATH.findall(text) if not _exists_in_repository(w, path, installed_as)]
    assert not problems, "\n".join(map(str, problems))
    readme = (REPO / "README.md").read_text()
    assert "docs/theory.md" in readme and "docs/specs.md" in readme
