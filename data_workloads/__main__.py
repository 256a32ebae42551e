"""``python -m data_workloads``."""

from data_workloads.cli import main

if __name__ == "__main__":
    main()
