// The attention explorer. Two pages use it: the live one served by transformer-serve (translate, then ask the
// server for a translation's attention) and the self-contained file transformer-evaluate writes (the attention of
// chosen sentences embedded as JSON in <script id="attention-data">). Maps are what POST /attention returns:
// source_pieces (S), target_pieces (T: the pieces each decoder position predicts, the last one "</s>"),
// target_input_pieces (T: the pieces the decoder reads, from "<s>"), and encoder [layer][head][S][S],
// decoder [layer][head][T][T], cross [layer][head][T][S]: rows are queries, columns keys.
"use strict";

const TOP_K = 3; // hovering a piece marks this many strongest weights of its row (or column)

const KINDS = {
  cross: { label: "cross-attention", rows: "target_pieces", cols: "source_pieces" },
  encoder: { label: "encoder self-attention", rows: "source_pieces", cols: "source_pieces" },
  decoder: { label: "decoder self-attention", rows: "target_pieces", cols: "target_input_pieces" },
};

function element(tag, attributes = {}, text = null) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}

// The (queries x keys) weights of one head, or their mean over the heads when head is "mean".
function headWeights(maps, kind, layer, head) {
  const heads = maps[kind][layer];
  if (head !== "mean") return heads[Number(head)];
  return heads[0].map((row, q) => row.map((_, k) => heads.reduce((sum, h) => sum + h[q][k], 0) / heads.length));
}

// Indices of the k largest values, largest first (the earlier index first on ties).
function topIndices(values, k) {
  return values.map((value, index) => [value, index])
    .sort((a, b) => b[0] - a[0] || a[1] - b[1])
    .slice(0, Math.min(k, values.length))
    .map(([, index]) => index);
}

function select(name, options, chosen) {
  const node = element("select", { id: name, name });
  for (const [value, label] of options) {
    const option = element("option", { value: String(value) }, label);
    if (String(value) === String(chosen)) option.selected = true;
    node.append(option);
  }
  return node;
}

// Draw the explorer for one sentence pair into container; returns nothing, re-draws itself on every change.
function renderExplorer(container, maps, state = { kind: "cross", layer: 0, head: "mean" }) {
  container.replaceChildren();
  const layers = maps[state.kind].length;
  const heads = maps[state.kind][0].length;
  state.layer = Math.min(state.layer, layers - 1);
  if (state.head !== "mean" && Number(state.head) >= heads) state.head = "mean";

  const controls = element("div", { id: "controls" });
  const kind = select("kind", Object.entries(KINDS).map(([key, { label }]) => [key, label]), state.kind);
  const layer = select("layer", [...Array(layers).keys()].map((i) => [i, `layer ${i}`]), state.layer);
  const head = select("head", [["mean", "mean of heads"], ...[...Array(heads).keys()].map((i) => [i, `head ${i}`])],
    state.head);
  const redraw = () => renderExplorer(container, maps,
    { kind: kind.value, layer: Number(layer.value), head: head.value });
  for (const node of [kind, layer, head]) node.addEventListener("change", redraw);
  controls.append(element("label", {}, "kind "), kind, element("label", {}, "layer "), layer,
    element("label", {}, "head "), head);
  container.append(controls);

  const { rows, cols } = KINDS[state.kind];
  const weights = headWeights(maps, state.kind, state.layer, state.head);
  let largest = 1e-9;
  for (const row of weights) for (const weight of row) largest = Math.max(largest, weight);
  const table = element("table", { class: "heatmap", "data-kind": state.kind });
  const headRow = element("tr");
  headRow.append(element("th"));
  maps[cols].forEach((piece, k) => headRow.append(element("th", { "data-col": k }, piece)));
  table.append(element("thead"));
  table.tHead.append(headRow);
  const body = element("tbody");
  weights.forEach((row, q) => {
    const tr = element("tr");
    tr.append(element("th", { "data-row": q }, maps[rows][q]));
    row.forEach((weight, k) => {
      const cell = element("td", { "data-row": q, "data-col": k, "data-weight": weight,
        title: `${maps[rows][q]} → ${maps[cols][k]}: ${weight.toFixed(3)}` });
      cell.style.background = `rgba(25, 80, 200, ${(weight / largest).toFixed(3)})`;
      tr.append(cell);
    });
    body.append(tr);
  });
  table.append(body);

  const clear = () => table.querySelectorAll(".hovered, .linked, .strongest")
    .forEach((node) => node.classList.remove("hovered", "linked", "strongest"));
  // A query piece: the keys it attends to most. A key piece: the queries that attend to it most.
  table.querySelectorAll("tbody th").forEach((th) => {
    const q = Number(th.dataset.row);
    th.addEventListener("mouseenter", () => {
      th.classList.add("hovered");
      for (const k of topIndices(weights[q], TOP_K)) {
        table.querySelector(`td[data-row="${q}"][data-col="${k}"]`).classList.add("strongest");
        table.querySelector(`thead th[data-col="${k}"]`).classList.add("linked");
      }
    });
    th.addEventListener("mouseleave", clear);
  });
  table.querySelectorAll("thead th[data-col]").forEach((th) => {
    const k = Number(th.dataset.col);
    th.addEventListener("mouseenter", () => {
      th.classList.add("hovered");
      for (const q of topIndices(weights.map((row) => row[k]), TOP_K)) {
        table.querySelector(`td[data-row="${q}"][data-col="${k}"]`).classList.add("strongest");
        table.querySelector(`tbody th[data-row="${q}"]`).classList.add("linked");
      }
    });
    th.addEventListener("mouseleave", clear);
  });
  const wrap = element("div", { class: "heatmap-wrap" });
  wrap.append(table);
  container.append(wrap);
  const what = state.head === "mean" ? `mean of ${heads} heads` : `head ${state.head}`;
  container.append(element("p", { class: "legend" }, `${KINDS[state.kind].label}, layer ${state.layer}, ${what}: ` +
    `rows are queries, columns keys; darker is more weight. Hover a piece to mark the ${TOP_K} weights it gives ` +
    "(a row) or receives (a column) most."));
  for (const warning of maps.warnings || []) container.append(element("p", { class: "warning" }, warning));
}

