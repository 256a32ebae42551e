"""``python -m fio_sweep``."""

from fio_sweep.cli import main

if __name__ == "__main__":
    main()
