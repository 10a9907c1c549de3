// headwise circuit page: the graph of a circuit in layers on a canvas, the strongest edges by |score|, and the
// details of a node clicked. Data: the JSON block #circuit-data (see headwise/viz/circuit_page.py).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("circuit-data").textContent);
  var nodes = data.nodes, N = nodes.length, E = data.senders.length;
  var byId = {};
  nodes.forEach(function (n, i) { byId[n.id] = i; });
  var inCircuit = new Uint8Array(E);
  data.circuit_edges.forEach(function (i) { inCircuit[i] = 1; });
  var circuitNode = {};
  data.circuit.nodes.forEach(function (id) { circuitNode[id] = true; });
  data.circuit_edges.forEach(function (i) {
    circuitNode[nodes[data.senders[i]].id] = true; circuitNode[nodes[data.receivers[i]].id] = true;
  });

  var state = { method: data.method, count: data.default_edges, only: false, selected: -1 };
  var ranks = {};                                    // method -> edge indices, strongest |score| first
  function ranked(m) {
    if (!ranks[m]) {
      var s = data.scores[m], idx = new Array(E);
      for (var i = 0; i < E; i++) idx[i] = i;
      idx.sort(function (a, b) { return Math.abs(s[b]) - Math.abs(s[a]) || a - b; });
      ranks[m] = idx;
    }
    return ranks[m];
  }
  function fmt(x) {
    if (x === null || x === undefined) return "—";
    var a = Math.abs(x);
    return a !== 0 && (a < 1e-3 || a >= 1e4) ? x.toExponential(2) : x.toFixed(a < 1 ? 4 : 3);
  }
  function text(id, value) { document.getElementById(id).textContent = value; }

  text("cg-title", data.title || "circuit");
  text("cg-subtitle", data.subtitle || "");

  // --- controls -------------------------------------------------------------------------------------------
  var methodSel = document.getElementById("cg-method");
  data.methods.forEach(function (m) {
    var o = document.createElement("option");
    o.value = m;
    o.textContent = m + (data.measured[m] < E ? " (" + data.measured[m] + " edges measured)" : "");
    methodSel.appendChild(o);
  });
  methodSel.value = state.method;
  var countBox = document.getElementById("cg-count"), slider = document.getElementById("cg-slider");
  countBox.max = String(E); slider.max = String(E);
  countBox.value = String(state.count); slider.value = String(state.count);
  var onlyBox = document.getElementById("cg-only");
  var findBox = document.getElementById("cg-find");
  var ids = document.getElementById("cg-ids");
  nodes.forEach(function (n) { var o = document.createElement("option"); o.value = n.id; ids.appendChild(o); });
  var status = document.getElementById("cg-status");

  // --- the graph ------------------------------------------------------------------------------------------
  var wrap = document.getElementById("cg-graph-wrap");
  var canvas = document.getElementById("cg-canvas");
  var ctx = canvas.getContext("2d");
  var rows = data.rows.length;
  var xmax = 1;
  nodes.forEach(function (n) { xmax = Math.max(xmax, n.x); });
  var g = { w: 0, h: 0, rowH: 0, padL: 70, padR: 60, padT: 16, padB: 16 };

  function layout() {
    var width = Math.max(360, wrap.clientWidth - 2);
    g.rowH = Math.max(12, Math.min(48, Math.floor(720 / rows)));
    g.w = width; g.h = g.padT + g.padB + (rows - 1) * g.rowH;
    var dpr = window.devicePixelRatio || 1;
    canvas.width = Math.floor(g.w * dpr); canvas.height = Math.floor(g.h * dpr);
    canvas.style.width = g.w + "px"; canvas.style.height = g.h + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }
  function px(i) { return g.padL + (nodes[i].x / xmax) * (g.w - g.padL - g.padR); }
  function py(i) { return g.h - g.padB - nodes[i].y * g.rowH; }

  function drawnEdges() {                            // weakest first, so the strongest lie on top
    var s = data.scores[state.method], out;
    if (state.only) out = data.circuit_edges.slice();
    else out = ranked(state.method).slice(0, Math.max(0, Math.min(E, state.count)));
    out.sort(function (a, b) { return Math.abs(s[a]) - Math.abs(s[b]); });
    return out;
  }

  function draw() {
    var s = data.scores[state.method], edges = drawnEdges(), sel = state.selected;
    ctx.clearRect(0, 0, g.w, g.h);
    ctx.font = "10px system-ui, sans-serif";
    ctx.fillStyle = "#667085"; ctx.textBaseline = "middle"; ctx.textAlign = "left";
    var step = Math.max(1, Math.ceil(14 / g.rowH));
    for (var r = 0; r < rows; r += step) ctx.fillText(data.rows[r], 4, g.h - g.padB - r * g.rowH);
    ctx.strokeStyle = "#d0d5dd"; ctx.lineWidth = 0.6;  // key/value groups to the heads that read them
    nodes.forEach(function (n, i) {
      if (n.kind !== "kv" || !n.heads) return;
      n.heads.forEach(function (h) {
        var j = byId["L" + n.layer + ".H" + h];
        if (j === undefined) return;
        ctx.beginPath(); ctx.moveTo(px(i), py(i)); ctx.lineTo(px(j), py(j)); ctx.stroke();
      });
    });
    var top = 0;
    edges.forEach(function (e) { top = Math.max(top, Math.abs(s[e])); });
    top = top || 1;
    var touched = {};
    edges.forEach(function (e) {
      var a = data.senders[e], b = data.receivers[e];
      touched[a] = true; touched[b] = true;
      var near = sel < 0 || a === sel || b === sel;
      var w = 0.4 + 4.6 * Math.abs(s[e]) / top;
      if (inCircuit[e] && near) {
        ctx.strokeStyle = "rgba(0,0,0,0.7)"; ctx.lineWidth = w + 1.6;
        ctx.beginPath(); ctx.moveTo(px(a), py(a)); ctx.lineTo(px(b), py(b)); ctx.stroke();
      }
      var alpha = !near ? 0.06 : inCircuit[e] || sel >= 0 ? 0.9 : 0.45;
      if (near && data.survival && data.survival[e] !== null) alpha *= 0.2 + 0.8 * data.survival[e];  // how often it survives
      ctx.strokeStyle = (s[e] >= 0 ? "rgba(204,41,36," : "rgba(38,89,191,") + alpha + ")";
      ctx.lineWidth = w;
      ctx.beginPath(); ctx.moveTo(px(a), py(a)); ctx.lineTo(px(b), py(b)); ctx.stroke();
    });
    var rad = g.rowH >= 24 ? 5 : 3.5, many = N > 80;
    var face = { embed: "#5a5a5a", logits: "#5a5a5a", head: "#8fb3d9", mlp: "#9ccc9c", kv: "#d9c38f" };
    for (var i = 0; i < N; i++) {
      var n = nodes[i], x = px(i), y = py(i), big = circuitNode[n.id] ? 1.5 : 1;
      ctx.beginPath();
      if (n.kind === "head") ctx.arc(x, y, rad * big, 0, 2 * Math.PI);
      else ctx.rect(x - rad * big, y - rad * big, 2 * rad * big, 2 * rad * big);
      ctx.fillStyle = circuitNode[n.id] ? "#f2a541" : face[n.kind];
      ctx.fill();
      ctx.lineWidth = i === sel ? 3 : 1;
      ctx.strokeStyle = i === sel ? "#000" : circuitNode[n.id] ? "#333" : "#98a2b3";
      ctx.stroke();
      if (!many || circuitNode[n.id] || i === sel || n.kind === "embed" || n.kind === "logits" || (touched[i] && N <= 200)) {
        ctx.fillStyle = "#1d2330";
        ctx.fillText(n.id, x + rad * big + 2, y - rad);
      }
    }
    canvas.dataset.drawn = String(edges.length);
    canvas.dataset.method = state.method;
    canvas.dataset.selected = sel >= 0 ? nodes[sel].id : "";
    status.textContent = edges.length + " of " + E + " edges drawn" + (state.only ? " (the circuit)" : "");
  }

  // --- a node's details -----------------------------------------------------------------------------------
  function describe(n) {
    if (n.kind === "head") return "query head " + n.head + " of layer " + n.layer +
      (n.kv_group !== null && n.kv_group !== undefined ? " · reads key/value group " + n.kv_group : "");
    if (n.kind === "kv") return "key/value group " + n.kv_group + " of layer " + n.layer +
      (n.heads ? " · shared by heads " + n.heads.join(", ") : "");
    if (n.kind === "mlp") return "the MLP of layer " + n.layer;
    if (n.kind === "embed") return "the embeddings";
    return "the logits (the metric reads them)";
  }

  function edgeTable(i) {
    var s = data.scores[state.method], rank = ranked(state.method), body = document.querySelector("#cg-edges tbody");
    body.textContent = "";
    var shown = 0;
    for (var k = 0; k < E && shown < 12; k++) {
      var e = rank[k];
      if (data.senders[e] !== i && data.receivers[e] !== i) continue;
      var tr = document.createElement("tr");
      [nodes[data.senders[e]].id, nodes[data.receivers[e]].id, data.input_names[data.inputs[e]], fmt(s[e])]
        .forEach(function (v, c) {
          var td = document.createElement("td");
          td.textContent = v + (c === 0 && inCircuit[e] ? " ●" : "");
          if (c === 3) td.className = "num";
          tr.appendChild(td);
        });
      body.appendChild(tr);
      shown++;
    }
    body.dataset.rows = String(shown);
  }

  var patCanvas = document.getElementById("cg-pattern"), pctx = patCanvas.getContext("2d");
  function drawPattern(pattern) {
    var nq = pattern.length, nk = nq ? pattern[0].length : 0;
    var cell = Math.max(3, Math.min(22, Math.floor(360 / Math.max(1, nk))));
    var labels = cell >= 10 && data.tokens.length >= Math.max(nq, nk);
    pctx.font = "10px system-ui, sans-serif";
    var lw = 0;
    if (labels) data.tokens.forEach(function (t) { lw = Math.max(lw, pctx.measureText(t).width); });
    lw = labels ? Math.min(110, Math.ceil(lw) + 6) : 0;
    var w = lw + nk * cell, h = lw + nq * cell, dpr = window.devicePixelRatio || 1;
    patCanvas.width = Math.floor(w * dpr); patCanvas.height = Math.floor(h * dpr);
    patCanvas.style.width = w + "px"; patCanvas.style.height = h + "px";
    pctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    pctx.fillStyle = "#fff"; pctx.fillRect(0, 0, w, h);
    for (var q = 0; q < nq; q++) {
      for (var k = 0; k < nk; k++) {
        var v = Math.max(0, Math.min(1, pattern[q][k]));
        var c = Math.round(255 * (1 - Math.sqrt(v)));
        pctx.fillStyle = "rgb(" + c + "," + c + "," + Math.round(255 - 0.45 * (255 - c)) + ")";
        pctx.fillRect(lw + k * cell, lw + q * cell, cell, cell);
      }
    }
    if (labels) {
      pctx.fillStyle = "#1d2330"; pctx.textBaseline = "middle"; pctx.textAlign = "right";
      for (var a = 0; a < nq; a++) pctx.fillText(data.tokens[a], lw - 3, lw + a * cell + cell / 2, lw - 4);
      pctx.save(); pctx.rotate(-Math.PI / 2); pctx.textAlign = "left";
      for (var b = 0; b < nk; b++) pctx.fillText(data.tokens[b], -lw + 3, lw + b * cell + cell / 2, lw - 4);
      pctx.restore();
    }
    patCanvas.dataset.cells = String(nq * nk);
    patCanvas.dataset.offset = String(lw); patCanvas.dataset.cell = String(cell);   // CSS pixels
  }

  function showQK(qk) {
    var box = document.getElementById("cg-qk");
    box.textContent = "";
    if (!qk) { box.className = "hint"; box.textContent = "none for this node"; box.dataset.terms = "0"; return; }
    box.className = "";
    var tok = function (i) { return i !== null && i !== undefined && data.tokens[i] !== undefined ? " «" + data.tokens[i] + "»" : ""; };
    var head = document.createElement("div");
    head.textContent = "score of query " + qk.query + tok(qk.query) + " on key " + qk.key + tok(qk.key) + ", by part:";
    box.appendChild(head);
    var terms = qk.terms.slice().sort(function (a, b) { return Math.abs(b.value) - Math.abs(a.value); });
    var top = 0, total = 0;
    terms.forEach(function (t) { top = Math.max(top, Math.abs(t.value)); total += t.value; });
    var table = document.createElement("table"), hr = document.createElement("tr");
    ["query part", "key part", "value", ""].forEach(function (h) { var th = document.createElement("th"); th.textContent = h; hr.appendChild(th); });
    table.appendChild(hr);
    terms.forEach(function (t) {
      var tr = document.createElement("tr");
      [t.query_part, t.key_part, fmt(t.value)].forEach(function (v, c) {
        var td = document.createElement("td"); td.textContent = v; if (c === 2) td.className = "num"; tr.appendChild(td);
      });
      var td = document.createElement("td"), bar = document.createElement("span");
      bar.className = "bar"; bar.style.width = Math.round(80 * Math.abs(t.value) / (top || 1)) + "px";
      bar.style.background = t.value >= 0 ? "#cc2924" : "#2659bf";
      td.appendChild(bar); tr.appendChild(td); table.appendChild(tr);
    });
    box.appendChild(table);
    var sum = document.createElement("div");
    sum.className = "hint"; sum.textContent = "sum of the parts: " + fmt(total);
    box.appendChild(sum);
    box.dataset.terms = String(terms.length);
  }

  function select(i) {
    state.selected = i;
    var n = nodes[i], d = data.details[n.id] || {};
    text("cg-node", n.id + (circuitNode[n.id] ? " — in the circuit" : ""));
    text("cg-kind", describe(n));
    text("cg-direct", d.direct_effect === undefined ? "—" : fmt(d.direct_effect));
    edgeTable(i);
    if (d.pattern && d.pattern.length) {
      text("cg-pattern-note", d.pattern.length + " queries × " + d.pattern[0].length + " keys");
      drawPattern(d.pattern);
    } else {
      text("cg-pattern-note", n.kind === "head" ? "no pattern stored for this head" : "not a head");
      patCanvas.width = 0; patCanvas.height = 0; patCanvas.style.width = "0px"; patCanvas.style.height = "0px";
      patCanvas.dataset.cells = "0";
    }
    showQK(d.qk);
    findBox.value = n.id;
    draw();
  }

  // --- below: faithfulness, agreement, prompts --------------------------------------------------------------
  function drawFaith() {
    var f = data.faithfulness, fc = document.getElementById("cg-faith"), c = fc.getContext("2d");
    if (!f || !f.sizes.length) { fc.hidden = true; text("cg-faith-note", "no faithfulness curve in this circuit"); return; }
    var W = fc.width, H = fc.height, L = 46, R = 12, T = 10, B = 34;
    var xs = f.sizes, ys = f.recovered.map(function (v) { return v === null ? NaN : v; });
    var logx = xs[0] > 0 && xs[xs.length - 1] / xs[0] > 50;
    var tx = function (v) { return logx ? Math.log10(v) : v; };
    var x0 = tx(Math.min.apply(null, xs)), x1 = tx(Math.max.apply(null, xs));
    if (x1 === x0) x1 = x0 + 1;
    var lo = Math.min(0, Math.min.apply(null, ys.filter(isFinite))), hi = Math.max(1, Math.max.apply(null, ys.filter(isFinite)));
    var X = function (v) { return L + (tx(v) - x0) / (x1 - x0) * (W - L - R); };
    var Y = function (v) { return T + (hi - v) / (hi - lo) * (H - T - B); };
    c.clearRect(0, 0, W, H);
    c.strokeStyle = "#98a2b3"; c.lineWidth = 1;
    c.beginPath(); c.moveTo(L, T); c.lineTo(L, H - B); c.lineTo(W - R, H - B); c.stroke();
    c.font = "10px system-ui, sans-serif"; c.fillStyle = "#667085"; c.textAlign = "right"; c.textBaseline = "middle";
    [lo, 0, 0.5, 1, hi].filter(function (v, i, a) { return a.indexOf(v) === i; }).forEach(function (v) { c.fillText(v.toFixed(1), L - 4, Y(v)); });
    c.textAlign = "center"; c.textBaseline = "top";
    c.fillText(String(xs[0]), X(xs[0]), H - B + 4); c.fillText(String(xs[xs.length - 1]), X(xs[xs.length - 1]), H - B + 4);
    c.fillText("edges kept" + (logx ? " (log scale)" : ""), (L + W - R) / 2, H - B + 16);
    var frac = data.circuit.fraction;
    if (frac !== null) { c.setLineDash([5, 4]); c.strokeStyle = "#f2a541"; c.beginPath(); c.moveTo(L, Y(frac)); c.lineTo(W - R, Y(frac)); c.stroke(); c.setLineDash([]); }
    var k = data.circuit_edges.length;
    if (k > 0 && (!logx || k >= xs[0])) { c.setLineDash([2, 3]); c.strokeStyle = "#000"; c.beginPath(); c.moveTo(X(k), T); c.lineTo(X(k), H - B); c.stroke(); c.setLineDash([]); }
    c.strokeStyle = "#333"; c.lineWidth = 1.5; c.beginPath();
    var started = false;
    xs.forEach(function (v, i) { if (!isFinite(ys[i])) return; if (!started) { c.moveTo(X(v), Y(ys[i])); started = true; } else c.lineTo(X(v), Y(ys[i])); });
    c.stroke();
    c.fillStyle = "#333";
    xs.forEach(function (v, i) { if (isFinite(ys[i])) { c.beginPath(); c.arc(X(v), Y(ys[i]), 2.5, 0, 2 * Math.PI); c.fill(); } });
    text("cg-faith-note", "metric recovered (1 = clean, 0 = every edge ablated) against the edges kept; " +
      "the circuit: " + k + " edges" + (data.circuit.recovered !== null ? ", recovering " + fmt(data.circuit.recovered) : "") +
      (frac !== null ? " (asked: " + frac + ")" : "") + "; clean metric " + fmt(f.clean_metric) + ", corrupted " + fmt(f.corrupted_metric));
  }

  function showAgreement() {
    var a = data.agreement, box = document.getElementById("cg-agreement"), b = data.bootstrap;
    var said = !a ? "one method only" : Object.keys(a).map(function (k) { var v = a[k];
      return k + " " + (typeof v !== "number" ? JSON.stringify(v) : Number.isInteger(v) ? String(v) : fmt(v)); }).join(" · ");
    if (b) said += " — bootstrap (" + b.resamples + " resamples of " + b.pairs + " pairs): the " + b.size +
      "-edge circuit's Jaccard " + fmt(b.circuit_jaccard) + ", " + Math.round(100 * b.stable_share) +
      "% of its edges in ≥ 90% of the resamples; edges drawn fainter the less often they survive";
    box.textContent = said;
  }

  function showPrompts() {
    var body = document.querySelector("#cg-prompts tbody"), hr = document.createElement("tr");
    ["clean", "corrupted", "answer", "wrong"].forEach(function (h) { var th = document.createElement("th"); th.textContent = h; hr.appendChild(th); });
    body.appendChild(hr);
    data.prompts.slice(0, 50).forEach(function (p) {
      var tr = document.createElement("tr");
      [p.clean, p.corrupted, p.answer, p.wrong].forEach(function (v) { var td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
      body.appendChild(tr);
    });
  }

  // --- events ---------------------------------------------------------------------------------------------
  function setCount(v) {
    var c = Math.max(0, Math.min(E, Math.floor(Number(v)) || 0));
    state.count = c; countBox.value = String(c); slider.value = String(c);
    draw();
  }
  countBox.addEventListener("change", function () { setCount(countBox.value); });
  slider.addEventListener("input", function () { setCount(slider.value); });
  onlyBox.addEventListener("change", function () { state.only = onlyBox.checked; draw(); });
  methodSel.addEventListener("change", function () {
    state.method = methodSel.value;
    if (state.selected >= 0) select(state.selected); else draw();
  });
  function find() {
    var i = byId[findBox.value.trim()];
    if (i === undefined) { status.textContent = "no node " + JSON.stringify(findBox.value.trim()); return; }
    select(i);
  }
  findBox.addEventListener("change", find);
  findBox.addEventListener("keydown", function (ev) { if (ev.key === "Enter") find(); });
  canvas.addEventListener("click", function (ev) {
    var box = canvas.getBoundingClientRect(), x = ev.clientX - box.left, y = ev.clientY - box.top;
    var best = -1, dist = 100;                       // within 10 px
    for (var i = 0; i < N; i++) {
      var dx = px(i) - x, dy = py(i) - y, d2 = dx * dx + dy * dy;
      if (d2 < dist) { dist = d2; best = i; }
    }
    if (best >= 0) select(best);
  });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { layout(); draw(); }, 100);
  });

  // Where a node is drawn, in CSS pixels from the canvas's top left (for tests and for tools around the page).
  window.circuitView = { nodeXY: function (id) { var i = byId[id]; return i === undefined ? null : [px(i), py(i)]; } };

  layout();
  draw();
  drawFaith();
  showAgreement();
  showPrompts();
  document.body.dataset.ready = "1";
})();
