"""CI's documentation build (``.ci/docs``, run by ``.ci/run``) fails on any warning: run the same
script on a minimal copy of the site (the real ``mkdocs.yml`` with a two-page nav) that is clean,
then deliberately broken (a link to a missing page, a page outside the nav)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".ci" / "docs"

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings")


def _site(tmp_path: Path, index: str, extra_page: bool = False) -> Path:
    """A copy of the project's mkdocs.yml (theme, plugins, strict validation) whose nav is
    index.md and getting-started.md, with ``index`` as the home page."""
    cfg = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    cfg["nav"] = [{"Home": "index.md"}, {"Getting started": "getting-started.md"}]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(index)
    (docs / "getting-started.md").write_text("# Getting started\n\nText.\n")
    if extra_page:
        (docs / "orphan.md").write_text("# Not in the nav\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return tmp_path / "mkdocs.yml"


def _build(config: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(SCRIPT), str(config), str(config.parent / "site")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=config.parent)


def test_ci_runs_the_docs_script_without_quiet():
    ci = (REPO / ".ci" / "run").read_text()
    assert ".ci/docs mkdocs.yml" in ci
    assert "mkdocs build" not in ci.replace("# ", "")  # the one command lives in .ci/docs
    assert "--quiet" not in SCRIPT.read_text().split("set -uo pipefail", 1)[1]


def test_clean_copy_builds(tmp_path):
    out = _build(_site(tmp_path, "# Home\n\nSee [getting started](getting-started.md).\n"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("broken, extra, says", [
    ("# Home\n\nSee [a page](missing-page.md).\n", False, "missing-page.md"),
    ("# Home\n\nSee [getting started](getting-started.md#no-such-anchor).\n", False, "no-such-anchor"),
    ("# Home\n\nText.\n", True, "orphan.md"),
], ids=["broken-link", "broken-anchor", "page-outside-nav"])
def test_a_broken_copy_fails_the_build(tmp_path, broken, extra, says):
    out = _build(_site(tmp_path, broken, extra_page=extra))
    assert out.returncode != 0, out.stdout + out.stderr
    assert says in out.stdout + out.stderr and "warning" in out.stderr.lower(), out.stderr


def test_a_warning_strict_mode_does_not_count_fails_too(tmp_path):
    """A warning line printed outside MkDocs' counter (here by a hook, straight to stderr: strict
    mode does not count it and mkdocs exits 0) still fails: the script reads the output."""
    cfg = _site(tmp_path, "# Home\n\nText.\n")
    data = yaml.safe_load(cfg.read_text())
    (tmp_path / "hook.py").write_text(
        "import sys\n\ndef on_post_build(config, **kwargs):\n"
        "    print('WARNING -  a plugin warns', file=sys.stderr)\n")
    data["hooks"] = ["hook.py"]
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    out = _build(cfg)
    assert out.returncode != 0 and "a plugin warns" in out.stderr, out.stdout + out.stderr


def test_the_project_site_is_in_one_nav():
    """Every page under docs/ is in mkdocs.yml's nav (an omitted page fails the strict build)."""
    cfg = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = set()

    def walk(node):
        if isinstance(node, str):
            listed.add(node)
        elif isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            for v in node.values():
                walk(v)

    walk(cfg["nav"])
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert pages <= listed, sorted(pages - listed)
