"""`python -m ngspec`: the `ngspec` command, for when its script is not on PATH or to pick the
interpreter (`.venv/bin/python -m ngspec generate ...`)."""

from ngspec.cli.app import main

main()
