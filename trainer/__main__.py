"""``python -m trainer``."""

from trainer.cli import main

if __name__ == "__main__":
    main()
