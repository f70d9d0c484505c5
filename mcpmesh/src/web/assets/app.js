// The status page: renders the node's state, and renders it again each time the node pushes
// a new one (server-sent events). Every value shown comes from peers or configs and is set as
// text (textContent), never as markup.
"use strict";

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c === undefined || c === null ? "" : String(c);
    tr.appendChild(td);
  }
  return tr;
}

function fill(id, items, make) {
  const target = document.querySelector("#" + id + " tbody") || document.getElementById(id);
  target.replaceChildren(...items.map(make));
  const empty = document.getElementById(id + "-empty");
  if (empty) empty.hidden = items.length > 0;
}

function ago(unixSecs) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - unixSecs));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString();
}

function backend(s) {
  for (const k of ["run", "socket", "url"]) {
    if (s[k] !== undefined) return k + ": " + (Array.isArray(s[k]) ? s[k].join(" ") : s[k]);
  }
  return "";
}

function detail(r) {
  const parts = [];
  if (r.method) parts.push(r.method + (r.name ? " " + r.name : ""));
  if (r.outcome) parts.push(r.outcome + (r.code ? " " + r.code : ""));
  if (r.latency_us !== undefined) parts.push((r.latency_us / 1000).toFixed(1) + " ms");
  if (r.ended) parts.push("ended " + r.ended);
  if (r.duration_ms !== undefined) parts.push((r.duration_ms / 1000).toFixed(1) + " s");
  if (r.action) parts.push(r.action);
  if (r.count !== undefined) parts.push(r.count + "×");
  if (r.reason) parts.push(r.reason);
  if (r.principal && !r.peer) parts.push(r.principal);
  return parts.join(" · ");
}

function record(r) {
  return row([clock(r.at_ms), r.event.replaceAll("_", " "), r.peer, r.service, detail(r)]);
}

function render(s) {
  document.getElementById("nickname").textContent = s.nickname || "mcpmesh node";
  document.title = (s.nickname || "mcpmesh") + " · mcpmesh";
  const id = document.getElementById("node-id");
  id.textContent = (s.id || "").slice(0, 16) + "…";
  id.title = s.id || "";
  const org = s.org;
  document.getElementById("org").textContent = !org
    ? ""
    : org.removed
      ? "· removed from org " + org.name + " (serial " + org.removed.serial + ")"
      : "· org " + org.name + (org.user ? " as " + org.user : "") + (org.expired ? " (roster EXPIRED)" : "");

  fill("peers", s.peers || [], (p) => {
    const dot = el("span", null, "dot" + (p.reachable ? " up" : ""));
    dot.title = p.reachable ? "reachable" : "not reachable";
    const name = el("span", p.name);
    if (p.user) name.title = p.user + (p.groups && p.groups.length ? " (" + p.groups.join(", ") + ")" : "");
    return row([
      dot,
      name,
      p.reachable ? (p.path || "") : "unreachable",
      p.rtt_ms !== undefined ? p.rtt_ms + " ms" : "",
      (p.services || []).join(", "),
      (p.mounts || []).join(", "),
      p.source + (p.pending ? " (pending)" : ""),
    ]);
  });

  fill("services", s.services || [], (v) => row([
    v.name,
    el("span", backend(v), "mono"),
    (v.peers || []).join(", ") || "nobody",
    v.sessions + " / " + v.max_sessions,
    v.last_failure ? el("span", clock(v.last_failure.at_ms) + " " + v.last_failure.reason, "bad") : "",
  ]));

  fill("sessions", s.sessions || [], (x) => {
    const li = el("li", x.peer + " → " + x.service + " · for " + ago(x.since));
    li.dataset.peer = x.peer;
    li.dataset.service = x.service;
    return li;
  });
  fill("outgoing", s.outgoing || [], (x) => {
    const li = el("li", x.peer + "/" + x.service + " · for " + ago(x.since));
    li.dataset.peer = x.peer;
    return li;
  });

  fill("refusals", (s.refusals || []).slice().reverse(), record);
  fill("recent", (s.recent || []).slice().reverse(), record);

  const roster = s.roster;
  document.getElementById("roster-section").hidden = !roster;
  if (roster) {
    fill("roster", roster.members || [], (m) => row([
      m.user,
      (m.groups || []).join(", "),
      (m.devices || []).map((d) => d.name + (d.mount ? " (" + d.mount + ")" : "")).join(", "),
    ]));
  }
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
}

function connect() {
  const live = document.getElementById("live");
  const events = new EventSource("/api/events");
  events.onopen = () => { live.textContent = "live"; live.className = "pill up"; };
  events.onmessage = (e) => render(JSON.parse(e.data));
  events.onerror = () => {
    // The browser reconnects on its own; a refused token or a stopped node shows here.
    live.textContent = "reconnecting…";
    live.className = "pill down";
  };
}

connect();
