"""Same as the `transformer-prepare-data` console command: `python scripts/prepare_data.py [overrides]`."""

from transformer.app.cli import prepare_data_main

if __name__ == "__main__":
    prepare_data_main()
