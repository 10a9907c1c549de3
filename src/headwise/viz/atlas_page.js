// headwise atlas page: every head of a model on a layers x heads grid, coloured by role, with a card per head.
// Data: the JSON block #atlas-data (atlas.json, format "headwise.atlas/1"; see headwise/viz/atlas_page.py) and
// #atlas-options ({open, card_only}). Every string from the data is shown through textContent, never as HTML.
(function () {
  "use strict";
  var atlas = JSON.parse(document.getElementById("atlas-data").textContent);
  var options = JSON.parse(document.getElementById("atlas-options").textContent) || {};
  var heads = atlas.heads || [], model = atlas.model || {};
  var byId = {};
  heads.forEach(function (h, i) { byId[h.id] = i; });
  var NL = model.num_layers, H = model.num_heads;
  if (typeof NL !== "number" || typeof H !== "number") {
    NL = 0; H = 0;
    heads.forEach(function (h) { NL = Math.max(NL, h.layer + 1); H = Math.max(H, h.head + 1); });
  }

  // --- helpers --------------------------------------------------------------------------------------------
  function el(tag, cls, txt) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (txt !== undefined && txt !== null) e.textContent = String(txt);
    return e;
  }
  function fmt(x) {
    if (x === null || x === undefined) return "—";
    if (typeof x !== "number") return String(x);
    var a = Math.abs(x);
    if (a === 0) return "0";
    return a < 1e-3 || a >= 1e4 ? x.toExponential(2) : x.toFixed(a < 1 ? 4 : 3).replace(/\.?0+$/, "");
  }
  function shown(token) { return String(token).replace(/\n/g, "\u21b5").replace(/\t/g, "\u2192"); }
  function text(id, value) { document.getElementById(id).textContent = value; }
  function count(n) { return Number(n).toLocaleString("en"); }
  function hashId() {
    var raw = location.hash.slice(1);
    try { return decodeURIComponent(raw); } catch (e) { return raw; }
  }

  // --- roles and their colours (Okabe & Ito's colour-blind-safe palette, then Paul Tol's muted one) --------
  var PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
                 "#882255", "#44AA99", "#117733", "#332288", "#DDCC77", "#AA4499", "#88CCEE"];
  var OTHER = "#BBBBBB";
  var roles = (atlas.roles || []).slice(), roleIndex = {};
  roles.forEach(function (r, i) { roleIndex[r.name] = i; });
  heads.forEach(function (h) {
    if (!(h.role in roleIndex)) { roleIndex[h.role] = roles.length; roles.push({ name: h.role, description: "" }); }
  });
  var colour = {}, next = 0;
  roles.forEach(function (r) { colour[r.name] = r.name === "other" ? OTHER : PALETTE[next++ % PALETTE.length]; });
  function swatch(name) { var s = el("span", "sw"); s.style.background = colour[name] || OTHER; return s; }

  // --- importance, relative to the largest ----------------------------------------------------------------
  function impValue(h) {
    var imp = h.importance;
    return imp && typeof imp.value === "number" ? Math.abs(imp.value) : null;
  }
  var largest = 0;
  heads.forEach(function (h) { var v = impValue(h); if (v !== null && v > largest) largest = v; });

  // --- heading --------------------------------------------------------------------------------------------
  text("aw-title", (model.name || "model") + " — atlas of " + count(heads.length) + " heads");
  var corpus = atlas.corpus || {};
  var sub = [model.kind, model.family, NL + " layers \u00d7 " + H + " heads"];
  if (model.kv_heads) sub.push(model.kv_heads + " key/value heads a layer");
  if (corpus.source) {
    sub.push("corpus: " + corpus.source + (corpus.texts != null ? ", " + count(corpus.texts) + " texts" : "") +
             (corpus.tokens != null ? ", " + count(corpus.tokens) + " tokens" : ""));
  }
  text("aw-subtitle", sub.filter(Boolean).join(" \u00b7 "));
  var imp = atlas.importance;
  if (imp) {
    var note = ["importance: " + (imp.metric || "—")];
    if (imp.estimator) note.push("estimated by " + imp.estimator);
    if (imp.measured != null) note.push(imp.measured + " of " + (imp.of != null ? imp.of : heads.length) + " measured exactly");
    if (imp.search) note.push(imp.search);
    var ag = imp.agreement;
    if (ag) note.push("estimate vs measured: " + Object.keys(ag).map(function (k) { return k + " " + fmt(ag[k]); }).join(", "));
    text("aw-importance-note", note.join(" \u00b7 "));
  }

  // --- legend ---------------------------------------------------------------------------------------------
  var legend = document.getElementById("aw-legend");
  legend.appendChild(el("strong", null, "colour: the head's primary role"));
  roles.forEach(function (r) {
    var row = el("div", "row");
    row.appendChild(swatch(r.name));
    row.appendChild(el("strong", null, r.name));
    var extra = (r.description || "") + (r.threshold != null ? " (threshold " + fmt(r.threshold) + ")" : "");
    if (extra) row.appendChild(el("span", "hint", extra));
    legend.appendChild(row);
  });
  legend.appendChild(el("strong", null, "bar: |importance| relative to the largest (" + fmt(largest) + ")"));
  [["bar", "solid: measured (exact)"], ["bar est", "hatched, dashed outline: an estimate, not a measurement"],
   [null, "no bar: no importance for this head"]].forEach(function (item) {
    var row = el("div", "row"), sw = el("span", "sw bar-sw");
    if (item[0]) { var b = el("span", item[0]); b.style.height = "8px"; sw.appendChild(b); }
    row.appendChild(sw);
    row.appendChild(el("span", null, item[1]));
    legend.appendChild(row);
  });

  // --- the grid: one element per head, built once; one delegated listener ---------------------------------
  var grid = document.getElementById("aw-grid");
  grid.style.gridTemplateColumns = "auto repeat(" + H + ", var(--cell))";
  var cells = new Array(heads.length), slots = {};
  heads.forEach(function (h, i) { slots[h.layer * H + h.head] = i; });
  var frag = document.createDocumentFragment();
  frag.appendChild(el("div", "lab", "L\\H"));
  for (var c = 0; c < H; c++) frag.appendChild(el("div", "lab", c));
  for (var l = 0; l < NL; l++) {
    frag.appendChild(el("div", "lab", l));
    for (var k = 0; k < H; k++) {
      var i = slots[l * H + k];
      if (i === undefined) { frag.appendChild(el("div")); continue; }
      var h = heads[i], cell = el("div", "cell"), v = impValue(h);
      cell.style.background = colour[h.role] || OTHER;
      cell.dataset.id = h.id;
      cell.setAttribute("role", "gridcell");
      cell.tabIndex = -1;
      var tip = h.id + " \u00b7 " + h.role;
      if (v !== null) {
        var exact = !!h.importance.exact, bar = el("span", exact ? "bar" : "bar est");
        bar.style.height = Math.max(2, Math.round((largest > 0 ? v / largest : 0) * 16)) + "px";
        cell.appendChild(bar);
        tip += " \u00b7 importance " + fmt(h.importance.value) + (exact ? " (exact)" : " (estimate)");
      }
      cell.title = tip;
      cells[i] = cell;
      frag.appendChild(cell);
    }
  }
  grid.appendChild(frag);
  if (cells[0]) cells[0].tabIndex = 0;
  grid.dataset.cells = String(grid.querySelectorAll(".cell").length);
  grid.addEventListener("click", function (e) {
    var cell = e.target.closest(".cell");
    if (cell) open(cell.dataset.id);
  });
  grid.addEventListener("keydown", function (e) {
    var cell = e.target.closest(".cell");
    if (!cell) return;
    var h = heads[byId[cell.dataset.id]], to = null;
    var moves = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
    if (e.key === "Enter" || e.key === " ") { open(h.id); e.preventDefault(); return; }
    if (!moves[e.key]) return;
    to = slots[(h.layer + moves[e.key][0]) * H + h.head + moves[e.key][1]];
    if (to !== undefined && h.head + moves[e.key][1] >= 0 && h.head + moves[e.key][1] < H) {
      cell.tabIndex = -1; cells[to].tabIndex = 0; cells[to].focus(); e.preventDefault();
    }
  });

  // --- search and filters ---------------------------------------------------------------------------------
  var keys = heads.map(function (h) {
    var names = [h.role].concat((h.roles || []).map(function (r) { return r.name; }));
    var w = h.writes || {}, toks = [];
    (w.raises || []).concat(w.lowers || []).forEach(function (t) { toks.push(String(t.token).trim().toLowerCase()); });
    return { id: h.id.toLowerCase(), roles: names.map(function (n) { return String(n).toLowerCase(); }), tokens: toks };
  });
  var searchBox = document.getElementById("aw-search");
  var layerMin = document.getElementById("aw-layer-min"), layerMax = document.getElementById("aw-layer-max");
  var minImp = document.getElementById("aw-min-imp"), countBox = document.getElementById("aw-count");
  layerMin.max = layerMax.max = String(Math.max(0, NL - 1));
  layerMin.value = "0"; layerMax.value = String(Math.max(0, NL - 1));
  var roleBoxes = document.getElementById("aw-roles"), shownRoles = {};
  roles.forEach(function (r) {
    var n = heads.filter(function (h) { return h.role === r.name; }).length;
    if (!n) return;
    var label = el("label"), box = el("input");
    box.type = "checkbox"; box.checked = true; box.value = r.name;
    shownRoles[r.name] = true;
    label.appendChild(box); label.appendChild(document.createTextNode(" ")); label.appendChild(swatch(r.name));
    label.appendChild(document.createTextNode(" " + r.name + " (" + n + ")"));
    roleBoxes.appendChild(label);
  });
  roleBoxes.addEventListener("change", function (e) { shownRoles[e.target.value] = e.target.checked; filter(); });

  function termMatches(key, t) {
    if (key.id === t || key.id.indexOf(t + ".") === 0) return true;
    for (var j = 0; j < key.roles.length; j++) if (key.roles[j].indexOf(t) === 0) return true;
    for (j = 0; j < key.tokens.length; j++) if (key.tokens[j] && key.tokens[j].indexOf(t) >= 0) return true;
    return false;
  }
  function number(box, fallback) { var x = parseFloat(box.value); return isFinite(x) ? x : fallback; }
  function filter() {
    var terms = searchBox.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    var lo = number(layerMin, -Infinity), hi = number(layerMax, Infinity), least = number(minImp, 0), n = 0;
    heads.forEach(function (h, i) {
      var ok = shownRoles[h.role] !== false && h.layer >= lo && h.layer <= hi;
      if (ok && least > 0) { var v = impValue(h); ok = v !== null && v >= least; }
      for (var j = 0; ok && j < terms.length; j++) ok = termMatches(keys[i], terms[j]);
      cells[i].classList.toggle("off", !ok);
      if (ok) n++;
    });
    countBox.textContent = count(n) + " of " + count(heads.length) + " heads match";
    countBox.dataset.count = String(n);
  }
  [searchBox, layerMin, layerMax, minImp].forEach(function (box) { box.addEventListener("input", filter); });

  // --- the card, rendered on demand -----------------------------------------------------------------------
  var card = document.getElementById("aw-card"), current = null;
  function section(title, hint) {
    var h3 = el("h3", null, title);
    if (hint) h3.appendChild(el("span", "hint", " " + hint));
    card.appendChild(h3);
  }
  function table(header, rows) {
    var t = el("table"), tr = el("tr");
    header.forEach(function (x) { tr.appendChild(el("th", null, x)); });
    t.appendChild(tr);
    rows.forEach(function (row) {
      var r = el("tr");
      row.forEach(function (x) {
        var td = el("td", typeof x === "number" ? "num" : null);
        if (x instanceof Node) td.appendChild(x); else td.textContent = typeof x === "number" ? fmt(x) : (x == null ? "—" : String(x));
        r.appendChild(td);
      });
      t.appendChild(r);
    });
    card.appendChild(t);
    return t;
  }
  function badge(exact) { return el("span", "kind " + (exact ? "exact" : "estimate"), exact ? "exact" : "estimate"); }
  function headLink(id) {
    if (!(id in byId)) return el("span", null, id);
    var a = el("a", null, id); a.href = "#" + id; a.dataset.head = id; return a;
  }
  function strip(tokens, mark, shade, weight) {
    var s = el("div", "strip");
    tokens.forEach(function (t, j) {
      var span = el("span", "tok", shown(t));
      if (t === "\u2026") span.classList.add("gap");
      if (j === shade) {
        span.classList.add("key");
        span.style.background = "rgba(0, 114, 178, " + (0.15 + 0.85 * Math.max(0, Math.min(1, weight))).toFixed(3) + ")";
        if (weight > 0.5) span.style.color = "#fff";
      }
      if (j === mark) span.classList.add("q");
      s.appendChild(span);
    });
    return s;
  }
  function offsetChart(o) {
    var NS = "http://www.w3.org/2000/svg", shares = (o.shares || []).slice(), start = o.start || 0;
    var all = shares.concat(typeof o.beyond === "number" ? [o.beyond] : []);
    var W = 400, Hh = 120, left = 48, bottom = 18, top = 6, n = Math.max(1, all.length);
    var bw = (W - left - 4) / n, top1 = Math.max.apply(null, all.concat([1e-9]));
    var svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", Hh); svg.setAttribute("viewBox", "0 0 " + W + " " + Hh);
    svg.setAttribute("class", "offsets"); svg.setAttribute("data-bars", String(shares.length));
    function add(tag, attrs, txt) {
      var e = document.createElementNS(NS, tag);
      Object.keys(attrs).forEach(function (a) { e.setAttribute(a, attrs[a]); });
      if (txt !== undefined) e.textContent = txt;
      svg.appendChild(e);
      return e;
    }
    add("line", { x1: left, x2: W, y1: Hh - bottom, y2: Hh - bottom, stroke: "#98a2b3" });
    add("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, fmt(top1));
    add("text", { x: left - 4, y: Hh - bottom, "text-anchor": "end" }, "0");
    var step = Math.max(1, Math.ceil(n / 12));
    all.forEach(function (s, j) {
      var beyond = j >= shares.length, hgt = (Hh - bottom - top) * (s || 0) / top1, x = left + j * bw;
      var r = add("rect", { x: x + 1, y: Hh - bottom - hgt, width: Math.max(1, bw - 2), height: hgt,
                            fill: beyond ? "#98a2b3" : "#0072B2" });
      var label = beyond ? "beyond" : "d = " + (start + j);
      var t = document.createElementNS(NS, "title"); t.textContent = label + ": " + fmt(s); r.appendChild(t);
      if (beyond || j % step === 0) {
        add("text", { x: x + bw / 2, y: Hh - 4, "text-anchor": "middle" }, beyond ? ">" : String(start + j));
      }
    });
    return svg;
  }

  function render(h) {
    card.textContent = "";
    card.dataset.head = h.id;
    var title = el("h2", null, h.id);
    title.id = "aw-card-id";
    card.appendChild(title);
    var line = el("div", "hint");
    line.appendChild(swatch(h.role));
    line.appendChild(document.createTextNode(" layer " + h.layer + ", head " + h.head + " \u00b7 primary role: " + h.role));
    card.appendChild(line);

    section("roles", "every role whose evidence passes its threshold, strongest first");
    if ((h.roles || []).length) {
      table(["role", "score", "threshold", "evidence"], h.roles.map(function (r) {
        var name = el("span"); name.appendChild(swatch(r.name)); name.appendChild(document.createTextNode(" " + r.name));
        return [name, r.score, r.threshold, r.detail];
      }));
    } else card.appendChild(el("div", "hint", "no role passes its threshold"));

    var stats = h.stats || {};
    section("statistics");
    if (Object.keys(stats).length) table(["statistic", "value"], Object.keys(stats).map(function (k) { return [k, stats[k]]; }));
    else card.appendChild(el("div", "hint", "none"));

    var o = h.offsets;
    section("offset profile", "mean share of attention at offset d = query \u2212 key");
    if (o && (o.shares || []).length) {
      card.appendChild(offsetChart(o));
      var extra = [];
      if (o.beyond != null) extra.push("beyond the last offset: " + fmt(o.beyond));
      if (o.first != null) extra.push("on the first token: " + fmt(o.first));
      card.appendChild(el("div", "hint", extra.join(" \u00b7 ")));
    } else card.appendChild(el("div", "hint", "none"));

    section("top contexts", "the key token shaded by its weight, the query token underlined");
    var ctx = h.contexts || [];
    var box = el("div"); box.id = "aw-contexts"; box.dataset.count = String(ctx.length); card.appendChild(box);
    if (!ctx.length) box.appendChild(el("div", "hint", "none"));
    ctx.forEach(function (c) {
      box.appendChild(strip(c.tokens || [], c.query, c.key, c.weight));
      var toks = c.tokens || [];
      box.appendChild(el("div", "strip-note", "weight " + fmt(c.weight) + " \u00b7 query \u00ab" + shown(toks[c.query]) +
        "\u00bb on key \u00ab" + shown(toks[c.key]) + "\u00bb \u00b7 text " + c.text + ", position " + c.position));
    });

    section("largest writes", "where the head's output is largest (the token underlined)");
    var outs = h.outputs || [];
    if (!outs.length) card.appendChild(el("div", "hint", "none"));
    outs.forEach(function (p) {
      card.appendChild(strip(p.tokens || [], p.at, null, 0));
      card.appendChild(el("div", "strip-note", "norm " + fmt(p.norm) + " \u00b7 text " + p.text + ", position " + p.position));
    });

    var w = h.writes;
    section("written tokens", w && w.label ? w.label : "");
    if (w) {
      var both = el("div", "writes");
      [["raises", w.raises], ["lowers", w.lowers]].forEach(function (pair) {
        var col = el("div");
        col.appendChild(el("strong", null, pair[0]));
        var t = el("table");
        (pair[1] || []).forEach(function (x) {
          var r = el("tr"), a = el("td"), b = el("td", "num", fmt(x.value));
          a.appendChild(el("span", "wtok", shown(x.token))); r.appendChild(a); r.appendChild(b); t.appendChild(r);
        });
        col.appendChild(t);
        both.appendChild(col);
      });
      card.appendChild(both);
    } else card.appendChild(el("div", "hint", "none"));

    section("OV circuit");
    if (h.ov) {
      card.appendChild(el("div", null, "copying score: " + fmt(h.ov.copying)));
      if ((h.ov.top || []).length) {
        table(["from", "to", "value"], h.ov.top.map(function (m) {
          return [el("span", "wtok", shown(m.from)), el("span", "wtok", shown(m.to)), m.value];
        }));
      }
    } else card.appendChild(el("div", "hint", "not computed"));

    section("effect");
    [["loss effect", h.loss_effect, "aw-loss"], ["importance", h.importance, "aw-imp"]].forEach(function (item) {
      var row = el("div"), v = item[1];
      row.id = item[2];
      row.appendChild(el("strong", null, item[0] + ": "));
      if (v) {
        row.appendChild(document.createTextNode(fmt(v.value) + (v.stderr != null ? " ± " + fmt(v.stderr) : "") + " "));
        row.appendChild(badge(!!v.exact));
        if (v.rank != null) row.appendChild(document.createTextNode(" rank " + v.rank + " of " + heads.length));
        if (v.label) row.appendChild(el("div", "hint", v.label));
      } else row.appendChild(el("span", "hint", "not computed"));
      card.appendChild(row);
    });

    var partners = h.partners || {};
    section("partners", "composition: heads this one reads from (in) and heads that read it (out)");
    var rows = [];
    [["in", partners.in], ["out", partners.out]].forEach(function (pair) {
      (pair[1] || []).forEach(function (p) { rows.push([pair[0], headLink(p.head), p.kind, p.score]); });
    });
    if (rows.length) table(["", "head", "kind", "score"], rows).id = "aw-partners";
    else card.appendChild(el("div", "hint", "none"));
  }

  function open(id) {
    if (!(id in byId)) return false;
    if (current !== null && cells[current]) cells[current].classList.remove("sel");
    current = byId[id];
    var cell = cells[current];
    if (cell) { cell.classList.add("sel"); }
    render(heads[current]);
    if (!options.card_only && hashId() !== id) {
      try { location.hash = id; } catch (e) { /* a sandboxed frame without a URL of its own */ }
    }
    return true;
  }
  card.addEventListener("click", function (e) {
    var a = e.target.closest("a[data-head]");
    if (a) { e.preventDefault(); open(a.dataset.head); card.scrollIntoView({ block: "nearest" }); }
  });
  window.addEventListener("hashchange", function () {
    var id = hashId();
    if (id && (current === null || heads[current].id !== id)) open(id);
  });

  filter();
  if (options.card_only) document.body.classList.add("card-only");
  var first = options.open || hashId();
  if (first) open(first);
  window.atlasView = { open: open, current: function () { return current === null ? null : heads[current].id; } };
  document.body.dataset.ready = "1";
})();
