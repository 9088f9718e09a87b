"""Every search attribute ForkLab sets is offered as a Web UI column, with a saved view
whose query uses it, in docs/orchestration.md; a new one without a view fails here."""

from __future__ import annotations

import re

from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE
from forklab.workflows.runfork.search_attributes import RUN_FORK_KEYS
from tests.helpers import ROOT


def test_every_search_attribute_has_a_saved_view_and_a_column() -> None:
    text = (ROOT / "docs" / "orchestration.md").read_text()
    after = text[text.index("**Saved views and columns.**") :].split("\n\n")
    table = next(part for part in after if part.startswith("| saved view |"))
    rows = table.splitlines()[2:]  # no header, no rule
    assert rows, "the saved views table is gone"
    queries = " ".join(r.split(" | ")[1] for r in rows)
    columns = " ".join(r.split(" | ")[2] for r in rows)
    for key in (EXPERIMENT, STAGE, *RUN_FORK_KEYS):
        assert re.search(rf"`{key.name} (=|!=|IS)", queries), f"no saved view queries {key.name}"
        assert f"`{key.name}`" in columns or key.name in queries, key.name
