"""``transformer-serve``: a REST API over one model, with dynamic batching, and the attention explorer at ``/``.

Built on FastAPI (validation, the OpenAPI page at ``/docs``) and uvicorn. Endpoints:

- ``POST /translate`` ``{"text": "..." | ["...", ...], "beam_size"?, "n_best"?}`` -> ``{"translations": [[{"text",
  "score", "pieces"}, ...n_best] per sentence], "warnings": [...]}``. Decoding goes through :class:`Translator` (so
  a run, a checkpoint and a CTranslate2 export are served alike) with the composed ``eval`` settings; a request may
  change ``beam_size`` and ``n_best`` (a server that samples, ``eval=sampling``: ``n_best``, the samples).
- ``POST /attention`` ``{"source": "...", "target"?: "..." | "target_pieces"?: [...]}`` -> the pieces and the
  ``[layer][head][query][key]`` weights of encoder self-, decoder self- and cross-attention
  (:func:`transformer.inference.explorer.attention_json`), teacher-forced on ``target`` (encoded), on
  ``target_pieces`` (a translation's pieces, as ``/translate`` returns them: exactly what the model generated) or on
  the PyTorch model's own translation.
- ``GET /health``, ``GET /info`` (languages, model config, vocabulary sizes, checkpoint SHA-256, settings).

Batching (:class:`transformer.app.batcher.Batcher`): requests wait in one queue; the decoder takes the first and, for up to
``max_wait_ms``, every later one with the same ``beam_size`` and ``n_best`` until ``batch_tokens`` source tokens,
and decodes them as one list (sorted by length and padded, as ``transformer-translate`` decodes a file). While it
decodes, new requests queue, so a busy server batches without waiting. ``batching=false`` decodes each request
alone, in arrival order. One thread decodes; the event loop keeps accepting requests meanwhile.

A bad request gets a 4xx JSON ``{"error": "<field>: <what is wrong>", "field": "<field>"}`` and changes nothing:
a body that is not UTF-8 or not JSON, a wrong type, an empty list, more than ``max_sentences`` sentences or
``max_request_tokens`` source tokens; an unknown path or method gets the same shape (``"field": null``). A line
longer than the model's position limit is cut to it, with a warning. A request whose client disconnects while it
waits in the queue is dropped there, so an abandoned request does not hold the decoder.
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
import time
import warnings
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from transformer import files
from transformer.app import openapi
from transformer.app.batcher import Batcher
from transformer.app.http_requests import (
    MAX_BEAM,
    RequestError,
    int_field,
    only_fields,
    parse_body,
    parse_sentences,
    read_body,
    text_field,
    unless_client_leaves,
)
from transformer.app.schemas import ServeConfig
from transformer.config import ConfigError, to_plain_dict
from transformer.data.tokenizer import Tokenizer
from transformer.inference.attention_maps import pair_attention_maps, translation_ids
from transformer.inference.explorer import ASSETS, attention_json, live_page
from transformer.inference.export import read_export_record
from transformer.inference.loading import TrainedModel, load_model, load_trained
from transformer.inference.translation import TruncationWarning
from transformer.inference.translator import Translation, Translator
from transformer.runtime import choose_device
from transformer.version import __version__

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# The application
# --------------------------------------------------------------------------------------------------


@dataclass
class Model:
    """What the server serves: a translator, and the PyTorch model for attention maps (None: not available, and
    why)."""

    translator: Translator
    attention: TrainedModel | None
    attention_missing: str
    info: dict[str, Any]


def load_served_model(cfg: ServeConfig) -> Model:
    """The translator for ``cfg``'s run, checkpoint or export, and the PyTorch model attention maps need; each path
    read as its key says, as ``transformer-translate`` reads it (a file as ``run_dir``, a folder as ``checkpoint``:
    refused naming the key)."""
    device = choose_device(cfg.device)
    if cfg.export_dir is not None:
        translator = Translator.load(cfg.export_dir, device=device, eval_cfg=cfg.eval)
    else:
        translator = Translator.from_trained(load_model(cfg.run_dir, cfg.checkpoint, [], device), cfg.eval)
    if translator.backend == "torch":
        attention, missing = translator.trained, ""
        checkpoint, sha, export = translator.source, files.sha256(translator.source), None
        model_config = to_plain_dict(translator.trained.config.model)
    else:
        record = read_export_record(cfg.export_dir)
        sha, model_config = record["source_checkpoint"]["sha256"], record["model"]
        source = checkpoint = Path(record["source_checkpoint"]["path"])  # what the export was made from
        export = translator.source
        attention, missing = None, (f"attention maps need this app's model: the export's source checkpoint {source} "
                                    "is not there (serve run_dir=... or checkpoint=... instead)")
        if source.is_file() and files.sha256(source) == sha:
            attention, missing = load_trained(source, device), ""
        elif source.is_file():
            missing = f"attention maps need the export's source checkpoint, but {source} changed since the export"
        if attention is None:  # said at the start, not first by a 503 to the explorer or a client
            log.warning("no attention maps (/attention answers 503): %s", missing)
    info = {
        "source_language": translator.languages[0], "target_language": translator.languages[1],
        "backend": translator.backend, "checkpoint": str(checkpoint), "checkpoint_sha256": sha,
        "export": None if export is None else str(export),
        "model": model_config,
        "vocabulary": {"source": translator.src_tok.vocab_size, "target": translator.tgt_tok.vocab_size},
        "eval": to_plain_dict(translator.search_settings()), "search_differences": translator.search_differences(),
        "batching": cfg.batching, "attention": attention is not None,
        "limits": {"max_sentences": cfg.max_sentences, "max_request_tokens": cfg.max_request_tokens,
                   "max_tokens_per_sentence": translator.max_positions, "max_beam_size": MAX_BEAM},
    }
    return Model(translator, attention, missing, info)


class Service:
    """What the endpoints do, apart from HTTP: check a request's fields and limits, decode through the batcher."""

    def __init__(self, model: Model, cfg: ServeConfig) -> None:
        self.model, self.cfg, self.translator = model, cfg, model.translator
        self.batcher = Batcher(self._decode, batching=cfg.batching, max_wait_s=cfg.max_wait_ms / 1000,
                               batch_tokens=cfg.batch_tokens)
        # The attention model's target vocabulary, piece -> id (that of the export, which was made from it).
        self.target_ids = ({piece: i for i, piece in enumerate(model.attention.tgt_tok.pieces())}
                           if model.attention is not None else {})

    def _decode(self, sentences: list[str], beam_size: int, n_best: int) -> list[list[Translation]]:
        return self.translator.translate_scored(sentences, beam_size=beam_size, n_best=n_best)

    def _tokens(self, sentences: list[str], names: list[str], limit: int) -> tuple[int, list[str]]:
        """Source tokens in all (after cutting), and a warning for each sentence cut to ``limit`` tokens."""
        counts = [len(self.translator.src_tok.encode(s)) if s.strip() else 0 for s in sentences]
        warnings = [f"{name}: {n} tokens, cut to the model's limit of {limit}"
                    for name, n in zip(names, counts) if n > limit]
        return sum(min(n, limit) for n in counts), warnings

    async def translate(self, body: dict[str, Any]) -> dict[str, Any]:
        only_fields(body, ("text", "beam_size", "n_best"))
        sentences = parse_sentences(body)
        beam_size = int_field(body, "beam_size", 1, MAX_BEAM) or self.translator.eval.beam_size
        sampling = self.translator.eval.sampling_topk != 1  # n_best samples, each from a beam of one
        if sampling and beam_size > 1:
            raise RequestError(422, "beam_size", f"this server samples (eval.sampling_topk="
                                                 f"{self.translator.eval.sampling_topk}): give no beam_size, or 1")
        # Not given: the server's n_best, as many as the request's beam holds (sampling: the server's samples).
        n_best = int_field(body, "n_best", 1, MAX_BEAM) or (self.translator.eval.n_best if sampling
                                                            else min(self.translator.eval.n_best, beam_size))
        if n_best > beam_size and not sampling:
            raise RequestError(422, "n_best", f"{n_best} translations need beam_size >= {n_best}, got {beam_size}")
        if len(sentences) > self.cfg.max_sentences:
            raise RequestError(413, "text", f"{len(sentences)} sentences; a request takes at most "
                                            f"{self.cfg.max_sentences}")
        names = ["text"] if isinstance(body["text"], str) else [f"text[{i}]" for i in range(len(sentences))]
        tokens, warnings = self._tokens(sentences, names, self.translator.max_positions)
        if tokens > self.cfg.max_request_tokens:
            raise RequestError(413, "text", f"{tokens} source tokens; a request takes at most "
                                            f"{self.cfg.max_request_tokens}")
        results = await self.batcher.translate(sentences, beam_size, n_best, tokens)
        return {"translations": [[{"text": t.text, "score": t.score, "pieces": list(t.pieces)} for t in nbest]
                                 for nbest in results],
                "warnings": warnings}

    async def attention(self, body: dict[str, Any]) -> dict[str, Any]:
        only_fields(body, ("source", "target", "target_pieces"))
        source, target = text_field(body, "source"), text_field(body, "target", required=False)
        if target is not None and body.get("target_pieces") is not None:
            raise RequestError(422, "target_pieces", "give target or target_pieces, not both")
        if not source.strip():
            raise RequestError(422, "source", "is empty: there is nothing to attend to")
        if self.model.attention is None:
            raise RequestError(503, "attention", self.model.attention_missing)
        trained = self.model.attention
        target_ids = self._target_pieces(body, trained.tgt_tok)
        tokens, _ = self._tokens([source], ["source"], self.translator.max_positions)
        if tokens == 0:  # characters the tokenizer drops, such as a zero-width space
            raise RequestError(422, "source", "has no token the model reads: there is nothing to attend to")
        if tokens > self.cfg.max_request_tokens:
            raise RequestError(413, "source", f"{tokens} tokens; a request takes at most "
                                              f"{self.cfg.max_request_tokens}")
        if target is not None:
            target_ids = trained.tgt_tok.encode(target)
        # The decoder reads BOS and the target, so both fit the position limit; the maps are cut shorter still.
        limit = min(self.translator.max_positions - 1, self.cfg.max_attention_tokens)

        def maps() -> dict[str, Any]:
            ids = target_ids
            if ids is None:  # the translation /translate answers (the export's, for an export), as generated ids
                ids = self._own_translation(source, trained)
            lengths = (("source", len(trained.src_tok.encode(source))), ("target", len(ids)))
            warnings = [f"{name}: {n} tokens, cut to {limit} for the maps (max_attention_tokens)"
                        for name, n in lengths if n > limit]
            return attention_json(pair_attention_maps(trained, source, ids, limit), warnings)

        return await self.batcher.run(maps)  # on the decoding thread: the model's, and the JSON is large

    def _own_translation(self, source: str, trained: TrainedModel) -> list[int]:
        """The ids of the served model's best translation of ``source`` with the server's search: the PyTorch
        model's, or for an export CTranslate2's, whose pieces the source checkpoint's vocabulary holds."""
        if self.translator.backend == "torch":
            return translation_ids(trained, [source], self.translator.eval)[0]
        best = self.translator.translate_scored([source])[0][0]  # the n_best /translate asks for: CTranslate2's
        # beam search runs until it holds that many, so its best can depend on it
        return [self.target_ids[piece] for piece in best.pieces]

    def _target_pieces(self, body: dict[str, Any], tgt_tok: Tokenizer) -> list[int] | None:
        """``target_pieces``, the target as pieces of the model's vocabulary (those ``/translate`` returns), as
        ids; None when not given."""
        pieces = body.get("target_pieces")
        if pieces is None:
            return None
        if not isinstance(pieces, list) or not all(isinstance(piece, str) for piece in pieces):
            raise RequestError(422, "target_pieces", "must be a list of strings: pieces of the model's vocabulary")
        specials = {tgt_tok.id_to_piece(i) for i in (tgt_tok.pad_id, tgt_tok.bos_id, tgt_tok.eos_id)}
        for i, piece in enumerate(pieces):
            if piece not in self.target_ids or piece in specials:
                raise RequestError(422, f"target_pieces[{i}]", f"{piece!r} is not a piece of the model's target "
                                   "vocabulary (BOS, EOS and padding are added by the server)")
        return [self.target_ids[piece] for piece in pieces]


