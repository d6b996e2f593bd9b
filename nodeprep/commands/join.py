"""join commands (see nodeprep/cli.py)."""

COMMANDS: list = []
