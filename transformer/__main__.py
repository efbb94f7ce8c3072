"""``python -m transformer COMMAND [ARGS...]``: the console commands without their scripts on the PATH, e.g.
``python -m transformer train data=multi30k_de_en`` is ``transformer-train data=multi30k_de_en``."""

from __future__ import annotations

import sys

from transformer.app import cli

COMMANDS = {
    "train": cli.train_main, "evaluate": cli.evaluate_main, "translate": cli.translate_main,
    "prepare-data": cli.prepare_data_main, "diversify": cli.diversify_main, "benchmark": cli.benchmark_main,
    "average": cli.average_main, "recipe": cli.recipe_main, "export": cli.export_main, "serve": cli.serve_main,
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m transformer {{{','.join(COMMANDS)}}} [ARGS...]")
    command = sys.argv.pop(1)
    sys.argv[0] = f"transformer-{command}"
    COMMANDS[command]()


if __name__ == "__main__":
    main()
