"""Same as the `transformer-train` console command: `python scripts/train.py [overrides]`."""

from transformer.app.cli import train_main

if __name__ == "__main__":
    train_main()
