"""The bounded readout: a model may choose what to cite of the evidence, never change it
or phrase it.

``packet`` builds the only thing a model sees (a typed evidence packet); ``schema`` is the
structured answer it must give (claims: world, verdict, direction, cited figures);
``check`` rejects claims the packet does not hold; ``fallback`` makes the deterministic
claims used otherwise; ``write`` writes the prose of whichever claims won from the
packet's own values; ``render`` shows it, escaped, and why those claims.
"""
