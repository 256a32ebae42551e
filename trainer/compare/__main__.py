"""``python -m trainer.compare``."""

from trainer.compare.cli import main

if __name__ == "__main__":
    main()
