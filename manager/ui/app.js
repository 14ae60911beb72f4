// ironhorn's web UI: plain script, no build step. Each view mounts its
// static parts (forms keep what is typed) and refreshes its data parts from
// the REST API; the manager's /v1/watch stream says when to refresh.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const badge = (v) => `<span class="badge ${esc(v)}">${esc(v || "-")}</span>`;

function bytes(n) {
  n = Number(n || 0);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n >= 100 || i === 0 ? n.toFixed(0) : n.toFixed(1)} ${units[i]}`;
}

function ago(t) {
  if (!t) return "";
  const s = Math.max(0, (Date.now() - Date.parse(t)) / 1000);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

class ApiError extends Error {}

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: text }; }
  if (!r.ok) throw new ApiError((data && data.error) || `${r.status} ${r.statusText}`);
  return data;
}
const get = (path) => api("GET", path);

// ---- live updates -------------------------------------------------------

let current = null; // the mounted view: { refresh() }
let pending = null;

function scheduleRefresh() {
  if (pending) return;
  pending = setTimeout(async () => {
    pending = null;
    if (current) await safely(current.refresh);
  }, 150);
}

async function safely(fn) {
  try { await fn(); } catch (e) {
    const line = $("#view-error");
    if (line) line.textContent = e.message;
  }
}

function connect() {
  const live = $("#live");
  const source = new EventSource("/v1/watch");
  source.addEventListener("open", () => { live.textContent = "live"; live.classList.add("on"); scheduleRefresh(); });
  source.addEventListener("change", scheduleRefresh);
  source.addEventListener("lagged", scheduleRefresh);
  source.addEventListener("error", () => { live.textContent = "reconnecting"; live.classList.remove("on"); });
}

// ---- shared pieces ------------------------------------------------------

function volumeRows(volumes, replicas) {
  return volumes.map((v) => {
    const s = v.status || {};
    const mine = replicas.filter((r) => r.spec.volumeName === v.metadata.name);
    const healthy = mine.filter((r) => !r.spec.failedAt && r.spec.healthyAt).length;
    const detached = !v.spec.nodeID && (s.state || "detached") === "detached";
    return {
      name: v.metadata.name,
      state: s.state || "",
      robustness: detached ? "detached" : (s.robustness || "unknown"),
      size: v.spec.size,
      replicas: `${healthy}/${v.spec.numberOfReplicas}`,
      node: s.currentNodeID || v.spec.nodeID || "",
      frontend: s.frontend || v.spec.frontend || "",
      endpoint: s.blockdev || s.endpoint || "",
    };
  });
}

function table(columns, rows, opts = {}) {
  const head = columns.map((c) => {
    const sorted = opts.sort && opts.sort.key === c.key;
    const cls = [c.sortable === false ? "" : "sortable", sorted ? "sorted" : "", sorted && opts.sort.asc ? "asc" : "", c.narrow ? "hide-narrow" : ""].join(" ");
    return `<th data-key="${esc(c.key)}" class="${cls}">${esc(c.title)}</th>`;
  }).join("");
  const body = rows.map((r) => `<tr ${opts.rowAttr ? opts.rowAttr(r) : ""}>${columns.map((c) => `<td class="${esc(c.key)} ${c.narrow ? "hide-narrow" : ""}">${c.render ? c.render(r) : esc(r[c.key])}</td>`).join("")}</tr>`).join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body || `<tr><td colspan="${columns.length}" class="muted">none</td></tr>`}</tbody></table>`;
}

function capacityBar(max, used, scheduled, reserved) {
  const pct = (n) => (max > 0 ? Math.min(100, (100 * n) / max) : 0);
  return `<div class="bar" title="used ${bytes(used)} · scheduled ${bytes(scheduled)} · reserved ${bytes(reserved)} · maximum ${bytes(max)}">
    <span class="used" style="width:${pct(used)}%"></span>
    <span class="scheduled" style="width:${pct(Math.max(0, scheduled - used))}%"></span>
    <span class="reserved" style="width:${pct(reserved)}%"></span></div>`;
}

const legend = `<div class="legend"><i style="background:var(--accent)"></i>used<i style="background:#8fa8e8"></i>scheduled<i style="background:#c9cfda"></i>reserved<i style="background:#e7ebf2"></i>free</div>`;

