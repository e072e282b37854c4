"""`python -m tokmix`: the `tokmix` command."""

from tokmix.cli import main

main()
