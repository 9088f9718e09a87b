"""ForkLab: fork agent runs into counterfactual worlds and count what each intervention
rescued, harmed or left unchanged.

Everything ForkLab installs imports under this one name, so it can live in the environment
of a team's own Temporal worker beside their ``activities.py`` and ``workflows.py``. The
layers (``docs/architecture.md``): ``runtime`` (stdlib only; what runs inside a box) ←
``experiments`` (pure science) ← ``contracts`` (wire types) ← ``activities`` (side effects)
← ``workflows`` (orchestration) ← ``workers`` and ``cli``. Importing this package imports
nothing else: boxes import it on every start.
"""

__version__ = "0.1.0"
