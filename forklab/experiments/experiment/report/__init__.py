"""The report: one model and its renderings.

- ``model``: ``Report`` (its JSON is the machine-readable report, with ``schema_version``);
- ``tables``: the cells every rendering shares; ``charts``: inline SVG charts;
- ``render_text``, ``render_markdown``, ``render_html``: terminal, Markdown and a
  self-contained HTML page.
"""
