"""Load on ``transformer-serve``: concurrent clients on loopback, batching on and off.

    python benchmarks/serve_load.py RUN_DIR_OR_EXPORT [--clients 1 8 32] [--seconds 20] [--threads 2]
        [--sentences FILE] [--eval beam] [--port 8765]

For each batching setting a ``transformer-serve`` process is started (``torch`` limited to ``--threads``), and for
each client count that many asyncio clients (httpx) send one sentence per request, round-robin through
``--sentences`` (default: the model's test split), for ``--seconds``. Every answer is compared with what
``transformer-translate`` writes for that line with the same ``eval`` settings (computed first, by the same
function ``transformer-translate`` runs). Prints a Markdown table: sentences/s, p50/p95/p99 latency, errors,
answers that differ. Exits 1 on any error or difference.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def expected_translations(model: str, lines: list[str], eval_group: str) -> list[str]:
    """What ``transformer-translate model eval=<group>`` writes for ``lines`` (one text each)."""
    with subprocess.Popen([sys.executable, "-m", "transformer", "translate", _model_key(model) + f"={model}",
                           f"eval={eval_group}", "device=cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, encoding="utf-8") as process:
        out, _ = process.communicate("".join(line + "\n" for line in lines))
    if process.returncode != 0:
        sys.exit(f"transformer-translate failed ({process.returncode})")
    return out.split("\n")[: len(lines)]


def _model_key(model: str) -> str:
    path = Path(model)
    if (path / "export.json").is_file():
        return "export_dir"
    return "run_dir" if path.is_dir() else "checkpoint"


def test_lines(model: str) -> list[str]:
    """The source side of the model's test split."""
    from transformer.data.splits import load_split
    from transformer.inference.translator import Translator

    data = Translator.load(model).data
    return load_split(data, data.test_split)[0]


async def _client(client, url: str, lines: list[str], expected: list[str], start: int, step: int, stop_at: float,
                  record: dict) -> None:
    i = start
    while time.monotonic() < stop_at:
        index = i % len(lines)
        began = time.monotonic()
        try:
            response = await client.post(f"{url}/translate", json={"text": lines[index]}, timeout=120)
            answer = response.json()
            ok = response.status_code == 200
        except Exception:  # a dropped connection or a timeout counts as an error
            ok, answer = False, None
        record["latency"].append(time.monotonic() - began)
        if not ok:
            record["errors"] += 1
        elif answer["translations"][0][0]["text"] != expected[index]:
            record["differ"] += 1
        i += step


async def measure(url: str, lines: list[str], expected: list[str], clients: int, seconds: float) -> dict:
    import httpx

    record = {"latency": [], "errors": 0, "differ": 0}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits) as client:
        await client.post(f"{url}/translate", json={"text": lines[0]})  # warm up
        began = time.monotonic()
        stop_at = began + seconds
        await asyncio.gather(*(_client(client, url, lines, expected, c, clients, stop_at, record)
                               for c in range(clients)))
        elapsed = time.monotonic() - began
    latency = sorted(record["latency"])

    def percentile(p: float) -> float:
        return latency[min(len(latency) - 1, int(p / 100 * len(latency)))] * 1000

    return {"requests": len(latency), "per_s": len(latency) / elapsed, "p50": percentile(50), "p95": percentile(95),
            "p99": percentile(99), "mean": statistics.fmean(latency) * 1000, "errors": record["errors"],
            "differ": record["differ"]}


def start_server(model: str, port: int, batching: bool, eval_group: str, threads: int) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen([sys.executable, "-m", "transformer", "serve", _model_key(model) + f"={model}",
                                f"port={port}", f"batching={str(batching).lower()}", f"eval={eval_group}",
                                "device=cpu"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    sys.exit("transformer-serve did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a run directory, a checkpoint or an export directory")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sentences", help="a file of source lines (default: the model's test split)")
    parser.add_argument("--eval", default="beam", help="the eval config group the server decodes with")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    lines = (Path(args.sentences).read_text(encoding="utf-8").splitlines() if args.sentences
             else test_lines(args.model))
    lines = [line for line in lines if line.strip()]
    expected = expected_translations(args.model, lines, args.eval)
    print(f"model {args.model}, eval={args.eval}, {len(lines)} sentences, {args.threads} threads, "
          f"{args.seconds:.0f} s per row\n")
    print("| batching | clients | requests | sentences/s | p50 ms | p95 ms | p99 ms | errors | differ |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for batching in (True, False):
        server = start_server(args.model, args.port, batching, args.eval, args.threads)
        try:
            for clients in args.clients:
                row = asyncio.run(measure(f"http://127.0.0.1:{args.port}", lines, expected, clients, args.seconds))
                failed |= bool(row["errors"] or row["differ"])
                print(f"| {'on' if batching else 'off'} | {clients} | {row['requests']} | {row['per_s']:.1f} | "
                      f"{row['p50']:.0f} | {row['p95']:.0f} | {row['p99']:.0f} | {row['errors']} | {row['differ']} |",
                      flush=True)
        finally:
            server.terminate()
            server.wait(timeout=60)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
