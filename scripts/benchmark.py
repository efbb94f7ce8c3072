"""Same as the `transformer-benchmark` console command: `python scripts/benchmark.py [overrides]`."""

from transformer.app.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main()
