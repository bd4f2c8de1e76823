"""The docs site stays true to the code and whole: docs/reference/ is what docs/gen_reference.py writes from the
parsers and the launcher table, and mkdocs.yml's nav and the pages under docs/ are the same set."""

import importlib.util
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
GENERATOR = DOCS / "gen_reference.py"


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = load_generator()


class _MkDocsLoader(yaml.SafeLoader):
    """mkdocs.yml names Python objects (`!!python/name:` for the mermaid fence); the nav needs none of them."""


_MkDocsLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


NAV = nav_pages(yaml.load((REPO / "mkdocs.yml").read_text(), Loader=_MkDocsLoader)["nav"])
ON_DISK = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    GEN.write(out)
    return out


@pytest.mark.parametrize("name", list(GEN.PAGES))
def test_committed_reference_is_what_the_generator_writes(regenerated, name):
    committed = DOCS / "reference" / name
    assert committed.is_file(), f"docs/reference/{name} is missing: run python docs/gen_reference.py"
    assert committed.read_text() == (regenerated / name).read_text(), (
        f"docs/reference/{name} differs from the code: run python docs/gen_reference.py"
    )


def test_reference_folder_holds_only_generated_pages():
    extra = {p.name for p in (DOCS / "reference").iterdir()} - set(GEN.PAGES)
    assert not extra, f"docs/reference/ holds {sorted(extra)}, which docs/gen_reference.py does not write"


@pytest.mark.parametrize("page", NAV)
def test_every_nav_page_exists(page):
    assert (DOCS / page).is_file(), f"mkdocs.yml's nav names {page}, which is not under docs/"


@pytest.mark.parametrize("page", ON_DISK)
def test_every_docs_page_is_in_the_nav(page):
    assert page in NAV, f"docs/{page} is not in mkdocs.yml's nav"


def test_nav_names_each_page_once():
    twice = sorted({p for p in NAV if NAV.count(p) > 1})
    assert not twice, f"pages named twice in mkdocs.yml's nav: {twice}"


@pytest.mark.parametrize(
    ("page", "must_contain"),
    [
        ("cli.md", "## rlrig doctor"),
        ("cli.md", "`--train-size` `TRAIN_SIZE` | `2048`"),
        ("cli.md", "`--base` `BASE`"),
        ("launchers.md", "| `indexed-job` |"),
        ("launchers.md", "| `local` | nothing |"),
    ],
)
def test_reference_shows_what_the_code_has(regenerated, page, must_contain):
    assert must_contain in (regenerated / page).read_text()