function disks(nodes) {
  const out = [];
  for (const n of nodes) {
    const status = (n.status && n.status.diskStatus) || {};
    for (const [name, spec] of Object.entries(n.spec.disks || {})) {
      const st = status[name] || {};
      const max = st.storageMaximum || spec.storageMaximum || 0;
      const available = st.storageAvailable || 0;
      out.push({
        node: n.metadata.name, disk: name, path: spec.path, max, available,
        used: Math.max(0, max - available), scheduled: st.storageScheduled || 0, reserved: spec.storageReserved || 0,
        allow: spec.allowScheduling, tags: (spec.tags || []).join(", "),
        conditions: (st.conditions || []).map((c) => `${c.type}=${c.status}`).join(" "),
      });
    }
  }
  return out;
}

function nodeReady(n) {
  const c = ((n.status && n.status.conditions) || []).find((c) => c.type === "Ready");
  return c ? c.status : "Unknown";
}

function eventsTable(events, withVolume = true) {
  const cols = [
    { key: "time", title: "When", render: (e) => `<span title="${esc(e.time)}">${esc(ago(e.time))}</span>` },
    { key: "type", title: "Type", render: (e) => badge(e.type) },
  ];
  if (withVolume) cols.push({ key: "volume", title: "Volume", render: (e) => `<a href="#/volume/${encodeURIComponent(e.volume || "")}">${esc(e.volume)}</a>` });
  cols.push({ key: "reason", title: "Reason" }, { key: "message", title: "Message" });
  return `<div class="events">${table(cols, events.slice().reverse(), {})}</div>`;
}

// ---- views --------------------------------------------------------------

const views = {};

views.dashboard = () => ({
  mount(root) {
    root.innerHTML = `<h1>Dashboard</h1><div id="view-error" class="error-line"></div>
      <div class="cards" id="robustness"></div><h2>Capacity</h2><div class="panel" id="capacity"></div>
      <h2>Nodes</h2><div class="cards" id="nodes"></div><h2>Recent events</h2><div class="panel" id="recent"></div>`;
  },
  async refresh() {
    const [volumes, replicas, nodes, events] = await Promise.all([get("/v1/volumes"), get("/v1/replicas"), get("/v1/nodes"), get("/v1/events")]);
    const rows = volumeRows(volumes, replicas);
    const count = (k) => rows.filter((r) => r.robustness === k).length;
    $("#robustness").innerHTML = ["healthy", "degraded", "faulted", "detached"].map((k) =>
      `<div class="card" data-robustness="${k}"><div class="n">${count(k)}</div><div class="k">${badge(k)} volumes</div></div>`).join("");
    const d = disks(nodes);
    const sum = (k) => d.reduce((a, x) => a + x[k], 0);
    const max = sum("max");
    $("#capacity").innerHTML = `${capacityBar(max, sum("used"), sum("scheduled"), sum("reserved"))}${legend}
      <p class="muted">maximum ${bytes(max)} · used ${bytes(sum("used"))} · scheduled ${bytes(sum("scheduled"))} · reserved ${bytes(sum("reserved"))} · free ${bytes(sum("available"))}</p>`;
    const up = nodes.filter((n) => nodeReady(n) === "True").length;
    $("#nodes").innerHTML = `<div class="card"><div class="n">${up}</div><div class="k">${badge("True")} nodes up</div></div>
      <div class="card"><div class="n">${nodes.length - up}</div><div class="k">${badge("False")} nodes down</div></div>`;
    $("#recent").innerHTML = eventsTable(events.slice(-10));
  },
});

