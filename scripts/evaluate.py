"""Same as the `transformer-evaluate` console command: `python scripts/evaluate.py [overrides]`."""

from transformer.app.cli import evaluate_main

if __name__ == "__main__":
    evaluate_main()
