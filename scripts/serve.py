"""Same as the `transformer-serve` console command: `python scripts/serve.py [overrides]`."""

from transformer.app.cli import serve_main

if __name__ == "__main__":
    serve_main()
