// The dashboard page: three views over /ui/api/*, refreshed every second without a reload.
// Every string from the API reaches the DOM through textContent (or a checked attribute),
// never as markup: names, labels and NACK messages are whatever the mesh's users wrote.
"use strict";

(function () {
  const POLL_MS = 1000;
  const $ = (id) => document.getElementById(id);
  const state = {
    view: "graph",
    namespaces: new Set(),
    selected: null, // {kind: "node"|"edge", id}
    graphView: null,
    viewBox: null,
    busy: false,
    again: false,
    userMoved: false,
    panned: false,
    timer: 0,
    specKey: "",
  };

  function h(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); }

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
    const s = q.toString();
    return s ? "?" + s : "";
  }

  async function api(path, params) {
    const response = await fetch("/ui/api/" + path + query(params || {}), { cache: "no-store" });
    const text = await response.text();
    let body;
    try { body = JSON.parse(text); } catch (_) { body = { error: text.trim() || response.statusText }; }
    if (!response.ok) throw new Error(body.error || "HTTP " + response.status);
    return body;
  }

  function setStatus(text, isError) {
    const s = $("status");
    s.textContent = text;
    s.classList.toggle("error", !!isError);
  }

  function windowParam() { return $("window").value; }
  function namespaceParam() { return $("namespace").value; }

  function learnNamespaces(list) {
    let added = false;
    for (const ns of list || []) if (ns && !state.namespaces.has(ns)) { state.namespaces.add(ns); added = true; }
    if (!added) return;
    const select = $("namespace");
    const current = select.value;
    while (select.options.length > 1) select.remove(1);
    for (const ns of [...state.namespaces].sort()) {
      const o = document.createElement("option");
      o.value = ns;
      o.textContent = ns;
      select.appendChild(o);
    }
    select.value = current;
  }

  // --- graph ----------------------------------------------------------------------------

  function applyViewBox() {
    const v = state.viewBox;
    if (v) $("graph").setAttribute("viewBox", `${v.x} ${v.y} ${v.w} ${v.h}`);
  }

  function fit(view) {
    state.viewBox = { x: 0, y: 0, w: Math.max(view.width, 400), h: Math.max(view.height, 300) };
    applyViewBox();
  }

  function setupPanZoom() {
    const svg = $("graph");
    svg.addEventListener("wheel", (ev) => {
      if (!state.viewBox) return;
      ev.preventDefault();
      const r = svg.getBoundingClientRect();
      const v = state.viewBox;
      const scale = ev.deltaY > 0 ? 1.15 : 1 / 1.15;
      const fx = (ev.clientX - r.left) / r.width, fy = (ev.clientY - r.top) / r.height;
      const w = v.w * scale, hh = v.h * scale;
      state.viewBox = { x: v.x + (v.w - w) * fx, y: v.y + (v.h - hh) * fy, w, h: hh };
      svg.classList.toggle("zoomed", w < 1500);
      state.userMoved = true;
      applyViewBox();
    }, { passive: false });
    let drag = null;
    svg.addEventListener("mousedown", (ev) => { if (state.viewBox) drag = { x: ev.clientX, y: ev.clientY, v: { ...state.viewBox } }; });
    window.addEventListener("mouseup", (ev) => {
      // A pan ends in a click on the background; that click is not "deselect".
      if (drag && Math.abs(ev.clientX - drag.x) + Math.abs(ev.clientY - drag.y) > 4) state.panned = true;
      drag = null;
    });
    window.addEventListener("mousemove", (ev) => {
      if (!drag) return;
      const r = svg.getBoundingClientRect();
      const k = Math.max(drag.v.w / r.width, drag.v.h / r.height);
      state.viewBox = { ...drag.v, x: drag.v.x - (ev.clientX - drag.x) * k, y: drag.v.y - (ev.clientY - drag.y) * k };
      state.userMoved = true;
      applyViewBox();
    });
  }

  async function refreshGraph() {
    const data = await api("graph", { window: windowParam(), namespace: namespaceParam() });
    learnNamespaces(data.namespaces);
    const empty = $("graph-empty");
    if (!data.nodes.length) {
      empty.hidden = false;
      empty.textContent = data.collecting
        ? "Collecting metrics… (the first rates appear after two scrapes)"
        : "No traffic in the last " + data.window + " s.";
    } else {
      empty.hidden = true;
    }
    const first = !state.graphView;
    const before = state.graphView;
    state.graphView = MeshGraph.render($("graph"), data, pick, state.graphView);
    // A new shape is fitted to the window unless the user zoomed or panned.
    if (first || (before !== state.graphView && !state.userMoved)) fit(state.graphView);
    markSelected();
    // For benchmarks and tests: when the first non-empty graph was on screen.
    if (data.nodes.length && !performance.getEntriesByName("graph-rendered").length)
      performance.mark("graph-rendered", { detail: { nodes: data.nodes.length, edges: data.edges.length } });
    const failed = Object.keys(data.errors || {}).length;
    setStatus(
      `${data.nodes.length} nodes · ${data.edges.length} edges · ${data.source}` +
        (failed ? ` · ${failed} unreadable` : "") + " · " + new Date().toLocaleTimeString(),
      false,
    );
    if (state.selected) await refreshDetails();
  }

  function markSelected() {
    const view = state.graphView;
    if (!view) return;
    for (const m of [view.nodeEls, view.edgeEls])
      for (const [id, v] of m) v.g.classList.toggle("selected", !!state.selected && state.selected.id === id);
  }

  function pick(kind, id) {
    if (!kind && state.panned) { state.panned = false; return; }
    state.panned = false;
    state.selected = kind ? { kind, id } : null;
    markSelected();
    $("details").hidden = !kind;
    if (kind) refreshDetails().catch((e) => setStatus(e.message, true));
  }

  // "wl:ns/name" → "name (ns)", "svc:host" → "host": how a person names them.
  function nodeLabel(id) {
    if (id.startsWith("wl:")) { const [ns, ...rest] = id.slice(3).split("/"); return `${rest.join("/")} (${ns})`; }
    if (id.startsWith("svc:")) return id.slice(4);
    return id;
  }

  function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%"; }
  function ms(v) { return v === null || v === undefined ? "–" : v.toFixed(1) + " ms"; }

  function numbers(rows) {
    const dl = h("dl", null, "numbers");
    for (const [k, v] of rows) { dl.appendChild(h("dt", k)); dl.appendChild(h("dd", v)); }
    return dl;
  }

  function edgeNumbers(e) {
    const codes = Object.entries(e.codes || {}).map(([c, r]) => `${c}: ${MeshGraph.fmtRate(r)}/s`).join(", ");
    return numbers([
      ["requests", MeshGraph.fmtRate(e.rps) + " /s"],
      ["error rate (5xx)", pct(e.error_rate)],
      ["p50 / p90 / p99", `${ms(e.latency_ms.p50)} / ${ms(e.latency_ms.p90)} / ${ms(e.latency_ms.p99)}`],
      ["TCP sent / received", `${MeshGraph.fmtBytes(e.tcp_sent_bps)} / ${MeshGraph.fmtBytes(e.tcp_received_bps)}`],
      ["mutual TLS", e.mtls === null ? "unknown (source report)" : e.mtls ? "yes" : `no (${pct(e.mtls_share)} of traffic)`],
      ["protocol", e.protocol],
      ["reported by", e.reporter],
      ["response codes", codes || "–"],
    ]);
  }

  function objectBlock(obj) {
    const box = h("div", null, "obj");
    const d = document.createElement("details");
    const where = obj.file ? ` (${obj.file}:${obj.line})` : "";
    d.appendChild(h("summary", `${obj.kind} ${obj.namespace}/${obj.name}${where}`));
    d.appendChild(h("pre", JSON.stringify(obj.spec, null, 2)));
    box.appendChild(d);
    return box;
  }

  function section(parent, title, objects) {
    parent.appendChild(h("h3", title));
    const list = (objects || []).filter(Boolean);
    if (!list.length) { parent.appendChild(h("div", "none", "empty-inline")); return; }
    for (const o of list) parent.appendChild(objectBlock(o));
  }

  function policies(parent, p) {
    parent.appendChild(h("h3", "Peer authentication"));
    const ports = Object.entries(p.port_mtls || {}).map(([k, v]) => `${k}: ${v}`).join(", ");
    parent.appendChild(numbers([["mTLS mode", p.mtls_mode + (ports ? ` (ports ${ports})` : "")]]));
    section(parent, "PeerAuthentications", p.peer_authentications);
    section(parent, "AuthorizationPolicies", p.authorization_policies);
  }

  async function refreshDetails() {
    const sel = state.selected;
    if (!sel) return;
    let data;
    try {
      data = await api(sel.kind, { id: sel.id, window: windowParam() });
    } catch (e) {
      clear($("details-body"));
      $("details-title").textContent = sel.id;
      $("details-body").appendChild(h("p", e.message, "error"));
      return;
    }
    if (!state.selected || state.selected.id !== sel.id) return;
    const body = $("details-body");
    const openSpecs = new Set([...body.querySelectorAll("details[open] summary")].map((s) => s.textContent));
    clear(body);
    if (sel.kind === "edge") {
      $("details-title").textContent = `${nodeLabel(data.source)} → ${nodeLabel(data.target)}`;
      body.appendChild(data.edge ? edgeNumbers(data.edge) : h("p", "No traffic in this window."));
      const c = data.config || {};
      if ("virtual_service" in c) {
        section(body, "VirtualService", [c.virtual_service]);
        section(body, "DestinationRule", [c.destination_rule]);
        section(body, "Service", c.services);
      }
      if (c.server) policies(body, c.server);
    } else {
      const n = data.node || {};
      $("details-title").textContent = n.kind ? `${n.kind} ${n.namespace ? n.namespace + "/" : ""}${n.name}` : data.id;
      body.appendChild(numbers([
        ["requests in", MeshGraph.fmtRate(n.rps_in || 0) + " /s"],
        ["requests out", MeshGraph.fmtRate(n.rps_out || 0) + " /s"],
        ["error rate in", pct(n.error_rate_in)],
        ["app", n.app || "–"],
      ]));
      for (const [title, edges] of [["Inbound", data.inbound], ["Outbound", data.outbound]]) {
        body.appendChild(h("h3", title));
        if (!edges.length) body.appendChild(h("div", "none"));
        for (const e of edges) {
          const other = title === "Inbound" ? e.source : e.target;
          const line = h("div", `${nodeLabel(other)}: ${MeshGraph.fmtRate(e.rps)} rps, ${pct(e.error_rate)} errors${e.mtls ? ", mTLS" : ""}`, "clickable");
          line.addEventListener("click", () => pick("edge", e.id));
          body.appendChild(line);
        }
      }
      const c = data.config || {};
      if (c.virtual_services) {
        section(body, "Service", c.services);
        section(body, "VirtualServices", c.virtual_services);
        section(body, "DestinationRules", c.destination_rules);
      }
      if (c.mtls_mode) policies(body, c);
      if (c.workloads) {
        body.appendChild(h("h3", "Workloads"));
        if (!c.workloads.length) body.appendChild(h("div", "none"));
        for (const w of c.workloads) body.appendChild(h("div", `${w.namespace}/${w.name} ${w.address} (sa ${w.service_account})`));
      }
    }
    for (const s of body.querySelectorAll("details summary")) if (openSpecs.has(s.textContent)) s.parentElement.open = true;
  }

  // --- proxies --------------------------------------------------------------------------

  async function refreshProxies() {
    const data = await api("proxies", { namespace: namespaceParam() });
    learnNamespaces(data.namespaces);
    const tbody = $("proxies").querySelector("tbody");
    clear(tbody);
    for (const p of data.proxies) {
      const tr = document.createElement("tr");
      tr.dataset.proxy = p.proxy;
      for (const v of [p.name, p.namespace, p.ip, p.replica]) tr.appendChild(h("td", v));
      tr.appendChild(h("td", p.status, "state-" + p.status));
      for (const col of data.columns) {
        const t = p.types[col];
        tr.appendChild(h("td", t ? t.state.replace("_", " ") : "–", t ? "state-" + t.state : ""));
      }
      tr.appendChild(h("td", p.nacks.map((n) => `${n.type}: ${n.message}`).join("\n"), "nack"));
      const cell = h("td");
      if (typeof p.config_dump === "string" && p.config_dump.startsWith("/debug/config_dump?")) {
        const a = h("a", "config dump");
        a.href = p.config_dump;
        a.target = "_blank";
        a.rel = "noopener";
        cell.appendChild(a);
      }
      tr.appendChild(cell);
      tbody.appendChild(tr);
    }
    $("proxies-empty").hidden = data.proxies.length > 0;
    const errs = $("replica-errors");
    errs.hidden = !data.replica_errors.length;
    errs.textContent = data.replica_errors.length ? "Replicas not reached: " + data.replica_errors.join("; ") : "";
    setStatus(`${data.proxies.length} proxies · ` + new Date().toLocaleTimeString(), false);
  }

  // --- config ---------------------------------------------------------------------------

  function conditions(status, out, depth) {
    if (!status || typeof status !== "object" || depth > 4) return out;
    if (Array.isArray(status.conditions))
      for (const c of status.conditions) out.push(`${c.type}=${c.status}${c.reason ? " (" + c.reason + ")" : ""}`);
    for (const [k, v] of Object.entries(status)) {
      if (k === "conditions") continue;
      if (Array.isArray(v)) for (const item of v) conditions(item, out, depth + 1);
      else if (v && typeof v === "object") conditions(v, out, depth + 1);
    }
    return out;
  }

  async function refreshConfig() {
    const data = await api("config", { namespace: namespaceParam(), kind: $("kind").value });
    learnNamespaces(data.namespaces);
    const kind = $("kind");
    const have = new Set([...kind.options].map((o) => o.value));
    for (const k of data.kinds) if (!have.has(k)) { const o = document.createElement("option"); o.value = k; o.textContent = k; kind.appendChild(o); }
    const errors = $("config-errors");
    clear(errors);
    for (const e of data.errors) errors.appendChild(h("div", e.message, "config-error"));
    const warnings = $("config-warnings");
    clear(warnings);
    for (const w of data.warnings) {
      const where = w.object ? w.object + ": " : w.file ? `${w.file}:${w.line}: ` : "";
      warnings.appendChild(h("div", where + w.message, "config-warning"));
    }
    const tbody = $("config").querySelector("tbody");
    clear(tbody);
    for (const o of data.objects) {
      const tr = h("tr", null, "clickable");
      const key = `${o.kind}/${o.namespace}/${o.name}`;
      tr.dataset.key = key;
      tr.appendChild(h("td", o.kind));
      tr.appendChild(h("td", o.namespace));
      tr.appendChild(h("td", o.name));
      tr.appendChild(h("td", o.file ? `${o.file}:${o.line}` : ""));
      tr.appendChild(h("td", o.warnings.join("\n"), "warnings"));
      tr.appendChild(h("td", conditions(o.status, [], 0).join(", ")));
      tr.addEventListener("click", () => showSpec(key, o));
      tbody.appendChild(tr);
      if (key === state.specKey) showSpec(key, o);
    }
    setStatus(`${data.objects.length} objects · ${data.errors.length} rejected files · ` + new Date().toLocaleTimeString(), data.errors.length > 0);
  }

  function showSpec(key, o) {
    state.specKey = key;
    const pre = $("config-spec");
    pre.hidden = false;
    pre.textContent = `# ${o.kind} ${o.namespace}/${o.name}\n` + JSON.stringify({ spec: o.spec, status: o.status }, null, 2);
  }

  // --- loop -----------------------------------------------------------------------------

  const refreshers = { graph: refreshGraph, proxies: refreshProxies, config: refreshConfig };

  async function refresh() {
    if (state.busy) { state.again = true; return; }
    state.busy = true;
    try {
      await refreshers[state.view]();
    } catch (e) {
      setStatus(e.message, true);
    } finally {
      state.busy = false;
    }
    if (state.again) { state.again = false; await refresh(); }
  }

  function loop() {
    clearTimeout(state.timer);
    refresh().finally(() => { state.timer = setTimeout(loop, POLL_MS); });
  }

  function show(view) {
    state.view = view;
    for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.view === view);
    for (const name of Object.keys(refreshers)) $("view-" + name).hidden = name !== view;
    $("window-label").hidden = view !== "graph";
    location.hash = view;
    loop();
  }

  function start() {
    setupPanZoom();
    for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => show(b.dataset.view));
    $("details-close").addEventListener("click", () => pick(null));
    $("namespace").addEventListener("change", () => { state.userMoved = false; state.graphView = null; loop(); });
    $("window").addEventListener("change", loop);
    $("kind").addEventListener("change", loop);
    const initial = location.hash.slice(1);
    show(refreshers[initial] ? initial : "graph");
  }

  document.addEventListener("DOMContentLoaded", start);
})();
