"""``python -m lightning_dprel fit|validate|test --config configs/<name>.yaml``."""

from lightning_dprel.cli import main

if __name__ == "__main__":
    main()
