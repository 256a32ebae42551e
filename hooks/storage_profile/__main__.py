"""``python -m hooks.storage_profile``."""

from hooks.storage_profile.cli import main

if __name__ == "__main__":
    main()
