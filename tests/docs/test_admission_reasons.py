"""The README lists the admission decision counter's reasons exactly as the code names them.

The list sits in the Metrics section between ``<!-- admission-reasons -->`` markers; a
reason added to (or dropped from) ``fairlane.policy.admission.reasons`` without the
README following fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from fairlane.policy.admission.reasons import COUNTED_REASONS

README = Path(__file__).resolve().parents[2] / "README.md"
_LISTED = re.compile(r"<!-- admission-reasons -->(.*?)<!--\s*/admission-reasons -->", re.S)
_NAME = re.compile(r"`([a-z_]+)`")


def _readme_reasons() -> list[str]:
    found = _LISTED.findall(README.read_text(encoding="utf-8"))
    assert len(found) == 1, "the README holds the reasons' list once, between its markers"
    return _NAME.findall(found[0])


def test_the_readme_lists_every_counted_reason_once() -> None:
    listed = _readme_reasons()
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == set(COUNTED_REASONS)
