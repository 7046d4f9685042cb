"""Scripts run by the deploy tools' own Python (tests/deploy/tools.py), not by the project's."""