views.volumes = () => {
  let sort = { key: "name", asc: true };
  let filter = "";
  return {
    mount(root) {
      root.innerHTML = `<h1>Volumes</h1><div id="view-error" class="error-line"></div>
        <div class="panel"><form id="create" class="inline" autocomplete="off">
          <label>Name<input name="name" required placeholder="pg-data"><span class="field-error" data-for="name"></span></label>
          <label>Size<input name="size" required placeholder="10GiB" size="9"><span class="field-error" data-for="size"></span></label>
          <label>Replicas<input name="replicas" type="number" min="1" max="10" value="3" size="3"><span class="field-error" data-for="replicas"></span></label>
          <label>Frontend<select name="frontend"><option value="nbd">nbd</option><option value="blockdev">blockdev</option></select><span class="field-error" data-for="frontend"></span></label>
          <label>&nbsp;<button type="submit" id="create-submit">Create volume</button><span class="field-error" data-for="form"></span></label>
        </form></div>
        <div class="toolbar"><input id="filter" placeholder="filter by name, state, node…" size="30"></div>
        <div class="panel" id="list"></div>`;
      $("#create").addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const f = ev.target;
        for (const e of f.querySelectorAll(".field-error")) e.textContent = "";
        const body = { name: f.name.value.trim(), size: f.size.value.trim(), numberOfReplicas: Number(f.replicas.value), frontend: f.frontend.value };
        try {
          await api("POST", "/v1/volumes", body);
          f.name.value = "";
          f.size.value = "";
          scheduleRefresh();
        } catch (e) {
          $(`.field-error[data-for="${fieldOf(e.message)}"]`, f).textContent = e.message;
        }
      });
      $("#filter").addEventListener("input", (ev) => { filter = ev.target.value.toLowerCase(); this.refresh(); });
      $("#list").addEventListener("click", (ev) => {
        const th = ev.target.closest("th.sortable");
        if (!th) return;
        const key = th.dataset.key;
        sort = { key, asc: sort.key === key ? !sort.asc : true };
        this.refresh();
      });
    },
    async refresh() {
      const [volumes, replicas] = await Promise.all([get("/v1/volumes"), get("/v1/replicas")]);
      let rows = volumeRows(volumes, replicas).filter((r) => !filter || Object.values(r).some((v) => String(v).toLowerCase().includes(filter)));
      rows.sort((a, b) => {
        const x = a[sort.key], y = b[sort.key];
        const c = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
        return sort.asc ? c : -c;
      });
      $("#list").innerHTML = table([
        { key: "name", title: "Name", render: (r) => `<a href="#/volume/${encodeURIComponent(r.name)}">${esc(r.name)}</a>` },
        { key: "state", title: "State", render: (r) => badge(r.state) },
        { key: "robustness", title: "Robustness", render: (r) => badge(r.robustness) },
        { key: "size", title: "Size", render: (r) => bytes(r.size) },
        { key: "replicas", title: "Replicas" },
        { key: "node", title: "Node" },
        { key: "frontend", title: "Frontend", narrow: true },
        { key: "endpoint", title: "Endpoint", narrow: true },
      ], rows, { sort, rowAttr: (r) => `data-volume="${esc(r.name)}"` });
    },
  };
};

/// Which form field an API error is about.
function fieldOf(message) {
  const m = message.toLowerCase();
  if (m.includes("size") || m.includes("bytes") || m.includes("multiple of")) return "size";
  if (m.includes("replica")) return "replicas";
  if (m.includes("frontend")) return "frontend";
  if (m.includes("name") || m.includes("exists")) return "name";
  return "form";
}

function rebuildCell(p) {
  if (!p || !p.state) return "";
  const total = p.totalBytes || 0;
  // A dirty-map rebuild knows what to copy up front (its total); one by
  // checksums compares the whole volume and copies what differs.
  const done = (p.method === "checksums" ? p.comparedBytes : p.copiedBytes) || 0;
  const pct = total > 0 ? Math.min(100, (100 * done) / total) : 0;
  const secs = p.startedAt ? ((p.finishedAt ? Date.parse(p.finishedAt) : Date.now()) - Date.parse(p.startedAt)) / 1000 : 0;
  const rate = secs > 0 ? (p.copiedBytes || 0) / secs : 0;
  if (p.state !== "running") return `${badge(p.state)} <span class="muted">${esc(p.method)} · copied ${bytes(p.copiedBytes)}${p.error ? " · " + esc(p.error) : ""}</span>`;
  return `<div class="rebuild" data-percent="${pct.toFixed(0)}"><div class="bar"><span class="progress" style="width:${pct.toFixed(1)}%"></span></div>
    <span class="muted">${pct.toFixed(0)}% · ${esc(p.method)} · copied ${bytes(p.copiedBytes)} of ${bytes(total)} · ${bytes(rate)}/s</span></div>`;
}

