"""Same as the `transformer-export` console command: `python scripts/export.py [overrides]`."""

from transformer.app.cli import export_main

if __name__ == "__main__":
    export_main()
