"""``python -m transformer COMMAND [ARGS...]``: the console commands without their scripts on the PATH, e.g.
``python -m transformer train data=multi30k_de_en`` is ``transformer-train data=multi30k_de_en``."""

from __future__ import annotations

import difflib
import sys

from transformer.app import cli

COMMANDS = {  # name: (entry point, what it does)
    "train": (cli.train_main, "train a model on a parallel corpus (the default: Multi30k en→de)"),
    "evaluate": (cli.evaluate_main, "score a run, checkpoint or export with sacreBLEU; dump attention maps"),
    "translate": (cli.translate_main, "translate lines from a file, stdin or a terminal"),
    "export": (cli.export_main, "write a trained model as a CTranslate2 model"),
    "serve": (cli.serve_main, "serve a model over HTTP, with the attention explorer page"),
    "prepare-data": (cli.prepare_data_main, "build a corpus's tokenizers and token cache ahead of training"),
    "diversify": (cli.diversify_main, "translate a corpus both ways for data diversification"),
    "recipe": (cli.recipe_main, "several trainings and what is made of them (ensemble, diversified, best_gpu)"),
    "average": (cli.average_main, "average the weights of checkpoints into one"),
    "benchmark": (cli.benchmark_main, "training tokens/s, MFU and decoding speed on this machine"),
    "guide": (cli.guide_main, "print a page of the user guide, e.g. guide train (no page: the list)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return ("usage: python -m transformer COMMAND [ARGS...]   (the same as transformer-COMMAND [ARGS...])\n\n"
            "commands:\n" + "\n".join(lines) + "\n\npython -m transformer COMMAND --help: the command's options")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help", "help"):
        print(usage(), file=sys.stdout if len(sys.argv) >= 2 else sys.stderr)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    if sys.argv[1] not in COMMANDS:
        close = difflib.get_close_matches(sys.argv[1], COMMANDS, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; one of: {', '.join(COMMANDS)}"
        sys.exit(f"python -m transformer: no command {sys.argv[1]!r}{hint} (--help lists them)")
    command = sys.argv.pop(1)
    sys.argv[0] = f"transformer-{command}"
    COMMANDS[command][0]()


if __name__ == "__main__":
    main()
