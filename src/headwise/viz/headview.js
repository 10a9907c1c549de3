// headwise head view: tokens in two columns, one line per (query, key) pair whose opacity is the
// attention weight, drawn on a canvas. Data: the JSON block #headview-data (see headwise/viz/headview.py).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("headview-data").textContent);
  var n = data.n, L = data.layers, H = data.heads, K = data.k;

  function decode(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  var wq = decode(data.weights);                 // (L, H, n, K) weight · 255, rounded
  var kb = decode(data.keys);                    // (L, H, n, K) key index, uint16 little-endian
  var keys = new Uint16Array(kb.length / 2);
  for (var i = 0; i < keys.length; i++) keys[i] = kb[2 * i] | (kb[2 * i + 1] << 8);

  var state = { layer: 0, heads: [], hover: null, range: null };
  for (var h = 0; h < H; h++) state.heads.push(true);

  function colour(h) { return "hsl(" + Math.round((h * 360) / H) + ", 75%, 42%)"; }

  document.getElementById("hv-title").textContent = data.title || "head view";
  document.getElementById("hv-subtitle").textContent = data.subtitle || "";
  document.getElementById("hv-note").textContent = data.note || "";

  (data.links || []).forEach(function (link) {      // pages written beside this one (relative file names)
    var a = document.createElement("a");
    a.href = link.href; a.textContent = link.text + " →";
    document.getElementById("hv-links").appendChild(a);
  });
  var ov = data.overview || null;                     // rows are bins of a pooled overview (see setRange)
  if (ov) document.getElementById("hv-range").hidden = false;

  var layerSel = document.getElementById("hv-layer");
  for (var l = 0; l < L; l++) {
    var o = document.createElement("option");
    o.value = String(l); o.textContent = String(l);
    layerSel.appendChild(o);
  }
  var headsBox = document.getElementById("hv-heads");
  var boxes = [];
  var roleSpans = [];
  for (var h2 = 0; h2 < H; h2++) {
    var lab = document.createElement("label");
    lab.dataset.head = String(h2);
    var cb = document.createElement("input");
    cb.type = "checkbox"; cb.checked = true; cb.dataset.head = String(h2);
    var sw = document.createElement("span");
    sw.className = "sw"; sw.style.background = colour(h2);
    var txt = document.createElement("span");
    txt.textContent = String(h2);
    var role = document.createElement("span");
    role.className = "role";
    lab.appendChild(cb); lab.appendChild(sw); lab.appendChild(txt); lab.appendChild(role);
    headsBox.appendChild(lab);
    boxes.push(cb); roleSpans.push(role);
  }

  // The canvas covers only the visible part of the token list (a scroll container with a spacer):
  // the browser rasterises a viewport-sized bitmap, and lines outside the view are skipped.
  var wrap = document.getElementById("hv-wrap");
  var canvas = document.getElementById("hv-canvas");
  var spacer = document.getElementById("hv-spacer");
  var ctx = canvas.getContext("2d");
  var rowH = n > 128 ? 14 : 18, padTop = 6, font = (n > 128 ? 11 : 13) + "px system-ui, sans-serif";
  var total = padTop * 2 + n * rowH;
  var geom = { colW: 0, left: 0, right: 0, width: 0, view: 0 };

  function layout() {
    var width = Math.max(360, wrap.clientWidth);
    var avail = Math.max(200, window.innerHeight - wrap.getBoundingClientRect().top - 8);
    var view = Math.min(total, Math.floor(avail));
    wrap.style.height = view + "px";
    spacer.style.height = Math.max(0, total - view) + "px";
    ctx.font = font;
    var widest = 0;
    for (var i = 0; i < n; i++) widest = Math.max(widest, ctx.measureText(data.tokens[i]).width);
    var colW = Math.min(Math.ceil(widest) + 12, Math.floor(width * 0.3));
    var dpr = window.devicePixelRatio || 1;
    canvas.width = Math.floor(width * dpr); canvas.height = Math.floor(view * dpr);
    canvas.style.width = width + "px"; canvas.style.height = view + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    geom = { colW: colW, left: colW, right: width - colW, width: width, view: view };
  }

  function y(i) { return padTop + i * rowH + rowH / 2; }   // in list coordinates

  function clip(text, maxW) {
    if (ctx.measureText(text).width <= maxW) return text;
    var t = text;
    while (t.length > 1 && ctx.measureText(t + "…").width > maxW) t = t.slice(0, -1);
    return t + "…";
  }

  var BUDGET = 20000;                               // most lines drawn at once without hovering
  var status = document.getElementById("hv-status");

  // Call fn(q, yQuery, yKey) for every stored weight of head h in the current layer that is drawn now:
  // q > 0, inside the view, and through the hovered token if any.
  function visitHead(h, fn) {
    var hv = state.hover, top = wrap.scrollTop, bottom = top + geom.view;
    var base = (state.layer * H + h) * n * K;
    var r0 = 0, r1 = n;
    if (hv && hv.side === "left") { r0 = hv.index; r1 = hv.index + 1; }
    for (var r = r0; r < r1; r++) {
      var off = base + r * K, ya = y(r);
      for (var k = 0; k < K; k++) {
        var q = wq[off + k];
        if (q === 0) continue;
        var j = keys[off + k];
        if (hv && hv.side === "right" && j !== hv.index) continue;
        var yb = y(j);
        if ((ya < top && yb < top) || (ya > bottom && yb > bottom)) continue;   // outside the view
        fn(q, ya, yb);
      }
    }
  }
  function visit(fn) { for (var h = 0; h < H; h++) if (state.heads[h]) visitHead(h, fn); }

  function render() {
    var t0 = performance.now();
    var layer = state.layer, hv = state.hover;
    var top = wrap.scrollTop, bottom = top + geom.view;
    ctx.clearRect(0, 0, geom.width, geom.view);
    ctx.font = font; ctx.textBaseline = "middle";
    var first = Math.max(0, Math.floor((top - padTop) / rowH)), last = Math.min(n - 1, Math.ceil((bottom - padTop) / rowH));
    var rg = state.range;
    for (var i = first; i <= last; i++) {
      var yi = y(i) - top;
      if (rg && i >= rg.r0 && i < rg.r1) {          // the chosen queries' bins
        ctx.fillStyle = "#d1e9ff";
        ctx.fillRect(0, yi - rowH / 2, geom.left - 4, rowH);
        ctx.fillStyle = "#1570ef";
        ctx.fillRect(geom.left - 4, yi - rowH / 2, 3, rowH);
      }
      var hiL = hv && hv.side === "left" && hv.index === i, hiR = hv && hv.side === "right" && hv.index === i;
      if (hiL || hiR) {
        ctx.fillStyle = "#fff3bf";
        if (hiL) ctx.fillRect(0, yi - rowH / 2, geom.left - 4, rowH);
        if (hiR) ctx.fillRect(geom.right + 4, yi - rowH / 2, geom.colW - 4, rowH);
      }
      ctx.fillStyle = "#1d2330";
      var tok = clip(data.tokens[i], geom.colW - 12);
      ctx.textAlign = "right"; ctx.fillText(tok, geom.left - 8, yi);
      ctx.textAlign = "left"; ctx.fillText(tok, geom.right + 8, yi);
    }
    var x0 = geom.left, x1 = geom.right, drawn = 0;
    ctx.lineWidth = n > 128 ? 1 : 1.5;
    // Pass 1: how many visible lines at each opacity level. Past BUDGET lines, the faintest levels are
    // left out (the page says so); hovering a token always shows all of its lines.
    var hist = new Uint32Array(256);
    visit(function (q) { hist[q]++; });
    var qmin = 1, count = 0;
    for (var q = 255; q >= 1; q--) {
      if (count + hist[q] > BUDGET) { qmin = q + 1; break; }
      count += hist[q];
    }
    for (var h = 0; h < H; h++) {
      if (!state.heads[h]) continue;
      var buckets = new Array(256);                 // one path per opacity level: few stroke() calls
      visitHead(h, function (q, ya, yb) {
        if (q < qmin) return;
        var p = buckets[q] || (buckets[q] = new Path2D());
        p.moveTo(x0, ya - top); p.lineTo(x1, yb - top);
        drawn++;
      });
      ctx.strokeStyle = colour(h);
      for (var b = 1; b < 256; b++) {
        if (!buckets[b]) continue;
        ctx.globalAlpha = b / 255;
        ctx.stroke(buckets[b]);
      }
      ctx.globalAlpha = 1;
    }
    canvas.dataset.minWeight = (qmin / 255).toFixed(4);
    status.textContent = qmin > 1
      ? "lines under " + (qmin / 255).toFixed(3) + " hidden (" + count + " drawn); hover a token to see all of its lines"
      : "";
    var ms = performance.now() - t0;
    canvas.dataset.lines = String(drawn);
    canvas.dataset.layer = String(layer);
    canvas.dataset.heads = state.heads.map(function (on, k) { return on ? k : -1; }).filter(function (k) { return k >= 0; }).join(",");
    canvas.dataset.hover = hv ? hv.side + ":" + hv.index : "";
    canvas.dataset.range = rg ? rg.r0 + "," + rg.r1 : "";
    canvas.dataset.renderMs = ms.toFixed(1);
    api.lastRenderMs = ms;
    api.lines = drawn;
  }

  function updateRoles() {
    for (var h = 0; h < H; h++) {
      var r = data.roles ? data.roles[state.layer][h] : "";
      roleSpans[h].textContent = r ? "· " + r : "";
      roleSpans[h].parentElement.title = "layer " + state.layer + ", head " + h + (r ? ": " + r : "");
    }
  }

  layerSel.addEventListener("change", function () { state.layer = Number(layerSel.value); updateRoles(); redraw(); });
  boxes.forEach(function (cb, h) {
    cb.addEventListener("change", function () { state.heads[h] = cb.checked; redraw(); });
    cb.parentElement.addEventListener("dblclick", function (ev) {
      ev.preventDefault();
      for (var k = 0; k < H; k++) { state.heads[k] = k === h; boxes[k].checked = k === h; }
      redraw();
    });
  });
  function setAll(on) { for (var k = 0; k < H; k++) { state.heads[k] = on; boxes[k].checked = on; } redraw(); }
  document.getElementById("hv-all").addEventListener("click", function () { setAll(true); });
  document.getElementById("hv-none").addEventListener("click", function () { setAll(false); });

  function hit(ev) {
    var rect = canvas.getBoundingClientRect();
    var x = ev.clientX - rect.left, yy = ev.clientY - rect.top + wrap.scrollTop;
    var i = Math.floor((yy - padTop) / rowH);
    if (i < 0 || i >= n || ev.clientY < rect.top || ev.clientY > rect.bottom) return null;
    if (x <= geom.left) return { side: "left", index: i };
    if (x >= geom.right) return { side: "right", index: i };
    return null;
  }
  canvas.addEventListener("mousemove", function (ev) {
    var h = hit(ev), cur = state.hover;
    if ((h === null && cur === null) || (h && cur && h.side === cur.side && h.index === cur.index)) return;
    state.hover = h; render();
  });
  canvas.addEventListener("mouseleave", function () { if (state.hover) { state.hover = null; render(); } });
  var pending = false;
  wrap.addEventListener("scroll", function () {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; render(); });
  });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { layout(); modelLayout(); redraw(); }, 100);
  });

  // Model view: every (layer, head) as a T × T thumbnail of its pooled map, on one canvas.
  var T = data.thumb || 0, tq = T ? decode(data.thumbs) : null;   // (L, H, T, T) weight · 255
  var bins = data.bins || [];                                        // T + 1 token boundaries
  var mv = document.getElementById("mv-canvas"), mctx = mv ? mv.getContext("2d") : null;
  var mgeom = { cell: 0, gap: 4, left: 28, top: 16 };
  function modelLayout() {
    if (!T || !mv) return;
    var avail = Math.max(300, document.getElementById("mv-wrap").clientWidth || window.innerWidth - 48);
    var cell = Math.floor((avail - mgeom.left) / H) - mgeom.gap;
    cell = Math.max(24, Math.min(72, cell));
    mgeom.cell = cell;
    var w = mgeom.left + H * (cell + mgeom.gap), h = mgeom.top + L * (cell + mgeom.gap);
    var dpr = window.devicePixelRatio || 1;
    mv.width = Math.floor(w * dpr); mv.height = Math.floor(h * dpr);
    mv.style.width = w + "px"; mv.style.height = h + "px";
    mctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }
  var thumbs = null;                                                 // all thumbnails, T pixels each, no gaps
  function buildThumbs() {
    thumbs = document.createElement("canvas");
    thumbs.width = H * T; thumbs.height = L * T;
    var tctx = thumbs.getContext("2d"), img = tctx.createImageData(H * T, L * T), px = img.data;
    for (var l = 0; l < L; l++) for (var h = 0; h < H; h++) {
      var base = (l * H + h) * T * T;
      for (var qi = 0; qi < T; qi++) for (var kj = 0; kj < T; kj++) {
        var o = 4 * ((l * T + qi) * H * T + h * T + kj), r, g, b;
        if (data.causal && bins[kj] > bins[qi + 1] - 1) { r = 238; g = 240; b = 243; }   // future keys: masked
        else {
          var v = Math.sqrt(tq[base + qi * T + kj] / 255);                              // gamma: faint weights stay visible
          r = g = Math.round(255 - 235 * v); b = Math.round(255 - 180 * v);
        }
        px[o] = r; px[o + 1] = g; px[o + 2] = b; px[o + 3] = 255;
      }
    }
    tctx.putImageData(img, 0, 0);
  }
  function drawModel() {
    if (!T || !mv) return;
    if (!thumbs) buildThumbs();
    var c = mgeom.cell, g = mgeom.gap;
    mctx.clearRect(0, 0, mv.width, mv.height);
    mctx.imageSmoothingEnabled = false;
    mctx.font = "10px system-ui, sans-serif"; mctx.fillStyle = "#667085"; mctx.textBaseline = "middle";
    mctx.textAlign = "center";
    for (var h = 0; h < H; h++) mctx.fillText(String(h), mgeom.left + h * (c + g) + c / 2, mgeom.top / 2);
    mctx.textAlign = "right";
    for (var l = 0; l < L; l++) mctx.fillText("L" + l, mgeom.left - 4, mgeom.top + l * (c + g) + c / 2);
    var on = state.heads.filter(function (x) { return x; }).length;
    var sel = on === 1 ? state.heads.indexOf(true) : -1;
    for (var l2 = 0; l2 < L; l2++) {
      for (var h2 = 0; h2 < H; h2++) {
        var x0 = mgeom.left + h2 * (c + g), y0 = mgeom.top + l2 * (c + g);
        mctx.drawImage(thumbs, h2 * T, l2 * T, T, T, x0, y0, c, c);
        var picked = l2 === state.layer && h2 === sel;
        mctx.strokeStyle = picked ? "#d92d20" : "#d0d5dd"; mctx.lineWidth = picked ? 2 : 1;
        mctx.strokeRect(x0 + 0.5, y0 + 0.5, c - 1, c - 1);
        if (state.range) {                          // the chosen queries, beside the query axis
          var rg = state.range;
          mctx.fillStyle = "#1570ef";
          mctx.fillRect(x0 - 3, y0 + (c * rg.r0) / n, 2, Math.max(1, (c * (rg.r1 - rg.r0)) / n));
        }
      }
    }
    mv.dataset.selected = sel >= 0 ? state.layer + "," + sel : "";
  }
  // data.show: "both" (default), "head" (no model view) or "model" (the head view appears once a head is opened)
  var headParts = ["hv-controls", "hv-range", "hv-wrap", "hv-note"].map(function (id) { return document.getElementById(id); });
  function showHeadView(on) { headParts.forEach(function (el) { el.style.display = on ? "" : "none"; }); }
  function openHead(l, h) {
    if (data.show === "model") { showHeadView(true); layout(); }
    state.layer = l; layerSel.value = String(l);
    for (var k = 0; k < H; k++) { state.heads[k] = k === h; boxes[k].checked = k === h; }
    updateRoles(); redraw();
    document.getElementById("hv-controls").scrollIntoView({ block: "start" });
  }
  if (mv && T) {
    mv.addEventListener("click", function (ev) {
      var r = mv.getBoundingClientRect(), c = mgeom.cell, g = mgeom.gap;
      var x = ev.clientX - r.left - mgeom.left, y = ev.clientY - r.top - mgeom.top;
      var h = Math.floor(x / (c + g)), l = Math.floor(y / (c + g));
      if (x < 0 || y < 0 || h >= H || l >= L || x - h * (c + g) > c || y - l * (c + g) > c) return;
      openHead(l, h);
    });
  } else if (mv) {
    document.getElementById("mv").style.display = "none";
  }

  function redraw() { render(); drawModel(); drawZoom(); }

  // Choosing queries on a pooled overview (data.overview: row p pools tokens bounds[p] … bounds[p+1] − 1).
  // The page holds no finer weights, so it highlights the chosen bins, draws their pooled rows enlarged
  // (#hv-zoom) and shows the command that writes those queries at full resolution.
  var qa = document.getElementById("hv-qa"), qb = document.getElementById("hv-qb");
  var cmdEl = document.getElementById("hv-command"), copyBtn = document.getElementById("hv-copy");
  var copied = document.getElementById("hv-copied"), rangeNote = document.getElementById("hv-range-note");
  var zoom = document.getElementById("hv-zoom"), zctx = zoom.getContext("2d");
  var ZOOM_H = 200, AXIS = 16;                      // CSS pixels (as headview.html's style): choosing never moves the head view

  function binOf(t) {                               // the row whose bin holds token t
    var lo = 0, hi = n - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (ov.bounds[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  // Queries a … b − 1 (token indices), clamped to the input and to the most one --queries range holds.
  function setRange(a, b) {
    if (!ov) return;
    a = Math.max(0, Math.min(ov.tokens - 1, Math.floor(a)));
    b = Math.max(a + 1, Math.min(ov.tokens, Math.floor(b)));
    var clamped = b - a > ov.max_queries;
    if (clamped) b = a + ov.max_queries;
    state.range = { a: a, b: b, r0: binOf(a), r1: binOf(b - 1) + 1, clamped: clamped };
    showRange();
  }
  function selectRows(r, s) {                       // whole bins r … s (either order)
    setRange(ov.bounds[Math.min(r, s)], ov.bounds[Math.max(r, s) + 1]);
  }
  function showRange() {
    if (!ov) { redraw(); return; }
    var rg = state.range;
    qa.max = String(ov.tokens - 1); qb.max = String(ov.tokens);
    qa.value = rg ? String(rg.a) : ""; qb.value = rg ? String(rg.b) : "";
    copyBtn.disabled = !rg; copied.textContent = "";
    if (!rg) {
      cmdEl.textContent = ov.command + " --queries A:B";
      rangeNote.textContent = "Choose queries to see their pooled rows enlarged below, and the command that draws " +
        "them at full resolution (at most " + ov.max_queries + " queries). " + ov.note;
    } else {
      cmdEl.textContent = ov.command + " --queries " + rg.a + ":" + rg.b;
      var done = ov.queries && rg.a >= ov.queries[0] && rg.b <= ov.queries[1];
      rangeNote.textContent = "Queries " + rg.a + "–" + (rg.b - 1) + " (" + (rg.b - rg.a) + " tokens)" +
        (rg.clamped ? ", cut to the " + ov.max_queries + " that one --queries range holds" : "") +
        ", in bins " + data.tokens[rg.r0] + (rg.r1 - rg.r0 > 1 ? " … " + data.tokens[rg.r1 - 1] : "") +
        ": below, those bins' pooled rows for the heads chosen above. " +
        (done ? "They are already at full resolution in headview_queries.html. "
              : "The command above draws every weight of these queries (headview_queries.html). ") + ov.note;
    }
    zoom.dataset.queries = rg ? rg.a + ":" + rg.b : "";
    redraw();
  }
  function drawZoom() {
    if (!ov) return;
    var width = Math.max(360, wrap.clientWidth), dpr = window.devicePixelRatio || 1;
    zoom.width = Math.floor(width * dpr); zoom.height = Math.floor(ZOOM_H * dpr);
    zoom.style.width = width + "px"; zoom.style.height = ZOOM_H + "px";
    zctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    zctx.clearRect(0, 0, width, ZOOM_H);
    zctx.font = "11px system-ui, sans-serif"; zctx.textBaseline = "middle"; zctx.fillStyle = "#667085";
    var rg = state.range, heads = [];
    for (var h = 0; h < H; h++) if (state.heads[h]) heads.push(h);
    var cells = 0, shown = [];
    if (!rg || !heads.length) {
      zctx.textAlign = "left";
      zctx.fillText(rg ? "no head chosen" : "no queries chosen", 4, AXIS / 2);
    } else {
      var rows = rg.r1 - rg.r0, cols = data.causal ? rg.r1 : n;   // causal: later key bins are all zero
      var fit = Math.max(1, Math.floor((ZOOM_H - AXIS) / (rows + 3)));
      shown = heads.slice(0, fit);
      var rowPx = Math.max(1, Math.min(16, Math.floor((ZOOM_H - AXIS - 3 * shown.length) / (shown.length * rows))));
      var labelW = 34, binW = 0;
      if (rowPx >= 11) for (var r = rg.r0; r < rg.r1; r++) binW = Math.max(binW, zctx.measureText(data.tokens[r]).width + 8);
      var x0 = labelW + binW, cellW = (width - x0 - 4) / cols;
      zctx.textAlign = "left";
      zctx.fillText("keys: tokens 0 … " + (ov.bounds[cols] - 1) + " (" + cols + " bins) →" +
        (shown.length < heads.length ? "   (" + shown.length + " of " + heads.length + " heads fit: double-click a head to see it alone)" : ""),
        x0, AXIS / 2);
      var yy = AXIS;
      shown.forEach(function (h) {
        zctx.globalAlpha = 1; zctx.fillStyle = colour(h); zctx.textAlign = "left";
        zctx.fillText("H" + h, 2, yy + (rows * rowPx) / 2);
        var base = (state.layer * H + h) * n * K;
        for (var r = rg.r0; r < rg.r1; r++) {
          var yr = yy + (r - rg.r0) * rowPx;
          zctx.globalAlpha = 1;
          if (binW) { zctx.fillStyle = "#1d2330"; zctx.textAlign = "right"; zctx.fillText(data.tokens[r], x0 - 4, yr + rowPx / 2); }
          zctx.fillStyle = "#f2f4f7"; zctx.fillRect(x0, yr, cols * cellW, rowPx);
          if (data.causal && r + 1 < cols) { zctx.fillStyle = "#e4e7ec"; zctx.fillRect(x0 + (r + 1) * cellW, yr, (cols - r - 1) * cellW, rowPx); }
          zctx.fillStyle = colour(h);
          for (var k = 0; k < K; k++) {
            var q = wq[base + r * K + k], j = keys[base + r * K + k];
            if (q === 0 || j >= cols) continue;
            zctx.globalAlpha = Math.sqrt(q / 255);   // as the thumbnails: faint weights stay visible
            zctx.fillRect(x0 + j * cellW, yr, Math.max(1, cellW), rowPx);
            cells++;
          }
        }
        yy += rows * rowPx + 3;
      });
      zctx.globalAlpha = 1;
    }
    zoom.dataset.rows = rg ? rg.r0 + "," + rg.r1 : "";
    zoom.dataset.cells = String(cells);
    zoom.dataset.heads = shown.join(",");
    zoom.dataset.layer = String(state.layer);
  }

  if (ov) {
    var fromInputs = function () {
      if (qa.value === "") return;
      var a = Number(qa.value), b = qb.value === "" ? a + 1 : Number(qb.value);
      if (!isFinite(a) || !isFinite(b)) return;
      setRange(a, b > a ? b : a + 1);
    };
    qa.addEventListener("change", fromInputs);
    qb.addEventListener("change", fromInputs);
    document.getElementById("hv-clear").addEventListener("click", function () { state.range = null; showRange(); });
    copyBtn.addEventListener("click", function () {
      function selectIt() {                         // no clipboard access: select the text for Ctrl+C
        var r = document.createRange(), sel = window.getSelection();
        r.selectNodeContents(cmdEl); sel.removeAllRanges(); sel.addRange(r);
        copied.textContent = "selected: press Ctrl+C to copy";
      }
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(cmdEl.textContent).then(function () { copied.textContent = "copied"; }, selectIt);
      } else selectIt();
    });
    // Drag over the query column (left) to choose bins; shift-click extends the last choice.
    var anchor = null, dragging = false, lastRow = null;
    canvas.addEventListener("mousedown", function (ev) {
      var h = ev.button === 0 ? hit(ev) : null;
      if (!h || h.side !== "left") return;
      ev.preventDefault();                          // no text selection while dragging
      if (!(ev.shiftKey && anchor !== null)) anchor = h.index;
      dragging = true; lastRow = h.index;
      selectRows(anchor, h.index);
    });
    window.addEventListener("mousemove", function (ev) {
      if (!dragging) return;
      var rect = canvas.getBoundingClientRect();
      var i = Math.floor((ev.clientY - rect.top + wrap.scrollTop - padTop) / rowH);
      i = Math.max(0, Math.min(n - 1, i));
      if (i !== lastRow) { lastRow = i; selectRows(anchor, i); }
    });
    window.addEventListener("mouseup", function () { dragging = false; });
  }

  var api = {
    state: state, render: render, data: data, lastRenderMs: 0, lines: 0, openHead: openHead,
    setRange: setRange, selectRows: selectRows
  };
  window.headview = api;
  layout(); updateRoles(); modelLayout();
  if (ov && ov.queries) setRange(ov.queries[0], ov.queries[1]);   // the queries written beside this page
  else showRange();
  if (data.show === "head" && mv) document.getElementById("mv").style.display = "none";
  if (data.show === "model" && mv && T) showHeadView(false);
  document.body.dataset.ready = "1";
})();
