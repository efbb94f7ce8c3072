// The attention explorer. Two pages use it: the live one served by transformer-serve (translate, then ask the
// server for a translation's attention) and the self-contained file transformer-evaluate writes (the attention of
// chosen sentences embedded as JSON in <script id="attention-data">). Maps are what POST /attention returns:
// source_pieces (S), target_pieces (T: the pieces each decoder position predicts, the last one "</s>"),
// target_input_pieces (T: the pieces the decoder reads, from "<s>"), and encoder [layer][head][S][S],
// decoder [layer][head][T][T], cross [layer][head][T][S]: rows are queries, columns keys.
"use strict";

const TOP_K = 3; // hovering (or tapping) a piece marks this many strongest weights of its row (or column)
const REQUEST_TIMEOUT_S = 60; // a request not answered by then is given up, with a message
const DEFAULT_MAX_SENTENCES = 64; // the server's default per-request limit, used when GET /info did not answer
const INFO_WAIT_MS = 2000; // how long a translation waits for /info's limits before using the defaults
const COLOUR = "25, 80, 200"; // the heat map's colour (RGB); a cell's opacity is its weight / the map's largest

const KINDS = {
  cross: { label: "cross-attention", rows: "target_pieces", cols: "source_pieces",
    rowAxis: "target pieces (queries)", colAxis: "source pieces (keys)" },
  encoder: { label: "encoder self-attention", rows: "source_pieces", cols: "source_pieces",
    rowAxis: "source pieces (queries)", colAxis: "source pieces (keys)" },
  decoder: { label: "decoder self-attention", rows: "target_pieces", cols: "target_input_pieces",
    rowAxis: "target pieces each position predicts (queries)", colAxis: "target pieces the decoder reads (keys)" },
};

// The kind, layer and head the user chose last: kept from one sentence to the next where the new maps have them.
const chosen = { kind: "cross", layer: 0, head: "mean" };

function element(tag, attributes = {}, text = null) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}

// A translation as the page shows it: an empty one as a note, not as a blank line.
function targetNode(text) {
  if (text === "") return element("span", { class: "target note" }, "(empty translation)");
  return element("span", { class: "target" }, text);
}

// The (queries x keys) weights of one head, or their mean over the heads when head is "mean".
function headWeights(maps, kind, layer, head) {
  const heads = maps[kind][layer];
  if (head !== "mean") return heads[Number(head)];
  return heads[0].map((row, q) => row.map((_, k) => heads.reduce((sum, h) => sum + h[q][k], 0) / heads.length));
}

// Indices of the k largest values above 0, largest first (the earlier index first on ties). A weight of 0 is a
// masked key (a future position in decoder self-attention): never among the strongest.
function topIndices(values, k) {
  return values.map((value, index) => [value, index])
    .filter(([value]) => value > 0)
    .sort((a, b) => b[0] - a[0] || a[1] - b[1])
    .slice(0, k)
    .map(([, index]) => index);
}

// Replace the options of a <select> in place (so it keeps the focus), choosing `value`.
function setOptions(node, options, value) {
  node.replaceChildren(...options.map(([key, label]) => element("option", { value: String(key) }, label)));
  node.value = String(value);
}

// A select with its label, kept together on one line however narrow the page.
function control(name, node) {
  const wrap = element("span", { class: "control" });
  wrap.append(element("label", { for: name }, name), node);
  return wrap;
}

