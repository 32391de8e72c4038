"""``python -m benchmarks``: see ``benchmarks.runner``."""

from benchmarks.runner import main

if __name__ == "__main__":
    main()
