"""ForkLab's operator CLI. The science lives in ``experiments``; orchestration in
``workflows``/``activities``; configuration and clients in ``workers``."""
