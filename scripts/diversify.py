"""Same as the `transformer-diversify` console command: `python scripts/diversify.py [overrides]`."""

from transformer.app.cli import diversify_main

if __name__ == "__main__":
    diversify_main()
