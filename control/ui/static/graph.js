// The service graph: a layered layout (namespaces as bands, callers left of what they call)
// and its SVG. Every string from the data goes into the DOM through textContent or
// setAttribute, never as markup.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const COL = 200;      // width of one rank column
  const ROW = 46;       // height of one node row
  const MAX_ROWS = 24;  // a taller column wraps into sub-columns
  const BAND_HEAD = 34; // room for the namespace's name
  const BAND_GAP = 18;
  // More nodes or edges than this: each edge is one path and each node one shape (no
  // labels, lock marks or tooltips; the details panel has them), so that a mesh of
  // thousands of workloads still draws in well under a second.
  const DENSE_NODES = 400;
  const DENSE_EDGES = 600;

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    if (parent) parent.appendChild(e);
    return e;
  }

  // Longest-path ranks over the graph with its back edges (found by DFS) left out.
  function ranks(nodes, edges) {
    const index = new Map();
    nodes.forEach((n, i) => index.set(n.id, i));
    const out = nodes.map(() => []);
    for (const e of edges) {
      const s = index.get(e.source), t = index.get(e.target);
      if (s !== undefined && t !== undefined && s !== t) out[s].push(t);
    }
    const state = new Uint8Array(nodes.length); // 0 new, 1 on the stack, 2 done
    const dag = nodes.map(() => []);
    for (let root = 0; root < nodes.length; root++) {
      if (state[root]) continue;
      const stack = [[root, 0]];
      state[root] = 1;
      while (stack.length) {
        const top = stack[stack.length - 1];
        const [v, i] = top;
        if (i < out[v].length) {
          top[1] = i + 1;
          const w = out[v][i];
          if (state[w] === 1) continue; // back edge: drawn, not ranked
          dag[v].push(w);
          if (state[w] === 0) { state[w] = 1; stack.push([w, 0]); }
        } else {
          state[v] = 2;
          stack.pop();
        }
      }
    }
    const indeg = new Int32Array(nodes.length);
    for (const targets of dag) for (const t of targets) indeg[t]++;
    const rank = new Int32Array(nodes.length);
    const queue = [];
    for (let i = 0; i < nodes.length; i++) if (!indeg[i]) queue.push(i);
    for (let q = 0; q < queue.length; q++) {
      const v = queue[q];
      for (const w of dag[v]) {
        if (rank[v] + 1 > rank[w]) rank[w] = rank[v] + 1;
        if (--indeg[w] === 0) queue.push(w);
      }
    }
    return rank;
  }

  function layout(nodes, edges) {
    const rank = ranks(nodes, edges);
    const bands = new Map(); // namespace -> rank -> [node index]
    nodes.forEach((n, i) => {
      const ns = n.namespace || "";
      if (!bands.has(ns)) bands.set(ns, new Map());
      const byRank = bands.get(ns);
      if (!byRank.has(rank[i])) byRank.set(rank[i], []);
      byRank.get(rank[i]).push(i);
    });
    const names = [...bands.keys()].sort((a, b) => (a === "") - (b === "") || a.localeCompare(b));
    let maxRank = 0;
    for (let i = 0; i < rank.length; i++) if (rank[i] > maxRank) maxRank = rank[i];
    const subCols = new Int32Array(maxRank + 1).fill(1);
    for (const byRank of bands.values())
      for (const [r, list] of byRank) subCols[r] = Math.max(subCols[r], Math.ceil(list.length / MAX_ROWS));
    const x0 = new Float64Array(maxRank + 2);
    for (let r = 0; r <= maxRank; r++) x0[r + 1] = x0[r] + subCols[r] * COL;
    const pos = new Map();
    const boxes = [];
    let y = 0;
    for (const ns of names) {
      const byRank = bands.get(ns);
      let rows = 1;
      for (const list of byRank.values()) rows = Math.max(rows, Math.min(list.length, MAX_ROWS));
      const top = y;
      for (const [r, list] of byRank) {
        list.sort((a, b) => (nodes[a].kind + nodes[a].name).localeCompare(nodes[b].kind + nodes[b].name));
        list.forEach((i, k) => {
          pos.set(nodes[i].id, {
            x: 130 + x0[r] + Math.floor(k / MAX_ROWS) * COL,
            y: top + BAND_HEAD + (k % MAX_ROWS) * ROW + ROW / 2,
          });
        });
      }
      const height = BAND_HEAD + rows * ROW + 8;
      boxes.push({ ns, y: top, height });
      y += height + BAND_GAP;
    }
    return { pos, boxes, width: 130 + x0[maxRank + 1], height: Math.max(y, 100) };
  }

  function severity(errorRate) {
    if (errorRate === null || errorRate === undefined) return "ok";
    if (errorRate >= 0.2) return "bad";
    if (errorRate > 0.001) return "warn";
    return "ok";
  }

  function edgeClass(e) {
    if (!e.rps && (e.tcp_sent_bps || e.tcp_received_bps)) return "tcp";
    return severity(e.error_rate);
  }

  function fmtRate(v) {
    if (v >= 100) return v.toFixed(0);
    if (v >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  function fmtBytes(v) {
    const units = ["B/s", "kB/s", "MB/s", "GB/s"];
    let i = 0;
    while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
    return (v >= 10 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  }

  function edgeLabel(e) {
    if (e.rps) {
      const err = e.error_rate ? " · " + (100 * e.error_rate).toFixed(1) + "% err" : "";
      return fmtRate(e.rps) + " rps" + err;
    }
    return fmtBytes((e.tcp_sent_bps || 0) + (e.tcp_received_bps || 0));
  }

  function lock(parent, x, y) {
    const g = el("g", { class: "edge-lock", transform: `translate(${x},${y})` }, parent);
    el("rect", { x: -4, y: -1, width: 8, height: 6, rx: 1 }, g);
    el("path", { d: "M-2.5,-1 v-2 a2.5,2.5 0 0 1 5,0 v2" }, g);
    const t = el("title", {}, g);
    t.textContent = "mutual TLS";
    return g;
  }

  function truncate(s, n) { return s.length > n ? s.slice(0, n - 1) + "…" : s; }

  // Draws the graph into `svg`; `onPick(kind, id)` on a click. Returns a view that `update`
  // keeps when the set of nodes and edges is the same (numbers and colours change in place).
  function render(svg, data, onPick, previous) {
    const key = data.nodes.map((n) => n.id).join("\n") + "\n\n" + data.edges.map((e) => e.id).join("\n");
    if (previous && previous.key === key) {
      update(previous, data);
      return previous;
    }
    const { pos, boxes, width, height } = layout(data.nodes, data.edges);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const dense = data.nodes.length > DENSE_NODES || data.edges.length > DENSE_EDGES;
    svg.classList.toggle("dense", dense);
    // One listener for every node and edge (thousands of them in a large mesh).
    svg.onclick = (ev) => {
      const hit = ev.target instanceof Element ? ev.target.closest("[data-id]") : null;
      if (!hit) onPick(null);
      else onPick(hit.classList.contains("edge") ? "edge" : "node", hit.getAttribute("data-id"));
    };
    const root = el("g", { class: "root" });
    const frag = document.createDocumentFragment();
    frag.appendChild(root);
    for (const b of boxes) {
      el("rect", { class: "ns-box", x: 10, y: b.y, width: width - 20, height: b.height, rx: 8 }, root);
      const label = el("text", { class: "ns-label", x: 22, y: b.y + 20 }, root);
      label.textContent = b.ns || "(outside the mesh)";
    }
    const edgeEls = new Map();
    const edgeLayer = el("g", { class: "edges" }, root);
    for (const e of data.edges) {
      const a = pos.get(e.source), b = pos.get(e.target);
      if (!a || !b) continue;
      const g = el("g", { class: "edge " + edgeClass(e), "data-id": e.id }, edgeLayer);
      let d, mx, my;
      if (b.x > a.x) {
        const c = (b.x - a.x) / 2;
        d = `M${a.x + 14},${a.y} C${a.x + c},${a.y} ${b.x - c},${b.y} ${b.x - 14},${b.y}`;
        // The label sits nearer the caller, where edges into one node have not met yet.
        const t = 0.4, u = 1 - t;
        mx = u * u * u * (a.x + 14) + 3 * u * u * t * (a.x + c) + 3 * u * t * t * (b.x - c) + t * t * t * (b.x - 14);
        my = (u * u * u + 3 * u * u * t) * a.y + (3 * u * t * t + t * t * t) * b.y;
      } else {
        const lift = 40 + Math.abs(a.x - b.x) / 4;
        d = `M${a.x},${a.y - 14} C${a.x},${a.y - lift} ${b.x},${b.y - lift} ${b.x},${b.y - 14}`;
        mx = (a.x + b.x) / 2; my = Math.min(a.y, b.y) - lift * 0.75;
      }
      if (dense) {
        el("path", { class: "line", d }, g);
        edgeEls.set(e.id, { g, text: null, mark: null });
        continue;
      }
      el("path", { class: "hit", d }, g);
      el("path", { class: "line", d, "marker-end": "url(#arrow)" }, g);
      const text = el("text", { x: mx, y: my - 5, "text-anchor": "middle" }, g);
      text.textContent = edgeLabel(e);
      const mark = lock(g, mx, my + 6);
      mark.style.display = e.mtls ? "" : "none";
      const tip = el("title", {}, g);
      tip.textContent = e.source + " → " + e.target;
      edgeEls.set(e.id, { g, text, mark });
    }
    const nodeEls = new Map();
    const nodeLayer = el("g", { class: "nodes" }, root);
    for (const n of data.nodes) {
      const p = pos.get(n.id);
      const g = el("g", { class: "node " + n.kind, "data-id": n.id, transform: `translate(${p.x},${p.y})` }, nodeLayer);
      if (n.kind === "service") el("rect", { x: -12, y: -12, width: 24, height: 24, rx: 5, transform: "rotate(45)" }, g);
      else el("circle", { r: 12 }, g);
      nodeEls.set(n.id, { g });
      if (dense) continue;
      const label = el("text", { x: 0, y: 26, "text-anchor": "middle" }, g);
      label.textContent = truncate(n.name, 28);
      const tip = el("title", {}, g);
      tip.textContent = (n.kind === "service" ? "service " : n.kind === "workload" ? "workload " : "") +
        (n.namespace ? n.namespace + "/" : "") + n.name;
    }
    const defs = el("defs", {}, svg);
    const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 10, markerHeight: 10, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" }, defs);
    el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#56637a" }, marker);
    svg.appendChild(frag);
    const view = { key, edgeEls, nodeEls, width, height, root };
    update(view, data);
    return view;
  }

  function update(view, data) {
    for (const e of data.edges) {
      const v = view.edgeEls.get(e.id);
      if (!v) continue;
      v.g.setAttribute("class", "edge " + edgeClass(e) + (e.mtls ? " mtls" : "") + (v.g.classList.contains("selected") ? " selected" : ""));
      if (v.text) v.text.textContent = edgeLabel(e);
      if (v.mark) v.mark.style.display = e.mtls ? "" : "none";
      v.g.dataset.rps = String(e.rps);
      v.g.dataset.errorRate = e.error_rate === null ? "" : String(e.error_rate);
      v.g.dataset.mtls = String(e.mtls);
    }
    for (const n of data.nodes) {
      const v = view.nodeEls.get(n.id);
      if (!v) continue;
      const sel = v.g.classList.contains("selected") ? " selected" : "";
      v.g.setAttribute("class", "node " + n.kind + " " + severity(n.error_rate_in) + sel);
    }
  }

  window.MeshGraph = { layout, render, severity, fmtRate, fmtBytes };
})();