// Draw the explorer for one sentence pair (item: source, target, maps) into container. The controls stay while
// the map under them is redrawn, so a select keeps the keyboard focus.
function renderExplorer(container, item) {
  const maps = item.maps;
  container.replaceChildren();
  const title = element("h2", { id: "map-title" });
  title.append(element("span", { class: "source" }, item.source), targetNode(item.target));
  const kind = element("select", { id: "kind", name: "kind" });
  setOptions(kind, Object.entries(KINDS).map(([key, { label }]) => [key, label]), chosen.kind);
  const layer = element("select", { id: "layer", name: "layer" });
  const head = element("select", { id: "head", name: "head" });
  const controls = element("div", { id: "controls" });
  controls.append(control("kind", kind), control("layer", layer), control("head", head));
  const view = element("div", { class: "view" });
  container.append(title, controls, view);
  for (const warning of maps.warnings || []) container.append(element("p", { class: "warning" }, warning));

  // The layers and heads of the chosen kind, keeping the user's choice where this kind has it.
  const fill = () => {
    const layers = maps[kind.value].length;
    const heads = maps[kind.value][0].length;
    setOptions(layer, [...Array(layers).keys()].map((i) => [i, `layer ${i}`]),
      chosen.layer < layers ? chosen.layer : layers - 1);
    setOptions(head, [["mean", `mean of ${heads} heads`], ...[...Array(heads).keys()].map((i) => [i, `head ${i}`])],
      chosen.head === "mean" || Number(chosen.head) < heads ? chosen.head : "mean");
  };
  const draw = () => drawMap(view, maps, kind.value, Number(layer.value), head.value);
  kind.addEventListener("change", () => { chosen.kind = kind.value; fill(); draw(); });
  layer.addEventListener("change", () => { chosen.layer = Number(layer.value); draw(); });
  head.addEventListener("change", () => { chosen.head = head.value; draw(); });
  fill();
  draw();
}

