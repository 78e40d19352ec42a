"""Product code explains why in the present tense, never by pointing at a lab notebook.

A comment that says "see the results page of session 16" or "issue 17" sends a reader
to a page that is regenerated or gone; the measurement that justifies a choice belongs
in the comment itself. This scans every source file of the transport and its C
extensions for citations of results pages, sessions and issues.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("wanxport", "wanxport_lab", "ext")
SUFFIXES = {".py", ".pyi", ".c", ".h"}
CITATION = re.compile(r"docs/results|results/[\w-]+\.md|\bissues? #?\d+|\bsessions? \d+|\bs\d+-quiet\b",
                      re.IGNORECASE)


def _citations() -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if CITATION.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_product_code_cites_no_results_page_session_or_issue() -> None:
    assert _citations() == []


def test_the_scan_recognises_each_kind_of_citation() -> None:
    for line in ("(docs/results/s18.md)", "see cpu.md in results/cpu.md", "issue 17 measured",
                 "Session 6 there", "s9-quiet"):
        assert CITATION.search(line), line
    for line in ("issue_certificates(args.dir)", "a session's paths", "issued by the CA"):
        assert not CITATION.search(line), line