def create_app(model: Model, cfg: ServeConfig) -> FastAPI:
    """The FastAPI application serving ``model`` with ``cfg``'s limits and batching."""
    service = Service(model, cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.batcher.start()
        yield
        await service.batcher.stop()

    app = FastAPI(title="transformer-serve", lifespan=lifespan, version=__version__,
                  description="Translate with a trained model and explore its attention.")
    app.state.batcher = service.batcher
    app.mount("/static", StaticFiles(directory=ASSETS), name="static")

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        return JSONResponse({"error": str(error), "field": error.field}, status_code=error.status)

    @app.exception_handler(HTTPException)
    async def not_here(request: Request, error: HTTPException) -> JSONResponse:  # an unknown path or method
        return JSONResponse({"error": f"{request.method} {request.url.path}: {error.detail}", "field": None},
                            status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"error": f"the server failed: {type(error).__name__}: {error}", "field": None},
                            status_code=500)

    @app.post("/translate", openapi_extra=openapi.TRANSLATE_BODY, responses=openapi.TRANSLATE_ANSWERS)
    async def translate(request: Request) -> dict[str, Any]:
        body = parse_body(await read_body(request))
        return await unless_client_leaves(request, service.translate(body))

    @app.post("/attention", openapi_extra=openapi.ATTENTION_BODY, responses=openapi.ATTENTION_ANSWERS)
    async def attention(request: Request) -> dict[str, Any]:
        body = parse_body(await read_body(request))
        return await unless_client_leaves(request, service.attention(body))

    @app.get("/health")
    async def health() -> JSONResponse:
        if not service.batcher.running:
            return JSONResponse({"status": "the decoder stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)  # what load balancers send

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return model.info

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return live_page(f"Translate {model.info['source_language']} → {model.info['target_language']} and "
                         "explore attention")

    return app


@contextmanager
def serving_in_background(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` from a thread (tests, the load benchmark); yields its base URL. ``port=0``: a free port."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def check_listening(host: str, port: int) -> None:
    """Raise ``ConfigError`` naming ``host`` or ``port`` when the server could not listen there: a host that does
    not resolve or is not this machine's, a port another process holds. Binds (then closes) a socket on each of the
    host's addresses with the options uvicorn's listening sockets get (asyncio's ``create_server``)."""
    try:
        addresses = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                                       socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ConfigError(f"host: {host} does not resolve ({error.strerror}); give a name or address of this "
                          "machine, e.g. host=127.0.0.1 (this machine only) or host=0.0.0.0 (every network)") from None
    for family, kind, proto, _, address in dict.fromkeys(addresses):
        on = host if address[0] == host else f"{host} ({address[0]})"
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # a family this machine lacks (IPv6 turned off): asyncio skips the address, and so does this
            continue
        try:
            with sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:  # as asyncio: an IPv6 socket listens on IPv6 alone
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
        except OSError as error:
            reason = (error.strerror or str(error)).lower()
            if error.errno == errno.EADDRINUSE:
                raise ConfigError(f"port: {port} on {on} is in use by another process; choose another port=... "
                                  "(port=0: any free one)") from None
            if error.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"host: {on} is not an address of this machine ({reason}); give one of its "
                                  "addresses, or host=0.0.0.0 for every network") from None
            if error.errno in (errno.EACCES, errno.EPERM):
                raise ConfigError(f"port: {port} on {on} needs privileges this process lacks ({reason}); choose a "
                                  "port above 1023") from None
            raise ConfigError(f"port: cannot listen on {port} at {on} ({reason})") from None


def serve(cfg: ServeConfig) -> None:
    """Check that the server can listen at ``cfg.host`` and ``cfg.port``, load the model and serve it until
    interrupted."""
    import uvicorn

    # Each answer names its own cut lines; the decoder's warning would number lines across merged requests.
    warnings.simplefilter("ignore", TruncationWarning)
    check_listening(cfg.host, cfg.port)  # before the model loads: refused at once, not after minutes of loading
    model = load_served_model(cfg)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # listening: the line names the port, the one port=0 chose included
                port = self.servers[0].sockets[0].getsockname()[1]
                host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
                served = model.info["export"] or model.info["checkpoint"]
                log.info("serving %s (%s) at http://%s:%d/ (API docs at /docs)", served, model.info["backend"], host,
                         port)

    server = Server(uvicorn.Config(create_app(model, cfg), host=cfg.host, port=cfg.port, log_level="info"))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl-C or SIGTERM, then raises the signal again
        if not server.started:
            raise
    except SystemExit:  # uvicorn's own exit (status 3) when it cannot listen: the port taken since the check
        if server.started:
            raise
    if not server.started:  # uvicorn said why
        sys.exit(1)
    log.info("stopped")
