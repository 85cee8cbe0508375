"""The files a newcomer looks for: LICENSE (the license pyproject declares), CITATION.cff (CFF
1.2.0 with the three source works), CHANGELOG.md; the README cites the papers with the same arXiv
ids; the shipped teacher config logs within its epoch (no log_every_n_steps warning)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the project supports 3.10)
REPO = Path(__file__).resolve().parents[1]


def test_license_is_the_one_pyproject_declares():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]  # SPDX (PEP 639)
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10000  # the whole text


def test_citation_file_cites_the_three_works_with_the_readme_arxiv_ids():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["message"] and cff["authors"]
    assert cff["license"] == "Apache-2.0"
    assert cff["version"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    refs = {r["title"]: r for r in cff["references"]}
    for r in refs.values():  # required by CFF for every reference
        assert r["type"] and r["authors"] and all("name" in a or "family-names" in a for a in r["authors"])
    readme = (REPO / "README.md").read_text()
    ids = dict(re.findall(r"\*([^*]+)\* \(\[arXiv:(\d{4}\.\d{5})\]\(https://arxiv\.org/abs/\2\)\)",
                          re.sub(r"\s+", " ", readme)))
    assert len(ids) == 2, ids
    for title, arxiv in ids.items():
        assert refs[title]["url"] == f"https://arxiv.org/abs/{arxiv}"
        assert refs[title]["identifiers"] == [{"type": "other", "value": f"arXiv:{arxiv}"}]
    assert "A Physically Interpretable Evaluation Strategy" in refs and "A Physically Interpretable " \
        "Evaluation Strategy" in re.sub(r"\s+", " ", readme)


def test_changelog_names_the_version():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    text = (REPO / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and f"## {version}" in text


def test_teacher_config_logs_within_an_epoch():
    """Lightning warns when an epoch has fewer batches than log_every_n_steps (default 50)."""
    from lightning_pfd.launch import CONFIG_DIR
    from lightning_pfd.data import DigitsDataModule

    cfg = yaml.safe_load((CONFIG_DIR / "teacher_edm_digits.yaml").read_text())
    dm = DigitsDataModule(**cfg["data"]["init_args"])
    dm.setup("fit")
    batches = len(dm.train_dataloader())
    assert cfg["trainer"].get("log_every_n_steps", 50) <= batches, batches