// One heat map, its colour bar and its legend, into view.
function drawMap(view, maps, kindName, layer, head) {
  const kind = KINDS[kindName];
  const rows = maps[kind.rows];
  const cols = maps[kind.cols];
  const weights = headWeights(maps, kindName, layer, head);
  let largest = 0;
  for (const row of weights) for (const weight of row) largest = Math.max(largest, weight);
  const heads = maps[kindName][layer].length;
  const what = head === "mean" ? `mean of ${heads} heads` : `head ${head}`;

  const describe = `${kind.label}, layer ${layer}, ${what}: rows are ${kind.rowAxis}, columns ${kind.colAxis}`;
  const table = element("table", { class: "heatmap", role: "grid", "data-kind": kindName, "data-max": largest });
  table.append(element("caption", {}, describe));
  const headRow = element("tr");
  // The corner names the axes (the caption says the same to a screen reader).
  const corner = element("td", { class: "corner", "aria-hidden": "true" });
  corner.append(element("span", {}, `keys: ${kind.cols.split("_")[0]} →`),
    element("span", {}, `queries: ${kind.rows.split("_")[0]} ↓`));
  headRow.append(corner);
  const colHeads = cols.map((piece, k) => {
    const th = element("th", { scope: "col", "data-col": k, tabindex: -1 });
    th.append(element("span", {}, piece));
    return th;
  });
  headRow.append(...colHeads);
  table.append(element("thead"));
  table.tHead.append(headRow);
  const body = element("tbody");
  const rowHeads = [];
  const cells = weights.map((row, q) => {
    const tr = element("tr");
    rowHeads.push(element("th", { scope: "row", "data-row": q, tabindex: -1 }, rows[q]));
    tr.append(rowHeads[q]);
    const line = row.map((weight, k) => {
      const cell = element("td", { "data-row": q, "data-col": k, "data-weight": weight, tabindex: -1,
        title: `${rows[q]} → ${cols[k]}: ${weight.toFixed(3)}` });
      cell.style.background = `rgba(${COLOUR}, ${largest > 0 ? (weight / largest).toFixed(3) : 0})`;
      return cell;
    });
    tr.append(...line);
    body.append(tr);
    return line;
  });
  table.append(body);

  const readout = element("p", { class: "readout", "aria-live": "polite" }, "\u00a0");
  const clear = () => {
    table.querySelectorAll(".hovered, .linked, .strongest")
      .forEach((node) => node.classList.remove("hovered", "linked", "strongest"));
    readout.textContent = "\u00a0";
  };
  const strongest = (pairs) => pairs.map(([q, k, piece]) => {
    cells[q][k].classList.add("strongest");
    return `${piece} ${weights[q][k].toFixed(3)}`;
  }).join(", ") || "nothing (all weights are 0)";
  // A query piece: the keys it attends to most. A key piece: the queries that attend to it most. A cell: its weight.
  const mark = (target) => {
    clear();
    target.classList.add("hovered");
    if (target.dataset.row !== undefined && target.dataset.col !== undefined) {
      const q = Number(target.dataset.row);
      const k = Number(target.dataset.col);
      rowHeads[q].classList.add("linked");
      colHeads[k].classList.add("linked");
      readout.textContent = `${rows[q]} → ${cols[k]}: ${weights[q][k].toFixed(3)}`;
    } else if (target.dataset.row !== undefined) {
      const q = Number(target.dataset.row);
      const top = topIndices(weights[q], TOP_K);
      top.forEach((k) => colHeads[k].classList.add("linked"));
      readout.textContent = `${rows[q]} attends most to: ${strongest(top.map((k) => [q, k, cols[k]]))}`;
    } else {
      const k = Number(target.dataset.col);
      const top = topIndices(weights.map((row) => row[k]), TOP_K);
      top.forEach((q) => rowHeads[q].classList.add("linked"));
      readout.textContent = `${cols[k]} is attended to most by: ${strongest(top.map((q) => [q, k, rows[q]]))}`;
    }
  };
  // One listener per event for the whole table (a map may hold 128 x 128 cells). A tap (a click) does what hover
  // does, and its marks stay when the pointer leaves the map (a touch screen has no hover to keep them).
  const markable = (event) => event.target.closest("td[data-col], th[data-row], th[data-col]");
  let pinned = null;
  table.addEventListener("mouseover", (event) => {
    const target = markable(event);
    if (target) mark(target);
  });
  table.addEventListener("click", (event) => {
    pinned = markable(event) || pinned;
    if (pinned) mark(pinned);
  });
  table.addEventListener("mouseleave", () => (pinned ? mark(pinned) : clear()));

  // The keyboard: Tab enters the map at one piece or cell (the last one focused), the arrow keys move between the
  // row pieces, the column pieces and the cells, Home and End go to a line's ends; the focused one is marked as a
  // click marks it, and Escape takes the marks away. Row piece q is at column -1, column piece k at row -1.
  const at = (q, k) => (k < 0 ? rowHeads[q] : q < 0 ? colHeads[k] : cells[q][k]);
  let current = (cols.length ? cells[0]?.[0] : null) ?? rowHeads[0] ?? colHeads[0] ?? null;
  if (current) current.tabIndex = 0;
  const moves = {
    ArrowLeft: (q, k) => [q, Math.max(k - 1, q < 0 ? 0 : -1)],
    ArrowRight: (q, k) => [q, Math.min(k + 1, cols.length - 1)],
    ArrowUp: (q, k) => [Math.max(q - 1, k < 0 ? 0 : -1), k],
    ArrowDown: (q, k) => [Math.min(q + 1, rows.length - 1), k],
    Home: (q, k) => [q, q < 0 ? 0 : -1],
    End: (q, k) => [q, cols.length - 1],
  };
  table.addEventListener("keydown", (event) => {
    const target = markable(event);
    if (!target || event.altKey || event.ctrlKey || event.metaKey) return; // the browser's own keys (Alt+Left: back)
    if (event.key === "Escape") {
      pinned = null;
      clear();
      return;
    }
    if (!moves[event.key]) return;
    event.preventDefault(); // the arrows move the focus, not the scroll
    const q = target.dataset.row === undefined ? -1 : Number(target.dataset.row);
    const k = target.dataset.col === undefined ? -1 : Number(target.dataset.col);
    at(...moves[event.key](q, k)).focus();
  });
  table.addEventListener("focusin", (event) => {
    const target = markable(event);
    if (!target) return;
    if (current) current.tabIndex = -1;
    current = target;
    current.tabIndex = 0;
    pinned = target;
    mark(target);
  });

  const wrap = element("div", { class: "heatmap-wrap" });
  wrap.append(table);
  const max = largest.toFixed(3);
  const scale = element("div", { class: "scale", "data-max": largest });
  scale.append(element("span", {}, "0"), element("span", { class: "bar", "aria-hidden": "true" }),
    element("span", { class: "max" }, max),
    element("span", { class: "scale-note" }, `weight; darkest = ${max}, the largest in this map (each map is ` +
      "scaled to its own largest weight: compare colours within a map, numbers across maps)"));
  const legend = element("p", { class: "legend" }, `Hover or tap a row piece to mark the ${TOP_K} keys it ` +
    `attends to most, a column piece for the ${TOP_K} queries that attend to it most, a cell for its weight ` +
    "(weights of 0, such as future positions in decoder self-attention, are never marked). A click or tap keeps " +
    "its marks. By keyboard: Tab into the map, then the arrow keys (Home, End) move between pieces and cells; " +
    "Escape clears the marks.");
  const caption = element("p", { class: "map-caption", "aria-hidden": "true" }, describe); // the caption, shown
  view.replaceChildren(scale, caption, wrap, readout, legend);
}

