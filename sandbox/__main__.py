"""Entry point for ``python -m sandbox``."""

from sandbox.cli import main

if __name__ == "__main__":
    main()