// ---- I/O charts -----------------------------------------------------------

const CHART_POINTS = 60;

// A small line chart of one or two series (inline SVG, no library).
function lineChart(title, series, format) {
  const w = 300, h = 80, n = CHART_POINTS;
  const max = Math.max(1, ...series.flatMap((s) => s.values));
  const line = (values) => values.map((y, i) => `${((i + n - values.length) * w / (n - 1)).toFixed(1)},${(h - (h - 4) * y / max).toFixed(1)}`).join(" ");
  const last = series.map((s) => `<span class="key" style="color:${s.color}">${esc(s.name)} ${esc(format(s.values[s.values.length - 1] || 0))}</span>`).join(" ");
  return `<figcaption>${esc(title)} ${last}</figcaption>
    <svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none" role="img" aria-label="${esc(title)}">
      ${series.map((s) => `<polyline fill="none" stroke="${s.color}" stroke-width="1.5" points="${line(s.values)}"/>`).join("")}</svg>`;
}

function drawCharts(samples) {
  const pick = (k) => samples.map((x) => x[k] || 0);
  const num = (x) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));
  const ms = (ns) => `${(ns / 1e6).toFixed(2)} ms`;
  $("#chart-iops").innerHTML = lineChart("IOPS", [{ name: "read", color: "#2a7", values: pick("readIops") }, { name: "write", color: "#36c", values: pick("writeIops") }], num);
  $("#chart-throughput").innerHTML = lineChart("Throughput", [{ name: "read", color: "#2a7", values: pick("readThroughput") }, { name: "write", color: "#36c", values: pick("writeThroughput") }], (b) => `${bytes(b)}/s`);
  $("#chart-latency").innerHTML = lineChart("Latency", [{ name: "read", color: "#2a7", values: pick("readLatencyNs") }, { name: "write", color: "#36c", values: pick("writeLatencyNs") }], ms);
  for (const [id, k] of [["chart-iops", "writeIops"], ["chart-throughput", "writeThroughput"], ["chart-latency", "writeLatencyNs"]]) {
    $(`#${id}`).dataset.last = String(pick(k)[samples.length - 1] || 0);
  }
}

