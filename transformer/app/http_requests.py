"""What ``transformer-serve`` accepts: a request body read within its size limit, parsed as a JSON object, and its
fields checked one by one; every refusal a :class:`RequestError` naming the field at fault, which the server answers
as ``{"error": "<field>: <what is wrong>", "field": "<field>"}`` with the error's HTTP status."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

MAX_BEAM = 64  # a request's beam_size at most
MAX_BODY_BYTES = 1 << 20  # a request body at most (its sentences are limited again, in tokens)


class RequestError(Exception):
    """A request the server refuses: HTTP ``status``, the ``field`` at fault and what is wrong with it."""

    def __init__(self, status: int, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.status, self.field = status, field_name


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused with 403 when a browser sends it from another site's page, with 415 when it is
    declared as something other than JSON (or compressed) and with 413 past ``limit`` bytes, before more of it is
    read."""
    _not_from_another_site(request.headers.get("sec-fetch-site"))
    _json_declared(request.headers.get("content-type"))
    _not_compressed(request.headers.get("content-encoding"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "body", f"{declared} bytes; a request takes at most {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, "body", f"more than {limit} bytes; a request takes at most {limit}")
    except ClientDisconnect:  # nobody is left to answer: a refusal, not a failure of the server (no traceback)
        raise RequestError(400, "body", "the client left before sending all of it") from None
    return bytes(body)


def _not_from_another_site(fetch_site: str | None) -> None:
    """Refuse a request a browser sends from another site's page (``Sec-Fetch-Site``: ``cross-site``, or
    ``same-site``: another port of localhost is the same site): such a page may send a body the browser does not
    ask the server about first, and it would have this server decode for it. The explorer page is this server's own
    (``same-origin``); clients that are not browsers send no such header."""
    if fetch_site in ("cross-site", "same-site"):
        raise RequestError(403, "Sec-Fetch-Site", f"is {fetch_site!r}: the server answers its own page and clients "
                                                  "that are not browsers, not pages of other sites")


def _json_declared(content_type: str | None) -> None:
    """Refuse a body declared as anything but JSON (``application/json`` or ``application/<x>+json``): a form or
    ``text/plain`` is what a page of another site may send without the browser asking the server first. A body
    with no Content-Type at all is read as JSON."""
    if content_type is None:
        return
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not (media_type.startswith("application/")
                                                  and media_type.endswith("+json")):
        raise RequestError(415, "Content-Type", f"is {content_type!r}; send the body as JSON with "
                                                "'Content-Type: application/json'")
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise RequestError(415, "Content-Type", f"declares charset {charset!r}; JSON is read as UTF-8 (RFC 8259): "
                                                    "send it so, with charset=utf-8 or none")


def _not_compressed(content_encoding: str | None) -> None:
    """Refuse a compressed body (``Content-Encoding: gzip``): the server reads bodies as they are sent."""
    if content_encoding is not None and content_encoding.strip().lower() not in ("", "identity"):
        raise RequestError(415, "Content-Encoding", f"is {content_encoding!r}; the server reads bodies uncompressed: "
                                                    "send it without Content-Encoding")


def parse_body(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a :class:`RequestError` naming what is wrong with it. A UTF-8 byte-order
    mark at the start is dropped, as ``transformer-translate`` drops it (some Windows tools write one)."""
    try:
        text = body.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        raise RequestError(400, "body", f"is not valid UTF-8 (at byte offset {error.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_object_without_repeats, parse_constant=_not_json)
    except RequestError:
        raise
    except json.JSONDecodeError as error:
        raise RequestError(400, "body", f"is not valid JSON: {error.msg} (line {error.lineno} column "
                                        f"{error.colno})") from None
    except RecursionError:  # [[[[... thousands deep
        raise RequestError(400, "body", "nests lists or objects deeper than the server reads") from None
    except ValueError:  # an integer of more digits than Python converts from text
        raise RequestError(400, "body", "holds a number of more digits than the server reads "
                                        f"({sys.get_int_max_str_digits()})") from None
    if not isinstance(value, dict):
        raise RequestError(422, "body", f"must be a JSON object, got {_json_type(value)}")
    return value


def _object_without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: ``{"text": "a", "text": "b"}`` is refused, not read as "b"."""
    value: dict[str, Any] = {}
    for key, item in pairs:  # one pass: a body may hold ~100k keys
        if key in value:
            raise RequestError(400, key, "is given twice in one object; give it once")
        value[key] = item
    return value


def _not_json(name: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity``: Python's JSON reader takes them, JSON does not."""
    raise RequestError(400, "body", f"is not valid JSON: {name} is not a JSON value")


def _json_type(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def only_fields(request: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for key in request:
        if key not in allowed:
            raise RequestError(422, key, f"is not a field of this request (fields: {', '.join(allowed)})")


def text_field(request: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = request.get(name)
    if value is None and not required:
        return None
    if value is None:
        raise RequestError(422, name, "is required")
    if not isinstance(value, str):
        raise RequestError(422, name, f"must be a string, got {_json_type(value)}")
    return _encodable(value, name)


def _encodable(text: str, field: str) -> str:
    """``text`` if it is valid Unicode; JSON's ``\\ud800`` escapes can make a lone surrogate, which no tokenizer
    takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(422, field, f"holds an unpaired surrogate {text[error.start]!r} at character "
                                       f"{error.start}: not valid Unicode") from None
    return text


def int_field(request: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = request.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) <= high:
        value = int(value)  # JSON has numbers only: 4.0 is 4
    if isinstance(value, bool) or not isinstance(value, int):
        got = value if isinstance(value, float) else _json_type(value)
        raise RequestError(422, name, f"must be an integer, got {got}")
    if not low <= value <= high:
        raise RequestError(422, name, f"must be in {low}..{high}, got {value}")
    return value


def parse_sentences(request: dict[str, Any]) -> list[str]:
    """``text``: one string or a non-empty list of strings."""
    text = request.get("text")
    if text is None:
        raise RequestError(422, "text", "is required: a string or a list of strings")
    if isinstance(text, str):
        return [_encodable(text, "text")]
    if not isinstance(text, list):
        raise RequestError(422, "text", f"must be a string or a list of strings, got {_json_type(text)}")
    if not text:
        raise RequestError(422, "text", "is an empty list: give at least one sentence")
    for i, item in enumerate(text):
        if not isinstance(item, str):
            raise RequestError(422, f"text[{i}]", f"must be a string, got {_json_type(item)}")
        _encodable(item, f"text[{i}]")
    return text


async def unless_client_leaves(request: Request, answer: Any) -> Any:
    """Await the coroutine ``answer``, cancelled if the client disconnects first (its queued job is then dropped).

    Called once the body is read: the server's next message on the request is then its disconnect."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.ensure_future(answer), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and watch.exception() is None:
            raise RequestError(499, "client", "disconnected before the answer was ready")  # for the log: none reads it
        return await work  # done, or the watch failed: the answer still counts
    finally:
        watch.cancel()
        work.cancel()  # nothing when it is done; a job still queued is dropped
