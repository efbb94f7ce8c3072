"""``transformer-serve``: answers equal to what the translator writes, batching that changes nothing but the speed,
attention maps equal to the model's own, every bad request refused with the field named, and the server still
serving after each."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer
from transformer.app.schemas import ServeConfig
from transformer.config import EvalConfig, LengthNorm

httpx = pytest.importorskip("httpx")
server = pytest.importorskip("transformer.app.server")
batcher = pytest.importorskip("transformer.app.batcher")

# Two layers and two heads, to switch between; 64 positions, to cut an over-long line.
SERVED = ["model.n_encoder_layers=2", "model.n_decoder_layers=2", "model.max_positions=64", "data.max_len=40",
          "training.max_steps=60", "training.validate_every_steps=60"]
BEAM = EvalConfig(beam_size=3, length_norm=LengthNorm.average)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from conftest import write_toy_corpus
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from test_export import TOY

    from transformer.app import pipeline
    from transformer.app.schemas import CONFIG_PATH, register_configs

    register_configs()
    folder = tmp_path_factory.mktemp("served")
    corpus = write_toy_corpus(folder / "toy")
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        cfg = compose("train", [*TOY, *SERVED, f"data.dir={corpus}", f"data.cache_dir={folder / 'cache'}",
                                f"output_dir={folder / 'run'}"])
    pipeline.train(OmegaConf.to_object(cfg))
    return folder / "run"


def sentences(run_dir: Path) -> list[str]:
    return (run_dir.parent / "toy" / "test.src").read_text().splitlines()


@pytest.fixture(scope="module")
def served(run_dir):
    """(base URL, app) of a server on a free loopback port, batching on."""
    cfg = ServeConfig(run_dir=str(run_dir), eval=BEAM, device="cpu", max_wait_ms=20)
    app = server.create_app(server.load_served_model(cfg), cfg)
    with server.serving_in_background(app) as url:
        yield url, app


def expected(run_dir: Path, lines: list[str], **search) -> list[list[tuple[str, float]]]:
    """What transformer-translate decodes (its function, not the server's path): (text, score) n-best lists."""
    from transformer.inference.loading import load_model
    from transformer.inference.translation import translate_scored

    trained = load_model(str(run_dir), None, [], torch.device("cpu"))
    cfg = EvalConfig(**{**BEAM.__dict__, **search})
    return translate_scored(trained.model, lines, trained.src_tok, trained.tgt_tok, cfg, "cpu",
                            trained.model.max_positions)


def _pairs(answer: dict) -> list[list[tuple[str, float]]]:
    return [[(t["text"], t["score"]) for t in nbest] for nbest in answer["translations"]]


def _same(ours, theirs) -> None:
    assert [[text for text, _ in nbest] for nbest in ours] == [[text for text, _ in nbest] for nbest in theirs]
    assert [s for nbest in ours for _, s in nbest] == pytest.approx([s for nbest in theirs for _, s in nbest], abs=1e-4)


def test_translate_answers_as_transformer_translate(served, run_dir):
    url, _ = served
    lines = sentences(run_dir)[:12] + ["  "]
    answer = httpx.post(f"{url}/translate", json={"text": lines}).json()
    _same(_pairs(answer), expected(run_dir, lines))
    assert answer["warnings"] == [] and answer["translations"][-1] == [{"text": "", "score": 0.0, "pieces": []}]
    answer = httpx.post(f"{url}/translate", json={"text": lines[0], "beam_size": 4, "n_best": 3}).json()
    _same(_pairs(answer), expected(run_dir, lines[:1], beam_size=4, n_best=3))
    greedy = httpx.post(f"{url}/translate", json={"text": lines, "beam_size": 1}).json()
    _same(_pairs(greedy), expected(run_dir, lines, beam_size=1))


def test_concurrent_requests_are_batched_and_each_answered_as_alone(served, run_dir):
    url, app = served
    lines = sentences(run_dir)[:24]
    decoder = app.state.batcher
    batches, requests = decoder.batches, decoder.requests
    with httpx.Client() as client, ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda line: client.post(f"{url}/translate", json={"text": line}).json(), lines))
    _same([_pairs(a)[0] for a in answers], expected(run_dir, lines))
    assert decoder.requests - requests == len(lines)
    assert decoder.batches - batches < len(lines)  # some requests were decoded together


def test_unbatched_serving_decodes_each_request_alone(run_dir):
    two_best = EvalConfig(**{**BEAM.__dict__, "n_best": 2})
    cfg = ServeConfig(run_dir=str(run_dir), eval=two_best, device="cpu", batching=False)
    app = server.create_app(server.load_served_model(cfg), cfg)
    lines = sentences(run_dir)[:8]
    with server.serving_in_background(app) as url, httpx.Client() as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda line: client.post(f"{url}/translate", json={"text": line}).json(), lines))
        greedy = client.post(f"{url}/translate", json={"text": lines[0], "beam_size": 1}).json()
    _same([_pairs(a)[0] for a in answers], expected(run_dir, lines, n_best=2))
    assert (app.state.batcher.batches, app.state.batcher.requests) == (len(lines) + 1,) * 2
    # A request's beam of 1 holds one translation: the server's n_best of 2 is not asked of it.
    _same(_pairs(greedy), expected(run_dir, lines[:1], beam_size=1))


def test_a_server_that_samples_answers_n_best_samples_and_refuses_a_beam(run_dir):
    samples = EvalConfig(beam_size=1, sampling_topk=0, sampling_temperature=2.0, n_best=3)
    cfg = ServeConfig(run_dir=str(run_dir), eval=samples, device="cpu", batching=False)
    app = server.create_app(server.load_served_model(cfg), cfg)
    lines = sentences(run_dir)[:6]
    with server.serving_in_background(app) as url, httpx.Client() as client:
        answer = client.post(f"{url}/translate", json={"text": lines}).json()
        five = client.post(f"{url}/translate", json={"text": lines[0], "n_best": 5}).json()
        beam = client.post(f"{url}/translate", json={"text": lines[0], "beam_size": 4})
    _same(_pairs(answer), expected(run_dir, lines, **samples.__dict__))  # seeded: transformer-translate's samples
    assert all(len(nbest) == 3 for nbest in answer["translations"])
    assert any(len({t["text"] for t in nbest}) > 1 for nbest in answer["translations"])
    assert len(five["translations"][0]) == 5
    assert beam.status_code == 422 and beam.json()["field"] == "beam_size"
    assert beam.json()["error"] == "beam_size: this server samples (eval.sampling_topk=0): give no beam_size, or 1"


