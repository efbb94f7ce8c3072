"""The attention explorer: attention maps as JSON, and the web page that explores them per kind, layer and head.

One page, two ways: :func:`live_page` is what ``transformer-serve`` serves at ``/`` (it translates through the
server and asks ``POST /attention`` for a translation's maps; its script and style are served from
``/static``); :func:`standalone_page` is one self-contained HTML file with the maps of chosen sentences embedded,
which ``transformer-evaluate attention.format=html`` writes, to share and open offline. Both run
``explorer_assets/explorer.js``, written for this app, with no library and nothing fetched from elsewhere.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # annotations only: attention_maps writes pages with this module
    from transformer.inference.attention_maps import AttentionMaps

ASSETS = Path(__file__).parent / "explorer_assets"
DECIMALS = 6  # weights in the JSON: enough to rank them, a third of float32's repr


def attention_json(maps: AttentionMaps, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """What ``POST /attention`` answers: the pieces and ``[layer][head][query][key]`` weights of each kind."""

    def nested(weights: np.ndarray) -> list:
        return np.round(weights.astype(np.float64), DECIMALS).tolist()

    return {
        "source_pieces": list(maps.src_pieces),
        "target_pieces": list(maps.tgt_pieces),
        "target_input_pieces": list(maps.tgt_input_pieces),
        "encoder": nested(maps.encoder),
        "decoder": nested(maps.decoder_self),
        "cross": nested(maps.cross),
        "warnings": list(warnings),
    }


# The served page's footer: the API's own pages (the offline file has no server, so no footer).
LIVE_FOOTER = ('<footer>API: <a href="/openapi.json">schema (OpenAPI JSON)</a> · <a href="/docs">interactive '
               "docs</a> (loads Swagger UI from a CDN: needs internet)</footer>")


def _page(title: str, info: str, style: str, script: str, data: str, live: bool) -> str:
    template = (ASSETS / "index.html").read_text(encoding="utf-8")
    return template.format(title=html.escape(title), info=html.escape(info), style=style, script=script, data=data,
                           translator_hidden="" if live else " hidden", footer=LIVE_FOOTER if live else "")


def live_page(title: str = "Translate and explore attention") -> str:
    """The page ``transformer-serve`` serves at ``/`` (assets from ``/static``)."""
    return _page(title, "", '<link rel="stylesheet" href="/static/explorer.css">',
                 '<script src="/static/explorer.js"></script>', "", live=True)


def standalone_page(entries: Sequence[dict[str, Any]], title: str = "Attention explorer", info: str = "") -> str:
    """One HTML file holding the explorer, its style and the maps of ``entries`` (each ``source``, ``target``
    and ``maps``, the latter from :func:`attention_json`)."""
    # No "<", ">" or "&" in the data block: a sentence holding "<!--<script>" could otherwise keep the browser from
    # seeing where the block ends. JSON reads the escapes back as the characters.
    data = json.dumps(list(entries), ensure_ascii=False)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    style = (ASSETS / "explorer.css").read_text(encoding="utf-8")
    script = (ASSETS / "explorer.js").read_text(encoding="utf-8").replace("</", "<\\/")
    return _page(title, info, f"<style>\n{style}</style>", f"<script>\n{script}</script>",
                 f'<script id="attention-data" type="application/json">{data}</script>', live=False)
