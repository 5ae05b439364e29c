"""Writes the `handler:` settings table of docs/configuration/settings.md from bucketing/config.py's declarations.

`make docs-settings` (`.venv/bin/python docs/settings_table.py`) replaces what lies between the page's
`config-table` markers with `bucketing.settings_reference.markdown_table()` (what
`python -m bucketing.settings_reference` prints): one source. tests/unit/test_config.py fails when the page and the
declarations differ. Not part of the site (mkdocs.yml excludes docs/*.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from bucketing.settings_reference import markdown_table

PAGE = Path(__file__).resolve().parent / "configuration" / "settings.md"
START, END = "<!-- config-table", "<!-- /config-table -->"


def with_table(page: str, table: str) -> str:
    """The page with the lines between its markers replaced by `table`."""
    start = page.index("\n", page.index(START)) + 1
    return page[:start] + table + page[page.index(END) :]


if __name__ == "__main__":
    before = PAGE.read_text()
    after = with_table(before, markdown_table())
    PAGE.write_text(after)
    sys.stdout.write(f"docs/configuration/settings.md: {'unchanged' if after == before else 'table rewritten'}\n")
