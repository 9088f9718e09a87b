"""The bounded readout: a model may phrase the evidence, never change it.

``packet`` builds the only thing a model sees (a typed evidence packet); ``schema`` is the
structured answer it must give; ``check`` rejects an answer that names a world, number or
verdict the packet does not hold; ``fallback`` writes the deterministic readout used
otherwise; ``render`` shows whichever readout won, and why.
"""
