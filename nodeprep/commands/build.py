"""build commands (see nodeprep/cli.py)."""

COMMANDS: list = []
