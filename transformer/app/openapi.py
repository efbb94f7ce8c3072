"""What the OpenAPI page of ``transformer-serve`` (``/docs``) shows of its API: each endpoint's request body and its
answers, the refusals in the ``{"error", "field"}`` shape included. The handlers read and check the body themselves
(:mod:`.http_requests`), to name the field at fault in their own words; these schemas describe, they do not check."""

from __future__ import annotations

from typing import Any

from transformer.app.http_requests import MAX_BEAM

_STRINGS = {"type": "array", "items": {"type": "string"}}
_NUMBERS = {"type": "array", "items": {"type": "number"}}
_MAPS = {"type": "array", "description": "[layer][head][query][key] attention weights",
         "items": {"type": "array", "items": {"type": "array", "items": _NUMBERS}}}
TRANSLATED = {"type": "object", "required": ["translations", "warnings"], "properties": {
    "translations": {"type": "array", "description": "per sentence, its n_best translations, best first",
                     "items": {"type": "array", "items": {"type": "object", "required": ["text", "score", "pieces"],
                                                          "properties": {"text": {"type": "string"},
                                                                         "score": {"type": "number"},
                                                                         "pieces": _STRINGS}}}},
    "warnings": _STRINGS}}
ATTENDED = {"type": "object", "properties": {
    "source_pieces": _STRINGS, "target_pieces": _STRINGS, "target_input_pieces": _STRINGS,
    "encoder": _MAPS, "decoder": _MAPS, "cross": _MAPS, "warnings": _STRINGS}}
_REFUSED = {400: "the body is not UTF-8 or not JSON", 403: "a browser sent it from a page of another site",
            413: "the body, the sentences or the tokens exceed a limit",
            415: "the body is declared as something other than JSON in UTF-8, or compressed",
            422: "a field is missing, of the wrong type or out of range", 503: "attention maps are not available"}


def responses(answer: dict[str, Any], *refusals: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI page's responses: the answer's schema, and each refusal in the ``{"error", "field"}`` shape."""
    error = {"type": "object", "required": ["error", "field"],
             "properties": {"error": {"type": "string"}, "field": {"type": ["string", "null"]}}}
    return {200: {"description": "the answer", "content": {"application/json": {"schema": answer}}},
            **{status: {"description": _REFUSED[status], "content": {"application/json": {"schema": error}}}
               for status in refusals}}


def body_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """The request body for the OpenAPI page (the handlers read and check the body themselves, to name the field
    at fault in their own words)."""
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


TRANSLATE_BODY = body_schema({
    "text": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
    "beam_size": {"type": "integer", "minimum": 1, "maximum": MAX_BEAM},
    "n_best": {"type": "integer", "minimum": 1}}, ["text"])
TRANSLATE_ANSWERS = responses(TRANSLATED, 400, 403, 413, 415, 422)
ATTENTION_BODY = body_schema(
    {"source": {"type": "string"}, "target": {"type": "string"},
     "target_pieces": {"type": "array", "items": {"type": "string"},
                       "description": "the target as the pieces /translate returns (instead of target)"}},
    ["source"])
ATTENTION_ANSWERS = responses(ATTENDED, 400, 403, 413, 415, 422, 503)