// A list of translations. With show, each is a button that shows its attention through show(item); without
// (a server that has no attention maps), plain text.
function renderResults(list, items, show) {
  list.replaceChildren();
  items.forEach((item, i) => {
    const li = element("li", { "data-index": i });
    const content = element(show ? "button" : "div", show ? { type: "button", class: "item" } : { class: "item" });
    content.append(element("span", { class: "source" }, item.source), targetNode(item.target));
    if (item.score !== undefined) content.append(element("span", { class: "score" }, `score ${item.score.toFixed(3)}`));
    if (show) {
      content.addEventListener("click", () => {
        list.querySelectorAll("[aria-current]").forEach((node) => node.removeAttribute("aria-current"));
        content.setAttribute("aria-current", "true");
        show(item);
      });
    }
    li.append(content);
    list.append(li);
  });
}

// A request's failure, in the page's words.
class RequestFailure extends Error {
  constructor(message, status = 0, field = null) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

// fetch with a timeout: answers (response, its JSON body) or throws a RequestFailure saying what went wrong.
async function request(path, options = {}) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_S * 1000);
  let response;
  let text;
  try {
    response = await fetch(path, { ...options, signal: controller.signal });
    text = await response.text();
  } catch {
    if (controller.signal.aborted) {
      throw new RequestFailure(`The server did not answer within ${REQUEST_TIMEOUT_S} s. Try again, perhaps with ` +
        "fewer or shorter lines.");
    }
    throw new RequestFailure("The server cannot be reached: check that transformer-serve is still running, " +
      "then try again.");
  } finally {
    clearTimeout(timer);
  }
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    throw new RequestFailure(`The server answered ${response.status} ${response.statusText}.`, response.status);
  }
  if (!response.ok) {
    if (response.status === 503 && body.field === "attention") {
      throw new RequestFailure("Attention maps are not available from this server.", 503, "attention");
    }
    throw new RequestFailure(body.error || `The server answered ${response.status} ${response.statusText}.`,
      response.status, body.field);
  }
  return body;
}

function postJSON(path, payload) {
  return request(path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(payload) });
}

// The server names a request's sentences text[0], text[1], ...: the user knows them by their line number.
function byLine(message, lines) {
  const span = lines.length === 1 ? `line ${lines[0].line}` : `lines ${lines[0].line}–${lines.at(-1).line}`;
  return message.replace(/\btext\[(\d+)\]/g, (whole, i) => (lines[Number(i)] ? `line ${lines[Number(i)].line}` : whole))
    .replace(/^text:/, `${span}:`);
}

// GET /info, shown in the header: resolves to its answer, or to null (with a message) when it failed.
function loadInfo() {
  const line = document.getElementById("info");
  return request("/info").then((info) => {
    const sha = String(info.checkpoint_sha256 || "").slice(0, 12);
    line.textContent = `${info.source_language} → ${info.target_language} · ${info.backend} · ${sha}`;
    if (info.attention === false) {
      const notice = document.getElementById("notice");
      notice.textContent = "Attention maps are not available from this server: it translates, but cannot show " +
        "what the model attends to.";
      notice.hidden = false;
    }
    return info;
  }).catch((error) => {
    line.textContent = `The server's details (GET /info) could not be read: ${error.message}`;
    line.classList.add("error");
    return null;
  });
}

