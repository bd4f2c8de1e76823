"""Every image a launch file names, on a line carrying one marker, so a user finds where to put their own and a
version bump cannot leave one behind: the registry's image is ghcr.io/rlrig/rlrig:<pyproject version>-<variant>,
the name the release workflow pushes; a local one is a tag docker/build.sh makes."""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
LAUNCH_DIRS = ["dstack", "skypilot", "slurm", "apptainer", "compose", "kubernetes"]
MARKER = "# rlrig-image: released tags or your own build (docs: Images)"
REGISTRY = "ghcr.io/rlrig/rlrig"
# enroot (pyxis) writes REGISTRY#IMAGE
REGISTRY_NAMES = {REGISTRY, REGISTRY.replace("/", "#", 1)}
LOCAL_NAMES = {"rlrig", "localhost/rlrig"}
# any image named rlrig, with whatever registry and path: a wrong one must be found to be refused
IMAGE = re.compile(r"(?P<name>(?:[a-z0-9][\w.-]*[/#])*\brlrig):(?P<tag>\w[\w.-]*)")
VERSION = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
# the case arms of docker/build.sh
VARIANTS = re.findall(r"^  (\w+)\)", (REPO / "docker/build.sh").read_text(), re.M)


def launch_files() -> list[Path]:
    return sorted(p for d in LAUNCH_DIRS for p in (REPO / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def problems(text: str, version: str) -> list[str]:
    """What is wrong with each image reference in a file's text: the marker missing, a registry or repository other
    than the released one, a version other than pyproject's, a variant build.sh does not make."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in IMAGE.finditer(line):
            name, tag = m["name"], m["tag"]
            ref = f"line {n}: {m[0]}"
            if MARKER not in line:
                found.append(f"{ref}: no `{MARKER}` on its line")
            if name in REGISTRY_NAMES:
                if tag not in {f"{version}-{v}" for v in VARIANTS}:
                    found.append(f"{ref}: not {REGISTRY}:{version}-{{{','.join(VARIANTS)}}}")
            elif name in LOCAL_NAMES:
                if tag not in VARIANTS and tag not in {f"{version}-{v}" for v in VARIANTS}:
                    found.append(f"{ref}: not a tag docker/build.sh makes")
            else:
                found.append(f"{ref}: not {REGISTRY}, the name the release pushes")
    return found


REFERENCES = {p: IMAGE.findall(p.read_text()) for p in launch_files()}


def test_build_sh_variants_are_read():
    assert VARIANTS == ["cpu", "cuda", "rocm"]


@pytest.mark.parametrize("directory", LAUNCH_DIRS)
def test_every_launch_directory_names_an_image(directory):
    """The pattern finds the references (none would make the next test pass vacuously)."""
    assert any(refs for p, refs in REFERENCES.items() if p.relative_to(REPO).parts[0] == directory)


@pytest.mark.parametrize("path", [p for p, refs in REFERENCES.items() if refs], ids=lambda p: str(p.relative_to(REPO)))
def test_every_image_reference_is_marked_and_current(path):
    assert problems(path.read_text(), VERSION) == []


def test_a_stale_or_unmarked_reference_is_caught():
    marked = f"image: ghcr.io/rlrig/rlrig:{VERSION}-cuda  {MARKER}"
    assert problems(marked, VERSION) == []
    assert problems(marked, "9.9.9") != []  # pyproject bumped, the file not
    assert problems(marked.replace("-cuda", "-cudaa"), VERSION) != []
    assert problems(marked.replace("ghcr.io/rlrig", "ghcr.io/someone"), VERSION) != []
    assert problems(f"image: ghcr.io/rlrig/rlrig:{VERSION}-cuda", VERSION) != []  # no marker
    assert problems(f"image=${{RLRIG_IMAGE:-ghcr.io#rlrig/rlrig:0.0.1-cuda}}  {MARKER}", VERSION) != []
    assert problems(f"  image: ${{RLRIG_IMAGE:-localhost/rlrig:cpu}}  {MARKER}", VERSION) == []


def test_the_release_pushes_the_name_the_launch_files_use():
    workflow = yaml.safe_load((REPO / ".github/workflows/release.yml").read_text())
    images = workflow["jobs"]["images"]
    assert images["strategy"]["matrix"]["variant"] == VARIANTS
    assert images["env"]["IMAGE"] == f"{REGISTRY}:${{{{ needs.version.outputs.version }}}}-${{{{ matrix.variant }}}}"
    steps = "\n".join(s.get("run", "") for s in images["steps"])
    assert 'docker/build.sh "$VARIANT" -t "$IMAGE"' in steps and 'docker push "$IMAGE"' in steps


def test_the_apptainer_image_label_is_the_version():
    assert re.search(r"org\.opencontainers\.image\.version (\S+)", (REPO / "apptainer/rlrig.def").read_text())[1] == (
        VERSION
    )
