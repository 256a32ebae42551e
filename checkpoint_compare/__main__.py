"""``python -m checkpoint_compare``."""

from checkpoint_compare.cli import main

if __name__ == "__main__":
    main()