BAD = [
    (b'{"text": ', 400, "body", r"body: is not valid JSON"),
    (b'{"text": "caf\xe9"}', 400, "body", r"body: is not valid UTF-8 \(at byte offset 13\)"),
    (b'["a b"]', 422, "body", "body: must be a JSON object, got a list"),
    (b'{}', 422, "text", "text: is required"),
    (b'{"text": 7}', 422, "text", "text: must be a string or a list of strings, got a number"),
    (b'{"text": []}', 422, "text", "text: is an empty list"),
    (b'{"text": ["a b", null]}', 422, "text[1]", r"text\[1\]: must be a string, got null"),
    (b'{"text": ["a b", "c \\ud800"]}', 422, "text[1]",  # a JSON escape of half a surrogate pair
     r"text\[1\]: holds an unpaired surrogate '\\ud800' at character 2: not valid Unicode"),
    (b'{"text": "a b", "beam_size": "4"}', 422, "beam_size", "beam_size: must be an integer, got a string"),
    (b'{"text": "a b", "beam_size": 2.5}', 422, "beam_size", r"beam_size: must be an integer, got 2\.5"),
    (b'{"text": "a b", "beam_size": 0}', 422, "beam_size", r"beam_size: must be in 1\.\.64, got 0"),
    (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "body",
     "body: nests lists or objects deeper than the server reads"),
    (b'{"text": "a b", "beam_size": ' + b"1" * 5000 + b"}", 400, "body",
     r"body: holds a number of more digits than the server reads \(4300\)"),
    (b'{"text": "a b", "n_best": 5}', 422, "n_best", "n_best: 5 translations need beam_size >= 5, got 3"),
    (b'{"text": "a b", "beams": 2}', 422, "beams", "beams: is not a field of this request"),
    (b'{"text": "a b", "text": "c d"}', 400, "text", "text: is given twice in one object; give it once"),
    (b'{"text": "a b", "beam_size": NaN}', 400, "body", "body: is not valid JSON: NaN is not a JSON value"),
    (b'{"text": "a b", "beam_size": -Infinity}', 400, "body", "body: is not valid JSON: -Infinity is not a JSON"),
    (json.dumps({"text": ["a"] * 65}).encode(), 413, "text", "text: 65 sentences; a request takes at most 64"),
    (json.dumps({"text": ["a b " * 30] * 40}).encode(), 413, "text",
     "text: 2400 source tokens; a request takes at most 2048"),
    (json.dumps({"text": "a" * (1 << 20)}).encode(), 413, "body", r"body: \d+ bytes; a request takes at most 1048576"),
]


@pytest.mark.parametrize("body, status, field, message", BAD, ids=[m.split(":")[0] + str(i) for i, (*_, m) in
                                                                  enumerate(BAD)])
