"""``python -m operator_standin``."""

from operator_standin.cli import main

if __name__ == "__main__":
    main()
