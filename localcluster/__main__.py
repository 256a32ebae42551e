"""``python -m localcluster``."""

from localcluster.cli import main

if __name__ == "__main__":
    main()