def test_a_bad_request_is_refused_naming_the_field_and_the_server_goes_on(served, body, status, field, message):
    url, _ = served
    response = httpx.post(f"{url}/translate", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert response.json()["field"] == field
    assert re.match(message, response.json()["error"])
    assert httpx.post(f"{url}/translate", json={"text": "a b c"}).status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_body_declared_as_anything_but_json_is_refused_415(served, content_type):
    url, _ = served
    body = b'{"text": "a b c"}'
    for path in ("translate", "attention"):
        refused = httpx.post(f"{url}/{path}", content=body, headers={"Content-Type": content_type})
        assert refused.status_code == 415 and refused.json()["field"] == "Content-Type"
        assert refused.json()["error"] == (f"Content-Type: is {content_type!r}; send the body as JSON with "
                                           "'Content-Type: application/json'")
    for declared in ("application/json; charset=utf-8", "Application/JSON", "application/merge-patch+json",
                     'application/json; charset="UTF-8"'):
        assert httpx.post(f"{url}/translate", content=body, headers={"Content-Type": declared}).status_code == 200


def test_a_body_in_another_charset_or_compressed_is_refused_415_naming_the_header(served):
    url, _ = served
    latin = httpx.post(f"{url}/translate", content='{"text": "café"}'.encode("latin-1"),
                       headers={"Content-Type": "application/json; charset=latin-1"})
    assert latin.status_code == 415 and latin.json() == {
        "error": "Content-Type: declares charset 'latin-1'; JSON is read as UTF-8 (RFC 8259): send it so, with "
                 "charset=utf-8 or none", "field": "Content-Type"}
    packed = httpx.post(f"{url}/translate", content=gzip.compress(b'{"text": "a b c"}'),
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert packed.status_code == 415 and packed.json() == {
        "error": "Content-Encoding: is 'gzip'; the server reads bodies uncompressed: send it without Content-Encoding",
        "field": "Content-Encoding"}
    assert httpx.post(f"{url}/translate", content=b'{"text": "a b c"}',
                      headers={"Content-Type": "application/json", "Content-Encoding": "identity"}).status_code == 200


def test_a_page_of_another_site_is_refused_and_the_servers_own_page_is_not(served):
    url, _ = served
    body = {"text": "a b c"}
    for site in ("cross-site", "same-site"):
        refused = httpx.post(f"{url}/translate", json=body, headers={"Sec-Fetch-Site": site})
        assert refused.status_code == 403 and refused.json()["field"] == "Sec-Fetch-Site"
    for site in ("same-origin", "none"):  # the explorer page; a request the user typed in the address bar
        assert httpx.post(f"{url}/translate", json=body, headers={"Sec-Fetch-Site": site}).status_code == 200


def test_a_whole_number_written_as_4_0_is_the_integer_4_and_health_answers_head(served):
    url, _ = served
    as_float = httpx.post(f"{url}/translate", content=b'{"text": "a b c", "beam_size": 2.0, "n_best": 2.0}')
    as_int = httpx.post(f"{url}/translate", json={"text": "a b c", "beam_size": 2, "n_best": 2})
    assert as_float.status_code == 200 and as_float.json() == as_int.json()
    head = httpx.head(f"{url}/health")  # what load balancers and uptime checks send
    assert head.status_code == 200 and head.content == b""


def test_a_body_that_starts_with_a_byte_order_mark_is_read_as_without_it(served):
    url, _ = served
    for path, body in (("translate", b'{"text": ["a b c", "d e"], "beam_size": 2}'),
                       ("attention", b'{"source": "a b"}')):
        plain = httpx.post(f"{url}/{path}", content=body, headers={"Content-Type": "application/json"})
        marked = httpx.post(f"{url}/{path}", content=b"\xef\xbb\xbf" + body,
                            headers={"Content-Type": "application/json"})
        assert plain.status_code == marked.status_code == 200 and marked.json() == plain.json()
    # The mark is dropped at the start only: inside, it is a character like any other.
    refused = httpx.post(f"{url}/translate", content=b'{"text": "a"}\xef\xbb\xbf')
    assert refused.status_code == 400 and refused.json()["error"].startswith("body: is not valid JSON: Extra data")


def test_a_client_that_leaves_mid_body_is_no_failure_of_the_server(served, caplog):
    import logging
    import socket

    url, _ = served
    host, port = url.removeprefix("http://").split(":")
    uvicorn_log = logging.getLogger("uvicorn")  # uvicorn's loggers do not propagate to the root, where caplog listens
    uvicorn_log.addHandler(caplog.handler)
    try:
        with caplog.at_level("ERROR"):
            logging.getLogger("uvicorn.error").error("probe")  # what uvicorn logs there is seen here
            assert [r.getMessage() for r in caplog.records] == ["probe"]
            caplog.clear()
            with socket.create_connection((host, int(port))) as client:  # 1,000 bytes announced, 10 sent
                client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 1000\r\n\r\n{\"text\": \"a")
                client.shutdown(socket.SHUT_WR)
                client.settimeout(20)
                while client.recv(4096):  # until the server has finished with the connection and closed it
                    pass
            assert httpx.post(f"{url}/translate", json={"text": "a b c"}).status_code == 200
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def _until(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_request_whose_client_leaves_while_it_waits_is_never_decoded(served):
    import socket
    import threading

    url, app = served
    decoder, calls, hold = app.state.batcher, [], threading.Event()
    decode = decoder.decode

    def held(sentences, beam_size, n_best):  # the first batch holds the decoder until told
        calls.append(list(sentences))
        hold.wait(30)
        return decode(sentences, beam_size, n_best)

    decoder.decode = held
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, f"{url}/translate", json={"text": "a b"}, timeout=60)
            _until(lambda: calls == [["a b"]])
            body = json.dumps({"text": "c d"}).encode()
            with socket.create_connection(tuple(url.removeprefix("http://").split(":"))) as leaving:
                leaving.sendall(b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                _until(lambda: decoder.waiting == 2)  # "c d" queued behind "a b"
            _until(lambda: decoder.waiting == 1)  # the server saw its client leave
            hold.set()
            assert first.result().status_code == 200
        assert httpx.post(f"{url}/translate", json={"text": "e f"}).status_code == 200
        assert calls == [["a b"], ["e f"]]
    finally:
        hold.set()
        decoder.decode = decode


@pytest.mark.filterwarnings("ignore::transformer.inference.translation.TruncationWarning")  # serve() ignores it
def test_an_over_long_line_is_cut_to_the_models_limit_with_a_warning(served, run_dir):
    url, _ = served
    long_line = " ".join(["a", "b", "c", "d"] * 25)  # 100 tokens; the model has 64 positions
    answer = httpx.post(f"{url}/translate", json={"text": ["a b", long_line]}).json()
    assert answer["warnings"] == ["text[1]: 100 tokens, cut to the model's limit of 64"]
    cut = " ".join(long_line.split()[:64])
    _same(_pairs(answer), expected(run_dir, ["a b", cut]))


def test_attention_is_the_models_own_for_every_kind(served, run_dir):
    from transformer.inference.attention_maps import pair_attention_maps
    from transformer.inference.loading import load_model

    url, _ = served
    source = sentences(run_dir)[0]
    trained = load_model(str(run_dir), None, [], torch.device("cpu"))
    own = httpx.post(f"{url}/translate", json={"text": source}).json()["translations"][0][0]
    assert own["pieces"] and trained.tgt_tok.decode([trained.tgt_tok.pieces().index(p) for p in own["pieces"]]) \
        == own["text"]
    answer = httpx.post(f"{url}/attention", json={"source": source}).json()  # on the model's own translation
    assert answer["target_pieces"] == [*own["pieces"], "</s>"]
    assert httpx.post(f"{url}/attention", json={"source": source, "target_pieces": own["pieces"]}).json() == answer
    maps = pair_attention_maps(trained, source, trained.tgt_tok.encode(own["text"]), 63)
    assert answer["source_pieces"] == maps.src_pieces and answer["target_pieces"] == maps.tgt_pieces
    assert answer["target_input_pieces"] == maps.tgt_input_pieces
    for key, weights in (("encoder", maps.encoder), ("decoder", maps.decoder_self), ("cross", maps.cross)):
        assert np.asarray(answer[key]).shape == weights.shape and weights.shape[:2] == (2, 2)
        np.testing.assert_allclose(np.asarray(answer[key]), weights, atol=1e-6)
    given = httpx.post(f"{url}/attention", json={"source": source, "target": "a a"}).json()
    assert given["target_pieces"] == ["a", "a", "</s>"]
    long_pair = {"source": " ".join(["a", "b"] * 70), "target": " ".join(["c"] * 130)}
    cut = httpx.post(f"{url}/attention", json=long_pair).json()  # max_attention_tokens: 128 by default
    assert cut["warnings"] == ["source: 140 tokens, cut to 63 for the maps (max_attention_tokens)",
                               "target: 130 tokens, cut to 63 for the maps (max_attention_tokens)"]
    assert len(cut["source_pieces"]) == 63 and np.asarray(cut["cross"]).shape == (2, 2, 64, 63)
    long_target = trained.tgt_tok.encode(long_pair["target"])  # 64 positions: the decoder reads BOS too
    assert pair_attention_maps(trained, long_pair["source"], long_target, 1000).cross.shape == (2, 2, 64, 64)
    refused = httpx.post(f"{url}/attention", json={"source": " ", "target": "a"})
    assert refused.status_code == 422 and refused.json()["field"] == "source"
    refused = httpx.post(f"{url}/attention", content=b'{"source": "a", "target": "\\udc00"}',
                         headers={"Content-Type": "application/json"})
    assert refused.status_code == 422 and refused.json()["field"] == "target"
    for body, field, error in (
            ({"target_pieces": ["a", "no such piece"]}, "target_pieces[1]",
             "'no such piece' is not a piece of the model's target vocabulary"),
            ({"target_pieces": ["a", "</s>"]}, "target_pieces[1]", "'</s>' is not a piece"),
            ({"target_pieces": "a"}, "target_pieces", "must be a list of strings"),
            ({"target": "a", "target_pieces": ["a"]}, "target_pieces", "give target or target_pieces, not both")):
        refused = httpx.post(f"{url}/attention", json={"source": source, **body})
        assert refused.status_code == 422 and refused.json()["field"] == field
        assert refused.json()["error"].startswith(f"{field}: {error}")


def test_a_source_that_sentencepiece_reads_as_no_token_is_refused_by_attention_and_translated_as_empty(
        compose_config, toy_corpus, tmp_path):
    from test_export import OPTIONS, _trained

    _trained(compose_config, toy_corpus, tmp_path / "run", OPTIONS["sentencepiece_shared"])
    cfg = ServeConfig(run_dir=str(tmp_path / "run"), eval=BEAM, device="cpu")
    model = server.load_served_model(cfg)
    assert model.translator.src_tok.encode("\u200b") == []  # a zero-width space: not blank, yet no token
    with server.serving_in_background(server.create_app(model, cfg)) as url:
        refused = httpx.post(f"{url}/attention", json={"source": "\u200b"})
        assert refused.status_code == 422
        assert refused.json() == {"error": "source: has no token the model reads: there is nothing to attend to",
                                  "field": "source"}
        answer = httpx.post(f"{url}/translate", json={"text": ["\u200b", "a b"]})
        assert answer.status_code == 200
        assert answer.json()["translations"][0] == [{"text": "", "score": 0.0, "pieces": []}]


def test_health_info_and_a_page_that_needs_no_other_site(served, run_dir):
    from transformer import files

    url, _ = served
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    info = httpx.get(f"{url}/info").json()
    checkpoint = run_dir / "checkpoints" / "final.pt"
    assert info["checkpoint_sha256"] == files.sha256(checkpoint) and info["backend"] == "torch"
    assert (info["checkpoint"], info["export"]) == (str(checkpoint), None)
    assert (info["source_language"], info["target_language"]) == ("src", "tgt")
    assert info["vocabulary"] == {"source": 12, "target": 12} and info["model"]["n_decoder_layers"] == 2
    assert info["search_differences"] == []  # this app's own search
    assert info["eval"]["beam_size"] == BEAM.beam_size and BEAM.batch_size is BEAM.fixed_shape is None
    assert [info["eval"][key] for key in ("batch_size", "fixed_shape", "precision")] == [64, False, "fp32"]  # settled
    for path in ("/", "/static/explorer.js", "/static/explorer.css"):
        response = httpx.get(url + path)
        assert response.status_code == 200 and "http://" not in response.text and "https://" not in response.text
    assert "/static/explorer.js" in httpx.get(url).text
    schema = httpx.get(f"{url}/openapi.json").json()
    assert schema["info"]["version"] == transformer.__version__ != "0.1.0"  # FastAPI's default: the app's own
    api = schema["paths"]
    assert api["/translate"]["post"]["requestBody"]["required"]
    assert sorted(api["/translate"]["post"]["responses"]) == ["200", "400", "403", "413", "415", "422"]
    assert sorted(api["/attention"]["post"]["responses"]) == ["200", "400", "403", "413", "415", "422", "503"]
    for method, path, status in (("GET", "/nothing", 404), ("GET", "/translate", 405)):
        answer = httpx.request(method, url + path)
        assert answer.status_code == status
        assert answer.json() == {"error": f"{method} {path}: {'Not Found' if status == 404 else 'Method Not Allowed'}",
                                 "field": None}
    assert httpx.get(f"{url}/translate").headers["allow"] == "POST"


def test_an_export_is_served_through_ctranslate2_with_attention_from_its_checkpoint(run_dir, tmp_path, caplog):
    pytest.importorskip("ctranslate2")
    from transformer import files
    from transformer.inference.export import export
    from transformer.inference.loading import load_trained

    checkpoint = tmp_path / "final.pt"
    shutil.copy(run_dir / "checkpoints" / "final.pt", checkpoint)
    out = export(load_trained(checkpoint, torch.device("cpu")), tmp_path / "exported", "none", {"beam_size": 1})
    cfg = ServeConfig(export_dir=str(out), eval=BEAM, device="cpu")
    app = server.create_app(server.load_served_model(cfg), cfg)
    assert "attention" not in caplog.text
    lines = sentences(run_dir)[:10]
    with server.serving_in_background(app) as url:
        _same(_pairs(httpx.post(f"{url}/translate", json={"text": lines}).json()), expected(run_dir, lines))
        info = httpx.get(f"{url}/info").json()
        assert info["backend"] == "ctranslate2" and info["search_differences"] == []  # average: CTranslate2's own
        assert (info["export"], info["checkpoint"]) == (str(out), str(checkpoint))  # the export, what it came from
        assert info["checkpoint_sha256"] == files.sha256(checkpoint)
        assert httpx.post(f"{url}/attention", json={"source": lines[0]}).status_code == 200
    gnmt = server.load_served_model(ServeConfig(export_dir=str(out), eval=EvalConfig(beam_size=3), device="cpu"))
    assert gnmt.info["eval"]["length_norm"] == "gnmt" and gnmt.info["search_differences"] == [  # said, not hidden
        "eval.length_norm=gnmt has no CTranslate2 counterpart: its beam search (beam_size > 1) normalises by length "
        "(average) instead"]
    with checkpoint.open("ab") as changed:  # trained on since the export: said when the server starts
        changed.write(b"\0")
    server.load_served_model(cfg)
    assert caplog.messages[-1] == (f"no attention maps (/attention answers 503): attention maps need the export's "
                                   f"source checkpoint, but {checkpoint} changed since the export")
    checkpoint.unlink()  # without its source checkpoint an export still translates; attention says why not
    app = server.create_app(server.load_served_model(cfg), cfg)
    assert caplog.messages[-1].startswith("no attention maps (/attention answers 503): attention maps need this "
                                          "app's model: the export's source checkpoint")
    with server.serving_in_background(app) as url:
        assert httpx.post(f"{url}/translate", json={"text": lines[0]}).status_code == 200
        refused = httpx.post(f"{url}/attention", json={"source": lines[0]})
        assert refused.status_code == 503 and refused.json()["field"] == "attention"
        assert "the export's source checkpoint" in refused.json()["error"]


@pytest.mark.parametrize("n_best", [1, 2])  # CTranslate2's beam search runs until it holds n_best: its best may differ
def test_an_exports_attention_without_a_target_is_drawn_on_the_translation_it_serves(run_dir, tmp_path, n_best):
    pytest.importorskip("ctranslate2")
    from transformer.inference.attention_maps import translation_ids
    from transformer.inference.export import export
    from transformer.inference.loading import load_trained

    trained = load_trained(run_dir / "checkpoints" / "final.pt", torch.device("cpu"))
    out = export(trained, tmp_path / "exported", "none", {"beam_size": 3})
    # GNMT normalisation, which CTranslate2 does as average: the two searches may part
    cfg = ServeConfig(export_dir=str(out), eval=EvalConfig(beam_size=3, n_best=n_best, length_penalty=2.0),
                      device="cpu")
    lines = sentences(run_dir)[:40]
    own = [[trained.tgt_tok.id_to_piece(i) for i in ids] for ids in translation_ids(trained, lines, cfg.eval)]
    with server.serving_in_background(server.create_app(server.load_served_model(cfg), cfg)) as url:
        served = [nbest[0]["pieces"] for nbest in
                  httpx.post(f"{url}/translate", json={"text": lines}).json()["translations"]]
        drawn = [httpx.post(f"{url}/attention", json={"source": line}).json()["target_pieces"] for line in lines]
    assert drawn == [pieces + ["</s>"] for pieces in served]  # the rows: what /translate answered, then EOS
    assert served != own, "the toy model's two searches agree on every line: the test would pass either way"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_command_serves_until_stopped_and_names_the_port_it_chose(run_dir, tmp_path, stop):
    process = subprocess.Popen([sys.executable, "-m", "transformer", "serve", f"run_dir={run_dir}", "port=0",
                                "eval=greedy", "device=cpu"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        output = []
        for line in process.stdout:  # ends if the command fails
            output.append(line)
            if match := re.search(r"serving .* at http://127\.0\.0\.1:(\d+)/ ", line):
                break
        assert match, "".join(output)
        url = f"http://127.0.0.1:{match[1]}"
        assert httpx.get(f"{url}/health").status_code == 200  # the line comes once the server listens
        answer = httpx.post(f"{url}/translate", json={"text": sentences(run_dir)[0]}).json()
        assert answer["translations"][0][0]["text"] == expected(run_dir, sentences(run_dir)[:1], beam_size=1)[0][0][0]
        process.send_signal(stop)  # Ctrl-C, or a service manager's stop: the normal end, not an error
        rest = process.communicate(timeout=30)[0]
    finally:
        process.kill()
        process.wait(timeout=30)
    assert process.returncode == 0, rest
    assert rest.rstrip().endswith("transformer.app.server: stopped") and "ERROR" not in rest, rest


def test_serve_config_refuses_what_cannot_be_served():
    from transformer.config import ConfigError

    with pytest.raises(ConfigError, match=r"run_dir: give exactly one of .* \(got run_dir, export_dir\)"):
        ServeConfig(run_dir="run", export_dir="exported")
    with pytest.raises(ConfigError, match="port: must be in 0..65535"):
        ServeConfig(run_dir="run", port=70000)
    with pytest.raises(ConfigError, match="max_sentences: must be >= 1"):
        ServeConfig(run_dir="run", max_sentences=0)


def test_each_model_source_is_read_as_its_key_says_as_translate_reads_it(run_dir, tmp_path):
    from transformer.checkpoint import CheckpointError

    text = run_dir.parent / "toy" / "test.src"
    for key, path, error, message in (
            ("run_dir", tmp_path / "nowhere", FileNotFoundError,
             r"^run_dir: .*nowhere does not exist; give a training run's folder"),
            ("run_dir", text, CheckpointError, r"^run_dir: .*test\.src is a file; give a checkpoint file as "
                                               r"checkpoint=.*test\.src, or its run's folder as run_dir$"),
            ("checkpoint", run_dir, CheckpointError, r"^checkpoint .*run is a folder, not a checkpoint file")):
        with pytest.raises(error, match=message):
            server.load_served_model(ServeConfig(**{key: str(path)}, device="cpu"))
    best = run_dir / "checkpoints" / "best.pt"
    for key, path, served_file in (("run_dir", run_dir, run_dir / "checkpoints" / "final.pt"),
                                   ("checkpoint", best, best)):
        model = server.load_served_model(ServeConfig(**{key: str(path)}, device="cpu"))
        assert (model.info["checkpoint"], model.info["backend"]) == (str(served_file), "torch")
        assert model.attention is model.translator.trained


def test_a_host_or_port_the_server_cannot_listen_on_is_refused_before_the_model_loads(tmp_path):
    import socket

    from transformer.config import ConfigError

    nowhere = str(tmp_path / "nowhere")  # a model source that would fail once it is loaded
    with socket.socket() as held:  # another process's server, listening on the port
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server sets it: the check must still see it
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^port: {port} on 127\.0\.0\.1 is in use by another process; "
                                              r"choose another port="):
            server.serve(ServeConfig(run_dir=nowhere, port=port, device="cpu"))
        with pytest.raises(ConfigError, match=rf"^port: {port} on localhost \(127\.0\.0\.1\) is in use"):
            server.check_listening("localhost", port)
    server.check_listening("127.0.0.1", port)  # free again
    server.check_listening("127.0.0.1", 0)  # any free port
    with pytest.raises(ConfigError, match=r"^host: 999\.1\.1\.1 does not resolve \(.+\); give a name or address of "
                                          r"this machine, e\.g\. host=127\.0\.0\.1"):
        server.serve(ServeConfig(run_dir=nowhere, host="999.1.1.1", device="cpu"))
    with pytest.raises(ConfigError, match=r"^host: 192\.0\.2\.1 is not an address of this machine "
                                          r"\(cannot assign requested address\)"):  # TEST-NET-1, on no machine
        server.serve(ServeConfig(run_dir=nowhere, host="192.0.2.1", device="cpu"))


def test_the_command_refuses_a_port_in_use_in_one_line_with_status_1(run_dir, tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "transformer", "serve", f"run_dir={run_dir}", f"port={port}",
                               "device=cpu"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].endswith(f"port: {port} on 127.0.0.1 is in use by another process; choose another port=... "
                             "(port=0: any free one)")
    assert not any(tmp_path.iterdir())  # nothing written


# --------------------------------------------------------------------------------------------------
# The explorer in a real browser: Playwright driving the system's Chromium (apt-get install chromium)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no chromium on the PATH (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        launched.close()


def _expect(locator):
    """Playwright's retrying assertion (imported here: the module runs without Playwright too)."""
    from playwright.sync_api import expect

    return expect(locator)


def _watch(page) -> list[str]:
    """What goes wrong on page from now on: console errors, uncaught exceptions, failed requests, error answers."""
    problems: list[str] = []
    page.on("console", lambda message: problems.append(f"console: {message.text}") if message.type == "error"
            else None)
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.on("requestfailed", lambda request: problems.append(f"failed: {request.url}"))
    page.on("response", lambda response: problems.append(f"{response.status}: {response.url}")
            if response.status >= 400 else None)
    return problems


def _requests(page, path: str) -> list[str]:
    """The bodies of the requests page sends to path, from now on."""
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.post_data) if request.url.endswith(path) else None)
    return sent


def _translate(page, lines: list[str]) -> None:
    page.fill("#input", "\n".join(lines))
    page.click("#translate")
    page.wait_for_selector("#results li")


def _top(values: list[float], k: int = 3) -> list[int]:
    """The explorer's rule: the k largest above 0, the earlier index first on ties."""
    return sorted((i for i in range(len(values)) if values[i] > 0), key=lambda i: (-values[i], i))[:k]


def _marked(page) -> list[tuple[int, int]]:
    cells = page.eval_on_selector_all("table.heatmap td.strongest",
                                      "cells => cells.map(c => [Number(c.dataset.row), Number(c.dataset.col)])")
    return sorted(tuple(cell) for cell in cells)


def _explore(page, maps: dict, layer: int, head: int) -> None:
    """Choose cross-attention, a layer and a head; hover a target piece, then a source piece, and check the marked
    cells are the largest weights of that row, then of that column, and the colour bar's top is the map's largest."""
    page.select_option("#kind", "cross")
    page.select_option("#layer", str(layer))
    page.select_option("#head", str(head))
    page.wait_for_selector(f'table.heatmap[data-kind="cross"] caption:has-text("layer {layer}, head {head}")')
    weights = maps["cross"][layer][head]  # (target pieces, source pieces)
    assert page.locator("table.heatmap tbody td").count() == len(weights) * len(weights[0])
    assert page.locator("table.heatmap tbody th").all_inner_texts() == maps["target_pieces"]
    assert page.locator("table.heatmap thead th[data-col]").all_inner_texts() == maps["source_pieces"]
    assert page.inner_text(".scale .max") == f"{max(map(max, weights)):.3f}"
    page.hover('table.heatmap tbody th[data-row="0"]')
    assert _marked(page) == sorted((0, k) for k in _top(weights[0]))
    page.hover('table.heatmap thead th[data-col="0"]')
    assert _marked(page) == sorted((q, 0) for q in _top([row[0] for row in weights]))


def test_the_explorer_translates_and_shows_each_kind_layer_and_head_in_a_browser(served, run_dir, browser, tmp_path):
    url, _ = served
    lines = sentences(run_dir)[:3]
    page = browser.new_page()
    problems = _watch(page)
    page.goto(url)
    page.wait_for_selector("#info:has-text('src → tgt')")
    # The API's pages, named in the footer; the favicon is the page's own (no request, no 404 in the console).
    assert page.get_attribute("footer a[href='/openapi.json']", "href") and "CDN" in page.inner_text("footer")
    assert page.locator("link[rel=icon][href='data:,']").count() == 1
    assert page.get_attribute("#status", "aria-live") == "polite" and page.locator("label[for=input]").count() == 1
    _translate(page, lines)
    translations = httpx.post(f"{url}/translate", json={"text": lines}).json()["translations"]
    assert page.locator("#results li .target").all_inner_texts() == [nbest[0]["text"] for nbest in translations]
    asked = _requests(page, "/attention")
    page.locator("#results li").nth(1).click()
    page.wait_for_selector("table.heatmap")
    # the maps of the pieces the model generated, not of its text encoded again
    chosen = {"source": lines[1], "target_pieces": translations[1][0]["pieces"]}
    assert [json.loads(body) for body in asked] == [chosen]
    maps = httpx.post(f"{url}/attention", json=chosen).json()
    # Titled with its sentence pair; a caption, scoped headers and labelled controls; a colour bar with its range.
    assert page.inner_text("#map-title .source") == lines[1]
    assert page.inner_text("#map-title .target") == translations[1][0]["text"]
    assert page.inner_text("table.heatmap caption") == ("cross-attention, layer 0, mean of 2 heads: rows are target "
                                                        "pieces (queries), columns source pieces (keys)")
    assert page.locator("table.heatmap thead th[scope=col]").count() == len(maps["source_pieces"])
    assert page.locator("table.heatmap tbody th[scope=row]").count() == len(maps["target_pieces"])
    for name in ("kind", "layer", "head"):
        assert page.inner_text(f"label[for={name}]") == name and page.locator(f"select#{name}").count() == 1
    mean = np.mean(maps["cross"][0], axis=0)
    assert page.inner_text(".scale .max") == f"{mean.max():.3f}" and "darkest" in page.inner_text(".scale")
    assert "each map is scaled to its own largest weight" in page.inner_text(".scale")
    _explore(page, maps, layer=1, head=1)
    _explore(page, maps, layer=0, head=0)
    page.select_option("#kind", "encoder")
    page.wait_for_selector('table.heatmap[data-kind="encoder"]')
    assert page.locator("table.heatmap tbody th").all_inner_texts() == maps["source_pieces"]
    assert page.inner_text("table.heatmap .corner") == "keys: source →\nqueries: source ↓"
    page.screenshot(path=str(tmp_path / "explorer.png"), full_page=True)
    assert (tmp_path / "explorer.png").stat().st_size > 0
    assert problems == []
    page.close()


def test_the_explorer_works_by_keyboard_alone(served, run_dir, browser):
    url, _ = served
    lines = sentences(run_dir)[:3]
    page = browser.new_page()
    page.goto(url)
    page.focus("#input")
    page.keyboard.type("\n".join(lines))
    page.keyboard.press("Control+Enter")  # translates; the textarea gets no new line
    page.wait_for_selector("#results li")
    assert page.input_value("#input") == "\n".join(lines)
    page.locator("#results button").first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#map-title .source:text-is('{lines[0]}')")
    page.locator("#results button").nth(1).focus()
    page.keyboard.press("Space")
    page.wait_for_selector(f"#map-title .source:text-is('{lines[1]}')")
    # A changed select keeps the focus: the map under it is redrawn, not the controls.
    page.focus("#layer")
    page.keyboard.press("ArrowDown")
    page.wait_for_selector("table.heatmap caption:has-text('layer 1, mean')")
    assert page.evaluate("document.activeElement.id") == "layer"
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("ArrowDown")  # the kind: encoder self-attention after cross-attention
    page.wait_for_selector('table.heatmap[data-kind="encoder"]')
    assert page.evaluate("document.activeElement.id") == "kind"
    page.select_option("#head", "1")
    # Another sentence keeps the chosen kind, layer and head.
    page.locator("#results button").nth(2).focus()
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#map-title .source:text-is('{lines[2]}')")
    assert [page.input_value(f"#{name}") for name in ("kind", "layer", "head")] == ["encoder", "1", "1"]
    # A new translation takes the map of the old one away.
    page.focus("#input")
    page.keyboard.press("Meta+Enter")
    page.wait_for_selector("#results li")
    assert page.locator("#explorer").is_hidden() and page.locator("table.heatmap").count() == 0
    shown = page.locator("#results li").count()
    page.fill("#input", " \n")  # nothing to translate: the translations shown stay
    page.click("#translate")
    _expect(page.locator("#status")).to_have_text("Type a sentence first (one per line).")
    assert shown > 0 and page.locator("#results li").count() == shown
    page.fill("#input", "\n".join(lines))
    page.close()


def test_the_heat_map_is_explored_by_keyboard_as_by_pointer(served, run_dir, browser):
    url, _ = served
    lines = sentences(run_dir)[:2]
    page = browser.new_page()
    problems = _watch(page)
    page.goto(url)
    _translate(page, lines)
    page.locator("#results button").first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("table.heatmap")
    pieces = httpx.post(f"{url}/translate", json={"text": lines[:1]}).json()["translations"][0][0]["pieces"]
    maps = httpx.post(f"{url}/attention", json={"source": lines[0], "target_pieces": pieces}).json()
    page.select_option("#head", "0")
    page.wait_for_selector("table.heatmap caption:has-text('layer 0, head 0')")
    weights = maps["cross"][0][0]  # (target pieces, source pieces)
    focused = "e => [e.tagName, e.dataset.row, e.dataset.col]"

    def press(key: str) -> list:
        page.keyboard.press(key)
        return page.evaluate(f"({focused})(document.activeElement)")

    page.focus("#head")
    assert press("Tab") == ["TD", "0", "0"]  # into the map at its first cell, marked as a click marks it
    assert page.inner_text(".readout") == f"{maps['target_pieces'][0]} → {maps['source_pieces'][0]}: " \
                                          f"{weights[0][0]:.3f}"
    assert press("ArrowLeft") == ["TH", "0", None]  # the row's piece: the keys it attends to most
    assert _marked(page) == sorted((0, k) for k in _top(weights[0]))
    assert press("ArrowLeft") == ["TH", "0", None] and press("ArrowUp") == ["TH", "0", None]  # the map's edge
    if len(weights) > 1:
        assert press("ArrowDown") == ["TH", "1", None]
        assert _marked(page) == sorted((1, k) for k in _top(weights[1]))
        press("ArrowUp")
    assert press("ArrowRight") == ["TD", "0", "0"] and press("ArrowUp") == ["TH", None, "0"]  # a column's piece
    assert _marked(page) == sorted((q, 0) for q in _top([row[0] for row in weights]))
    last = str(len(maps["source_pieces"]) - 1)
    assert press("End") == ["TH", None, last] and press("ArrowLeft" if last != "0" else "End")[0] == "TH"
    assert press("Home") == ["TH", None, "0"] and press("ArrowDown") == ["TD", "0", "0"]
    assert press("Home") == ["TH", "0", None]
    assert press("Control+End") == ["TH", "0", None]  # a key with a modifier is the browser's, not the map's
    press("Escape")  # the marks go, the focus stays
    assert page.locator("table.heatmap .hovered, table.heatmap .strongest").count() == 0
    assert page.inner_text(".readout").strip() == ""
    assert press("Shift+Tab") == ["SELECT", None, None] and press("Tab") == ["TH", "0", None]  # back where it left
    assert page.locator("table.heatmap [tabindex='0']").count() == 1 and problems == []
    page.close()


def test_the_explorer_on_a_phone_marks_no_masked_weight_and_a_tap_does_what_hover_does(served, run_dir, browser):
    url, _ = served
    context = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True)
    page = context.new_page()
    page.goto(url)
    lines = sentences(run_dir)[:2]
    _translate(page, lines)
    page.tap("#results li >> nth=0")
    page.wait_for_selector("table.heatmap")
    # Each label sits on the line of its own select, just before it.
    for name in ("kind", "layer", "head"):
        label, control = page.locator(f"label[for={name}]").bounding_box(), page.locator(f"#{name}").bounding_box()
        assert control["y"] <= label["y"] + label["height"] / 2 <= control["y"] + control["height"], name
        assert 0 <= control["x"] - (label["x"] + label["width"]) < 16, name
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.select_option("#kind", "decoder")
    page.wait_for_selector('table.heatmap[data-kind="decoder"]')
    target = httpx.post(f"{url}/translate", json={"text": lines[0]}).json()["translations"][0][0]["text"]
    maps = httpx.post(f"{url}/attention", json={"source": lines[0], "target": target}).json()
    weights = np.mean(maps["decoder"][0], axis=0).tolist()  # layer 0, mean of heads
    assert weights[0][1:] == [0.0] * (len(weights) - 1)  # the first position sees itself only
    for q in range(len(weights)):
        page.tap(f'table.heatmap tbody th[data-row="{q}"]')
        assert _marked(page) == sorted((q, k) for k in _top(weights[q])), q
    assert _marked(page) and page.inner_text(".readout").startswith(maps["target_pieces"][-1] + " attends most to")
    page.tap('table.heatmap td[data-row="0"][data-col="0"]')
    assert page.inner_text(".readout") == f"{maps['target_pieces'][0]} → <s>: {weights[0][0]:.3f}"
    assert "Hover or tap" in page.inner_text(".legend")
    context.close()


def test_the_explorer_keeps_a_big_maps_labels_in_view_and_long_or_empty_text_in_its_card(served, browser):
    url, _ = served
    source = " ".join("abcdefgh"[i % 8] for i in range(60))
    target = " ".join("hgfedcba"[i % 8] for i in range(60))
    page = browser.new_page(viewport={"width": 1000, "height": 700})
    page.goto(url)
    # Answers of the server's shape, chosen: a long translation, an unbroken word, an empty translation.
    answers = [[{"text": target, "score": -1.0}], [{"text": "x" * 400, "score": -2.0}], [{"text": "", "score": 0.0}]]
    page.route("**/translate", lambda route: route.fulfill(json={"translations": answers, "warnings": []}))
    _translate(page, [source, "y" * 400, "a b"])
    assert page.locator("#results .target").nth(2).inner_text() == "(empty translation)"
    assert "note" in page.locator("#results .target").nth(2).get_attribute("class")
    for card in ("#sentences", "#translator"):
        assert page.eval_on_selector(card, "node => node.scrollWidth <= node.clientWidth"), card
    page.locator("#results button").first.click()
    page.wait_for_selector("table.heatmap")
    assert page.locator("table.heatmap tbody td").count() == 61 * 60
    wrap = page.locator(".heatmap-wrap")
    wrap.scroll_into_view_if_needed()
    wrap.evaluate("node => node.scrollTo(node.scrollWidth, node.scrollHeight)")
    box = wrap.bounding_box()
    assert wrap.evaluate("node => node.scrollLeft > 0 && node.scrollTop > 0")
    for selector, edge in (('tbody th[data-row="60"]', "x"), ('thead th[data-col="59"]', "y")):
        label = page.locator(f"table.heatmap {selector}")
        assert label.evaluate("node => getComputedStyle(node).position") == "sticky"
        where = label.bounding_box()
        assert abs(where[edge] - box[edge]) < 1, (selector, where, box)  # at the box's edge, scrolled as it is
        centre = [where["x"] + where["width"] / 2, where["y"] + where["height"] / 2]
        assert label.evaluate("(node, [x, y]) => node.contains(document.elementFromPoint(x, y))", centre)  # on top
    page.close()


def test_the_explorer_says_what_went_wrong_and_sends_one_request_at_a_time(served, run_dir, browser):
    url, _ = served
    lines = sentences(run_dir)[:2]
    page = browser.new_page()
    page.clock.install()  # the 60 s timeout, run forward below
    problems = _watch(page)
    page.route("**/info", lambda route: route.abort("connectionrefused"))
    page.goto(url)
    _expect(page.locator("#info")).to_contain_text("could not be read: The server cannot be reached")
    sent = _requests(page, "/translate")
    page.fill("#input", "  \n ")
    page.click("#translate")
    _expect(page.locator("#status")).to_have_text("Type a sentence first (one per line).")
    assert sent == []
    # In flight: the button is disabled, and neither a second click nor Ctrl+Enter sends another request.
    held = []
    page.route("**/translate", lambda route: held.append(route))
    page.fill("#input", "\n".join(lines))
    page.click("#translate")
    _expect(page.locator("#translate")).to_be_disabled()
    page.click("#translate", force=True)
    page.press("#input", "Control+Enter")
    _expect(page.locator("#status")).to_have_text("translating…")
    assert len(held) == 1 and len(sent) == 1
    held.pop().fallback()  # on to the server, which answers
    page.wait_for_selector("#results li")
    _expect(page.locator("#translate")).to_be_enabled()
    page.locator("#results button").first.click()
    page.wait_for_selector("table.heatmap")
    # A failed /attention takes the map of the sentence before away.
    page.route("**/attention", lambda route: route.fulfill(status=500, json={"error": "the server failed: boom",
                                                                             "field": None}))
    page.locator("#results button").nth(1).click()
    _expect(page.locator("#status")).to_have_text("Line 2: the server failed: boom")
    assert page.locator("#explorer").is_hidden() and page.locator("table.heatmap").count() == 0
    # A request that never answers: given up after 60 s, with a message.
    page.click("#translate")
    _expect(page.locator("#status")).to_have_text("translating…")
    assert page.locator("#results li").count() == 0  # no result of the translation before stays
    page.clock.run_for(61_000)
    _expect(page.locator("#status")).to_have_text(re.compile(r"^The server did not answer within 60 s\."))
    _expect(page.locator("#translate")).to_be_enabled()
    # A server that is down.
    page.unroute("**/translate")
    page.route("**/translate", lambda route: route.abort("connectionrefused"))
    page.click("#translate")
    _expect(page.locator("#status")).to_have_text(re.compile(r"^The server cannot be reached: check that "
                                                             r"transformer-serve is still running"))
    assert not [problem for problem in problems if problem.startswith("uncaught")], problems
    for route in held:
        route.abort()
    page.close()


def test_the_explorer_of_a_server_without_attention_maps_offers_none(served, run_dir, browser):
    import dataclasses

    cfg = ServeConfig(run_dir=str(run_dir), eval=BEAM, device="cpu")
    model = server.load_served_model(cfg)  # as an export without its source checkpoint: no model for the maps
    blind = dataclasses.replace(model, attention=None, info={**model.info, "attention": False},
                                attention_missing="attention maps need ...: /srv/models/final.pt is not there")
    with server.serving_in_background(server.create_app(blind, cfg)) as url:
        page = browser.new_page()
        page.goto(url)
        _expect(page.locator("#notice")).to_have_text(re.compile("^Attention maps are not available from this server"))
        asked = _requests(page, "/attention")
        _translate(page, sentences(run_dir)[:2])
        assert page.locator("#results li").count() == 2 and page.locator("#results button").count() == 0
        page.locator("#results li").first.click()
        page.wait_for_timeout(200)
        assert asked == [] and page.locator("#explorer").is_hidden() and "/srv" not in page.inner_text("body")
        page.close()


@pytest.mark.filterwarnings("ignore::transformer.inference.translation.TruncationWarning")  # serve() ignores it
def test_the_explorer_sends_more_lines_than_a_request_takes_in_several_and_names_lines(served, run_dir, browser):
    url, _ = served
    long_line = " ".join(["a", "b", "c", "d"] * 25)  # 100 tokens; the model has 64 positions
    many = (sentences(run_dir) * 2)[:67]
    lines = ["a b", "", long_line, *many]  # 69 sentences, on lines 1 and 3 to 70
    page = browser.new_page()
    page.goto(url)
    sent = _requests(page, "/translate")
    _translate(page, lines)
    assert [len(json.loads(body)["text"]) for body in sent] == [64, 5]  # the server's max_sentences, from /info
    wanted = [line for line in lines if line]
    answers = [httpx.post(f"{url}/translate", json={"text": part}).json()
               for part in (wanted[:64], wanted[64:])]
    assert page.locator("#results li .target").all_inner_texts() == [
        nbest[0]["text"] or "(empty translation)" for answer in answers for nbest in answer["translations"]]
    warning = "line 3: 100 tokens, cut to the model's limit of 64"
    assert page.locator("#warnings li").all_inner_texts() == [warning]
    page.locator("#results button").nth(3).click()
    page.wait_for_selector("table.heatmap")
    assert page.locator("#warnings li").all_inner_texts() == [warning]  # until the next translation
    # A request refused for its tokens is split in two until each part is taken.
    too_many = {"error": "text: 2400 source tokens; a request takes at most 2048", "field": "text"}
    page.route("**/translate", lambda route: route.fulfill(status=413, json=too_many)
               if len(route.request.post_data_json["text"]) > 2 else route.fallback())
    del sent[:]
    _translate(page, lines[3:8])
    assert [len(json.loads(body)["text"]) for body in sent] == [5, 3, 2, 1, 2]  # 5 = 3 + 2, 3 = 2 + 1
    assert page.locator("#results li .source").all_inner_texts() == lines[3:8]
    page.close()


def test_evaluate_writes_one_self_contained_explorer_that_opens_offline(run_dir, browser, tmp_path):
    from transformer.app import use
    from transformer.app.schemas import EvaluateConfig
    from transformer.config import AttentionDumpConfig

    toy = run_dir.parent / "toy"
    cfg = EvaluateConfig(run_dir=str(run_dir), src_file=str(toy / "test.src"), ref_file=str(toy / "test.tgt"),
                         eval=BEAM, attention=AttentionDumpConfig(indices=[0, 2], format="html"),
                         output_dir=str(tmp_path / "eval"), device="cpu")
    use.evaluate(cfg)
    page_file = tmp_path / "eval" / "attention" / "explorer.html"
    assert sorted(p.name for p in page_file.parent.glob("*.npz")) == ["test0_hyp.npz", "test2_hyp.npz"]
    assert "http://" not in page_file.read_text() and "https://" not in page_file.read_text()
    from transformer.inference.attention_maps import load_attention_maps
    from transformer.inference.explorer import attention_json

    maps = attention_json(load_attention_maps(page_file.parent / "test2_hyp.npz"))
    page = browser.new_page()
    problems = _watch(page)
    page.goto(page_file.as_uri())
    assert page.locator("#translator").is_hidden() and page.locator("footer").count() == 0  # no server, no API
    page.wait_for_selector("#results li")
    assert page.locator("#results li").count() == 2
    page.locator("#results button").nth(1).focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("table.heatmap")
    assert page.inner_text("#map-title .source") == (toy / "test.src").read_text().splitlines()[2]
    _explore(page, maps, layer=1, head=0)
    assert problems == []
    page.close()


# --------------------------------------------------------------------------------------------------
# The batcher alone, with a decoder that records what it was given
# --------------------------------------------------------------------------------------------------


def _batcher_run(jobs, fail_on: str | None = None, **options):
    """Submit ``jobs`` ((sentences, beam, n_best), all at once) to a Batcher over a fake decoder; returns the
    answers (or exceptions) and the decoder's calls."""
    import asyncio

    from transformer.inference.translator import Translation

    calls = []

    def decode(sentences, beam_size, n_best):
        calls.append((list(sentences), beam_size, n_best))
        if fail_on in sentences:
            raise RuntimeError("the model failed")
        return [[Translation(f"{s}/{beam_size}/{n_best}", -1.0)] for s in sentences]

    async def main():
        decoder = batcher.Batcher(decode, **{"batching": True, "max_wait_s": 0.05, "batch_tokens": 100, **options})
        await decoder.start()
        try:
            return await asyncio.gather(*(decoder.translate(s, b, n, len(s)) for s, b, n in jobs),
                                        return_exceptions=True)
        finally:
            await decoder.stop()

    with ThreadPoolExecutor(1) as thread:  # a loop of its own: Playwright's sync API may hold this thread's
        return thread.submit(asyncio.run, main()).result(), calls


def test_the_batcher_decodes_equal_settings_together_in_arrival_order():
    answers, calls = _batcher_run([(["a"], 4, 1), (["b"], 1, 1), (["c", "d"], 4, 1), (["e"], 1, 1)])
    assert calls == [(["a", "c", "d"], 4, 1), (["b", "e"], 1, 1)]
    assert [[t[0].text for t in answer] for answer in answers] == [["a/4/1"], ["b/1/1"], ["c/4/1", "d/4/1"], ["e/1/1"]]


def test_the_batcher_keeps_batches_under_its_token_budget_and_decodes_alone_when_told():
    _, calls = _batcher_run([([s], 4, 1) for s in "abcde"], batch_tokens=2)
    assert [c[0] for c in calls] == [["a", "b"], ["c", "d"], ["e"]]
    _, calls = _batcher_run([([s], 4, 1) for s in "abc"], batching=False)
    assert [c[0] for c in calls] == [["a"], ["b"], ["c"]]


def test_a_failed_decoding_fails_its_batch_only_and_the_batcher_goes_on():
    answers, calls = _batcher_run([(["a"], 4, 1), (["bad"], 4, 1), (["c"], 1, 1)], fail_on="bad")
    assert isinstance(answers[0], RuntimeError) and isinstance(answers[1], RuntimeError)  # decoded together
    assert answers[2][0][0].text == "c/1/1" and len(calls) == 2