function startLive() {
  const input = document.getElementById("input");
  const button = document.getElementById("translate");
  const status = document.getElementById("status");
  const warnings = document.getElementById("warnings");
  const results = document.getElementById("results");
  const explorer = document.getElementById("explorer");
  const body = document.getElementById("explorer-body");
  const info = loadInfo();
  const say = (text, kind = "") => {
    status.textContent = text;
    status.className = kind;
  };
  const clearMap = () => {
    explorer.hidden = true;
    explorer.classList.remove("stale");
    body.replaceChildren();
  };
  // Bumped by each translation and each click on a sentence: an answer to an earlier one is dropped, so the map
  // shown is always the one of the sentence selected.
  let latest = 0;

  const showAttention = async (item) => {
    const asked = ++latest;
    explorer.classList.add("stale"); // the map shown, if any, is another sentence's until the answer comes
    say(`computing the attention of line ${item.line}…`);
    try {
      // the pieces the model generated, where the server gives them: its text, encoded again, may split otherwise
      const target = item.pieces ? { target_pieces: item.pieces } : { target: item.target };
      const maps = await postJSON("/attention", { source: item.source, ...target });
      if (asked !== latest) return;
      explorer.classList.remove("stale");
      explorer.hidden = false;
      renderExplorer(body, { ...item, maps });
      say("");
    } catch (error) {
      if (asked !== latest) return;
      clearMap();
      say(`Line ${item.line}: ${error.message}`, "error");
    }
  };

  // Send lines in requests of at most limit sentences; one refused for its tokens (413 on "text") is split in two.
  const translateLines = async (lines, limit, total) => {
    const answers = [];
    for (let start = 0; start < lines.length; start += limit) {
      const part = lines.slice(start, start + limit);
      if (total > part.length) say(`translating lines ${part[0].line}–${part.at(-1).line}…`);
      try {
        const answer = await postJSON("/translate", { text: part.map(({ text }) => text) });
        answers.push(...part.map((line, i) => ({ ...line, answer: answer.translations[i][0] })));
        for (const warning of answer.warnings || []) warnings.append(element("li", {}, byLine(warning, part)));
      } catch (error) {
        if (error.status === 413 && error.field === "text" && part.length > 1) {
          answers.push(...await translateLines(part, Math.ceil(part.length / 2), total));
        } else {
          throw new RequestFailure(byLine(error.message, part), error.status, error.field);
        }
      }
    }
    return answers;
  };

  let busy = false;
  const translate = async () => {
    if (busy) return;
    const lines = input.value.split("\n").map((text, i) => ({ text: text.trim(), line: i + 1 }))
      .filter(({ text }) => text);
    if (!lines.length) { // the translations shown stay: they are still those of their sentences
      say("Type a sentence first (one per line).", "error");
      input.focus();
      return;
    }
    ++latest;
    clearMap();
    results.replaceChildren();
    warnings.replaceChildren();
    busy = true;
    button.disabled = true;
    say("translating…");
    try {
      // the server's limits, if /info has answered by now: a slow /info must not hold the translation up
      const late = new Promise((resolve) => setTimeout(() => resolve(null), INFO_WAIT_MS));
      const known = await Promise.race([info, late]);
      const limit = (known && known.limits && known.limits.max_sentences) || DEFAULT_MAX_SENTENCES;
      const attention = !known || known.attention !== false;
      const answers = await translateLines(lines, limit, lines.length);
      const items = answers.map(({ text, line, answer }) => ({ source: text, line, target: answer.text,
        score: answer.score, pieces: answer.pieces }));
      renderResults(results, items, attention ? showAttention : null);
      say(`${items.length} translated` + (attention ? ": choose one to see its attention." : "."));
    } catch (error) {
      say(error.message, "error");
    } finally {
      busy = false;
      button.disabled = false;
    }
  };
  button.addEventListener("click", translate);
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      translate();
    }
  });
}

function startEmbedded(data) {
  const explorer = document.getElementById("explorer");
  const items = data.map((entry, i) => ({ ...entry, line: i + 1 }));
  renderResults(document.getElementById("results"), items, (item) => {
    explorer.hidden = false;
    renderExplorer(document.getElementById("explorer-body"), item);
  });
  document.getElementById("status").textContent = "Choose a sentence to see its attention.";
}

document.addEventListener("DOMContentLoaded", () => {
  const embedded = document.getElementById("attention-data");
  if (embedded) startEmbedded(JSON.parse(embedded.textContent));
  else startLive();
});
