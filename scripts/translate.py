"""Same as the `transformer-translate` console command: `python scripts/translate.py [overrides]`."""

from transformer.app.cli import translate_main

if __name__ == "__main__":
    translate_main()