// A list of translations; clicking one shows its attention through show(item).
function renderResults(list, items, show) {
  list.replaceChildren();
  items.forEach((item, i) => {
    const li = element("li", { "data-index": i });
    li.append(element("span", { class: "source" }, item.source));
    li.append(element("span", { class: "target" }, item.target));
    if (item.score !== undefined) li.append(element("span", { class: "score" }, `score ${item.score.toFixed(3)}`));
    li.addEventListener("click", () => {
      list.querySelectorAll("li.selected").forEach((node) => node.classList.remove("selected"));
      li.classList.add("selected");
      show(item);
    });
    list.append(li);
  });
}

async function postJSON(path, payload) {
  const response = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(payload) });
  let body;
  try {
    body = await response.json();
  } catch {
    throw new Error(`${response.status} ${response.statusText}`);
  }
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function startLive() {
  const input = document.getElementById("input");
  const status = document.getElementById("status");
  const results = document.getElementById("results");
  const explorer = document.getElementById("explorer");
  let latest = 0; // the answer to the latest click wins, whatever order the answers come in
  const showAttention = async (item) => {
    const asked = ++latest;
    status.textContent = "computing attention…";
    status.className = "";
    try {
      const maps = await postJSON("/attention", { source: item.source, target: item.target });
      if (asked !== latest) return;
      explorer.hidden = false;
      renderExplorer(document.getElementById("explorer-body"), maps);
      status.textContent = "";
    } catch (error) {
      status.textContent = error.message;
      status.className = "error";
    }
  };
  document.getElementById("translate").addEventListener("click", async () => {
    const lines = input.value.split("\n").map((line) => line.trim()).filter((line) => line);
    if (!lines.length) return;
    status.textContent = "translating…";
    status.className = "";
    try {
      const body = await postJSON("/translate", { text: lines });
      const items = lines.map((source, i) => ({ source, target: body.translations[i][0].text,
        score: body.translations[i][0].score }));
      renderResults(results, items, showAttention);
      status.textContent = (body.warnings || []).join(" ");
      status.className = body.warnings && body.warnings.length ? "warning" : "";
    } catch (error) {
      status.textContent = error.message;
      status.className = "error";
    }
  });
  fetch("/info").then((r) => r.json()).then((info) => {
    document.getElementById("info").textContent =
      `${info.source_language} → ${info.target_language} · ${info.backend} · ${info.checkpoint_sha256.slice(0, 12)}`;
  });
}

function startEmbedded(data) {
  const explorer = document.getElementById("explorer");
  renderResults(document.getElementById("results"), data, (item) => {
    explorer.hidden = false;
    renderExplorer(document.getElementById("explorer-body"), item.maps);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const embedded = document.getElementById("attention-data");
  if (embedded) startEmbedded(JSON.parse(embedded.textContent));
  else startLive();
});
