"""python -m nodeprep: the command line."""

from .cli import main

main()