views.volume = (name) => ({
  mount(root) {
    root.innerHTML = `<h1>Volume <span id="volume-name">${esc(name)}</span> <span id="robustness"></span></h1>
      <div id="view-error" class="error-line"></div>
      <div class="panel"><dl class="kv" id="summary"></dl>
        <div class="toolbar" id="actions">
          <select id="attach-node"></select><button id="attach" type="button">Attach</button>
          <button id="detach" type="button" class="secondary">Detach</button>
          <input id="replica-count" type="number" min="1" max="10" size="3"><button id="set-replicas" type="button" class="secondary">Set replicas</button>
          <input id="expand-size" placeholder="new size, e.g. 2GiB" size="12"><button id="expand" type="button" class="secondary">Expand</button>
          <button id="scrub" type="button" class="secondary">Scrub</button>
          <button id="delete" type="button" class="danger">Delete</button>
        </div>
        <div id="confirm"></div><div id="action-error" class="error-line"></div></div>
      <h2>I/O</h2><div class="panel charts" id="io"><div class="muted" id="io-note">shown while attached</div>
        <figure id="chart-iops"></figure><figure id="chart-throughput"></figure><figure id="chart-latency"></figure></div>
      <h2>Replicas</h2><div class="panel" id="replicas"></div>
      <h2>Snapshots</h2><div class="panel"><form id="snapshot" class="inline"><input name="snap" placeholder="snapshot name"><button type="submit">Take snapshot</button></form><div id="snapshots"></div></div>
      <h2>Events</h2><div class="panel" id="events"></div>`;
    const act = async (fn) => {
      $("#action-error").textContent = "";
      try { await fn(); scheduleRefresh(); } catch (e) { $("#action-error").textContent = e.message; }
    };
    const v = `/v1/volumes/${encodeURIComponent(name)}`;
    $("#attach").addEventListener("click", () => act(() => api("POST", `${v}/attach`, { node: $("#attach-node").value })));
    $("#detach").addEventListener("click", () => act(() => api("POST", `${v}/detach`)));
    $("#set-replicas").addEventListener("click", () => act(() => api("POST", `${v}/update`, { numberOfReplicas: Number($("#replica-count").value) })));
    $("#expand").addEventListener("click", () => act(() => api("POST", `${v}/expand`, { size: $("#expand-size").value.trim() })));
    $("#scrub").addEventListener("click", () => act(() => api("POST", `${v}/scrub`)));
    $("#delete").addEventListener("click", () => {
      $("#confirm").innerHTML = `<div class="confirm">Delete volume <b>${esc(name)}</b> and all of its data? This cannot be undone.
        <button id="confirm-delete" type="button" class="danger">Delete ${esc(name)}</button> <button id="cancel-delete" type="button" class="secondary">Cancel</button></div>`;
      $("#cancel-delete").addEventListener("click", () => { $("#confirm").innerHTML = ""; });
      $("#confirm-delete").addEventListener("click", () => act(async () => { await api("DELETE", v); location.hash = "#/volumes"; }));
    });
    $("#snapshot").addEventListener("submit", (ev) => {
      ev.preventDefault();
      act(() => api("POST", `${v}/snapshots`, { name: ev.target.snap.value.trim() }));
    });
    $("#snapshots").addEventListener("click", (ev) => {
      const b = ev.target.closest("button[data-snapshot]");
      if (b) act(() => api("DELETE", `${v}/snapshots/${encodeURIComponent(b.dataset.snapshot)}`));
    });
    // The engine's I/O figures, a sample a second while the page is open.
    this.samples = [];
    this.timer = setInterval(async () => {
      let io;
      try { io = await get(`${v}/io`); } catch (_) { $("#io-note").textContent = "shown while attached"; return; }
      this.samples.push(io);
      if (this.samples.length > CHART_POINTS) this.samples.shift();
      $("#io-note").textContent = `last ${this.samples.length} s`;
      drawCharts(this.samples);
    }, 1000);
  },
  unmount() { clearInterval(this.timer); },
  async refresh() {
    let volume;
    try { volume = await get(`/v1/volumes/${encodeURIComponent(name)}`); } catch (e) {
      $("#summary").innerHTML = `<dt>gone</dt><dd>${esc(e.message)}</dd>`;
      $("#robustness").innerHTML = badge("deleted");
      return;
    }
    const [replicas, engines, nodes, snapshots, events] = await Promise.all([
      get("/v1/replicas"), get("/v1/engines"), get("/v1/nodes"), get(`/v1/volumes/${encodeURIComponent(name)}/snapshots`), get(`/v1/events?volume=${encodeURIComponent(name)}`),
    ]);
    const s = volume.status || {};
    const detached = !volume.spec.nodeID && (s.state || "detached") === "detached";
    $("#robustness").innerHTML = badge(detached ? "detached" : (s.robustness || "unknown"));
    const scrub = s.scrub || {};
    $("#summary").innerHTML = [
      ["State", badge(s.state)], ["Size", bytes(volume.spec.size)], ["Replicas wanted", volume.spec.numberOfReplicas],
      ["Node", esc(s.currentNodeID || volume.spec.nodeID || "-")], ["Frontend", esc(s.frontend || volume.spec.frontend)],
      ["Endpoint", esc(s.blockdev || s.endpoint || "-")],
      ["Bad blocks", `${s.badBlocksFound || 0} found · ${s.badBlocksRepaired || 0} repaired`],
      ["Last scrub", scrub.state ? `${badge(scrub.state)} ${esc(ago(scrub.finishedAt || scrub.startedAt))} · ${bytes(scrub.checkedBytes)} checked · ${scrub.badBlocks || 0} bad` : "never"],
    ].map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
    const sel = $("#attach-node");
    const options = nodes.map((n) => `<option value="${esc(n.metadata.name)}">${esc(n.metadata.name)}</option>`).join("");
    if (sel.dataset.options !== options) {
      const chosen = sel.value;
      sel.innerHTML = options;
      sel.dataset.options = options;
      if (chosen) sel.value = chosen;
    }
    if (!$("#replica-count").value) $("#replica-count").value = volume.spec.numberOfReplicas;
    const engine = engines.find((e) => e.spec.volumeName === name);
    const es = (engine && engine.status) || {};
    const mine = replicas.filter((r) => r.spec.volumeName === name);
    $("#replicas").innerHTML = table([
      { key: "name", title: "Replica" },
      { key: "node", title: "Node" },
      { key: "disk", title: "Disk", narrow: true },
      { key: "mode", title: "Mode", render: (r) => badge(r.mode) },
      { key: "rebuild", title: "Rebuild", sortable: false, render: (r) => rebuildCell(r.progress) },
      { key: "retries", title: "Retries", narrow: true },
      { key: "failedAt", title: "Failed", narrow: true, render: (r) => esc(ago(r.failedAt)) },
    ], mine.map((r) => ({
      name: r.metadata.name, node: r.spec.nodeID, disk: r.spec.diskID,
      mode: (es.replicaModeMap || {})[r.metadata.name] || (r.spec.failedAt ? "ERR" : (r.status && r.status.currentState) || ""),
      progress: (es.rebuildProgress || {})[r.metadata.name], retries: r.spec.rebuildRetryCount || 0, failedAt: r.spec.failedAt,
    })), { rowAttr: (r) => `data-replica="${esc(r.name)}"` });
    $("#snapshots").innerHTML = table([
      { key: "name", title: "Snapshot" },
      { key: "ready", title: "Ready", render: (x) => badge(x.ready ? "True" : "False") },
      { key: "size", title: "Size", render: (x) => bytes(x.size) },
      { key: "del", title: "", sortable: false, render: (x) => `<button type="button" class="secondary" data-snapshot="${esc(x.name)}">Delete</button>` },
    ], (Array.isArray(snapshots) ? snapshots : []).map((x) => ({ name: x.metadata ? x.metadata.name : x.name, ready: x.status ? x.status.readyToUse : x.readyToUse, size: x.status ? x.status.size : x.size })));
    $("#events").innerHTML = eventsTable(events, false);
  },
});

