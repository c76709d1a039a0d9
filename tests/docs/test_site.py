"""The docs site builds with ``--strict`` (no broken link, no missing page), every page
under docs/ is in the navigation, and a built page loads nothing from another host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.docs.conftest import ROOT, BuiltSite

pytestmark = pytest.mark.timeout(300)

GENERATED = {"reference/cli.md", "reference/config.md", "reference/api.md", "benchmarks.md"}
"""Pages scripts/gen_ref_pages.py writes at build time (not files under docs/)."""


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def test_the_site_builds_strict(built_site: BuiltSite) -> None:
    assert built_site.returncode == 0, built_site.output
    assert (built_site.path / "index.html").is_file()
    for page in GENERATED:
        assert "404" not in built_site.page(page)[:200], page


def test_every_page_under_docs_is_in_the_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    sources = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    missing = sorted(sources - set(nav))
    assert not missing, f"pages under docs/ not in mkdocs.yml's nav (add one line each): {missing}"
    unknown = sorted(set(nav) - sources - GENERATED)
    assert not unknown, f"nav entries with no page: {unknown}"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def test_no_page_fetches_from_another_host_at_view_time(built_site: BuiltSite) -> None:
    remote = re.compile(
        r"""<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)=["']?(?:https?:)?//"""
    )
    offenders = []
    for html in built_site.path.rglob("*.html"):
        text = html.read_text()
        offenders += [
            f"{html.relative_to(built_site.path)}: {m.group(0)}" for m in remote.finditer(text)
        ]
        assert "fonts.googleapis" not in text and "unpkg.com" not in text, html
    assert not offenders, offenders[:5]
    assert list(built_site.path.rglob("assets/javascripts/bundle*.js")), "Material's JS is bundled"


def test_the_architecture_page_draws_the_data_path(built_site: BuiltSite) -> None:
    html = built_site.page("architecture.md")
    assert 'src="../img/data-path.svg"' in html
    svg = (built_site.path / "img" / "data-path.svg").read_text()
    for part in (
        "env + tools",
        "EpisodeRunner",
        "EpisodeStore",
        "TrajectoryQueue",
        "Trainer",
        "WeightPublisher",
        "vLLM engine",
    ):
        assert part in svg, part
    assert "The layer map" in html and "import-linter" in html


def test_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_no_dated_notes_in_the_readme_or_docs() -> None:
    stamp = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    dated = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if stamp.search(line)
    ]
    assert not dated, "dates belong in benchmarks/results/*.json:\n" + "\n".join(dated)


def test_benchmarks_page_names_the_machine_commit_and_date_of_every_result(
    built_site: BuiltSite,
) -> None:
    html = built_site.page("benchmarks.md")
    import json

    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        assert f"benchmarks/results/{path.name}" in html, path.name
        commit = result["machine"].get("agentrl_commit")
        assert commit and f"<code>{commit}</code>" in html, path.name
        assert str(result["when"]) in html, path.name


def test_make_bench_writes_the_same_benchmarks_page() -> None:
    from benchmarks.docs_page import page

    assert (ROOT / "benchmarks" / "results" / "report.md").read_text() == page(), (
        "benchmarks/results/report.md is stale: python benchmarks/docs_page.py "
        "--write benchmarks/results/report.md"
    )


def test_docs_images_exist() -> None:
    for md in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md.read_text()):
            assert (md.parent / target).is_file() or Path(target).is_absolute(), (md, target)


def test_the_readme_config_loads(tmp_path: Path) -> None:
    from agentrl.config import RunConfig

    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "the README shows its training config"
    (tmp_path / "add.toml").write_text(blocks[0])
    config = RunConfig.load(tmp_path / "add.toml")
    assert config.env.id == "me/Add-v0"
    assert list(config.env.imports) == ["my_env.py"]
    assert config.train.steps == 16