views.nodes = () => ({
  mount(root) {
    root.innerHTML = `<h1>Nodes</h1><div id="view-error" class="error-line"></div><div class="panel" id="nodes"></div><h2>Disks</h2><div class="panel" id="disks"></div>`;
    const update = async (node, body, errorAt) => {
      try { await api("POST", `/v1/nodes/${encodeURIComponent(node)}`, body); scheduleRefresh(); } catch (e) { errorAt.textContent = e.message; }
    };
    root.addEventListener("change", (ev) => {
      const box = ev.target;
      if (box.dataset.nodeScheduling) update(box.dataset.nodeScheduling, { allowScheduling: box.checked }, $("#view-error"));
      if (box.dataset.diskScheduling) {
        const [node, disk] = box.dataset.diskScheduling.split("/");
        update(node, { disks: { [disk]: { allowScheduling: box.checked } } }, $("#view-error"));
      }
    });
    root.addEventListener("submit", (ev) => {
      const f = ev.target.closest("form[data-node-tags]");
      if (!f) return;
      ev.preventDefault();
      $(".field-error", f).textContent = "";
      const tags = f.tags.value.split(",").map((t) => t.trim()).filter(Boolean);
      update(f.dataset.nodeTags, { tags }, $(".field-error", f));
    });
  },
  async refresh() {
    const editing = document.activeElement && document.activeElement.closest && document.activeElement.closest("form[data-node-tags]");
    if (editing) return; // keep what is being typed
    const nodes = await get("/v1/nodes");
    $("#nodes").innerHTML = table([
      { key: "name", title: "Node" },
      { key: "ready", title: "Ready", render: (n) => badge(n.ready) },
      { key: "allow", title: "Scheduling", render: (n) => `<label class="toggle"><input type="checkbox" data-node-scheduling="${esc(n.name)}" ${n.allow ? "checked" : ""}> ${n.allow ? "allowed" : "disabled"}</label>` },
      { key: "zone", title: "Zone" },
      { key: "tags", title: "Tags", render: (n) => `<form class="inline" data-node-tags="${esc(n.name)}"><input name="tags" value="${esc(n.tags)}" placeholder="tag, tag" size="12"><button type="submit" class="secondary">Save</button><span class="field-error"></span></form>` },
      { key: "conditions", title: "Conditions", narrow: true },
    ], nodes.map((n) => ({
      name: n.metadata.name, ready: nodeReady(n), allow: n.spec.allowScheduling, zone: (n.status && n.status.zone) || "",
      tags: (n.spec.tags || []).join(", "),
      conditions: ((n.status && n.status.conditions) || []).map((c) => `${c.type}=${c.status}${c.reason ? " (" + c.reason + ")" : ""}`).join(" "),
    })), { rowAttr: (n) => `data-node="${esc(n.name)}"` });
    $("#disks").innerHTML = legend + table([
      { key: "node", title: "Node" }, { key: "disk", title: "Disk" },
      { key: "bar", title: "Capacity", sortable: false, render: (d) => capacityBar(d.max, d.used, d.scheduled, d.reserved) },
      { key: "max", title: "Maximum", render: (d) => bytes(d.max) }, { key: "available", title: "Available", render: (d) => bytes(d.available) },
      { key: "scheduled", title: "Scheduled", render: (d) => bytes(d.scheduled), narrow: true }, { key: "reserved", title: "Reserved", render: (d) => bytes(d.reserved), narrow: true },
      { key: "allow", title: "Scheduling", render: (d) => `<label class="toggle"><input type="checkbox" data-disk-scheduling="${esc(d.node)}/${esc(d.disk)}" ${d.allow ? "checked" : ""}> ${d.allow ? "allowed" : "disabled"}</label>`, narrow: true },
      { key: "path", title: "Path", narrow: true }, { key: "conditions", title: "Conditions", narrow: true },
    ], disks(nodes));
  },
});

views.settings = () => ({
  mount(root) {
    root.innerHTML = `<h1>Settings</h1><div id="view-error" class="error-line"></div><div class="panel" id="settings"></div>`;
    $("#settings").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const f = ev.target;
      const err = $(".field-error", f);
      err.textContent = "";
      try { await api("PUT", `/v1/settings/${encodeURIComponent(f.dataset.setting)}`, { value: f.value.value.trim() }); scheduleRefresh(); } catch (e) { err.textContent = e.message; }
    });
  },
  async refresh() {
    const list = await get("/v1/settings");
    const editing = document.activeElement && document.activeElement.closest && document.activeElement.closest("form[data-setting]");
    if (editing) return; // keep what is being typed
    $("#settings").innerHTML = table([
      { key: "name", title: "Setting" },
      { key: "value", title: "Value", sortable: false, render: (s) => `<form class="inline" data-setting="${esc(s.name)}"><input name="value" value="${esc(s.value)}" size="8"><button type="submit" class="secondary">Save</button><span class="field-error"></span></form>` },
      { key: "default", title: "Default" },
      { key: "description", title: "Description", render: (s) => `<span style="white-space:normal">${esc(s.description)}</span>` },
    ], list);
  },
});

views.events = () => ({
  mount(root) {
    root.innerHTML = `<h1>Events</h1><div id="view-error" class="error-line"></div><div class="panel" id="all-events"></div>`;
  },
  async refresh() {
    $("#all-events").innerHTML = eventsTable(await get("/v1/events"));
  },
});

// ---- routing ------------------------------------------------------------

function route() {
  const hash = location.hash || "#/";
  const [, page, arg] = hash.match(/^#\/([^/]*)\/?(.*)$/) || [];
  let view;
  if (page === "volumes") view = views.volumes();
  else if (page === "volume" && arg) view = views.volume(decodeURIComponent(arg));
  else if (page === "nodes") view = views.nodes();
  else if (page === "settings") view = views.settings();
  else if (page === "events") view = views.events();
  else view = views.dashboard();
  for (const a of document.querySelectorAll("header nav a")) {
    const target = a.getAttribute("href");
    a.classList.toggle("active", target === `#/${page || ""}` || (page === "volume" && target === "#/volumes"));
  }
  if (current && current.unmount) current.unmount();
  current = view;
  view.mount($("#view"));
  safely(view.refresh);
}

window.addEventListener("hashchange", route);
route();
connect();
