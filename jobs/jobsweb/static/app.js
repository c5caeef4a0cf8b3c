// jobkeys dashboard: relative times and live reloads of the page's main
// region on key changes (server-sent events). No dependencies.
"use strict";
(function () {
  const main = document.getElementById("live");
  const status = document.getElementById("live-status");

  function relative(t, now) {
    let d = (t - now) / 1000;
    const future = d > 0;
    d = Math.abs(d);
    if (d < 1) return "now";
    let s;
    if (d < 60) s = Math.floor(d) + "s";
    else if (d < 3600) s = Math.floor(d / 60) + "m";
    else if (d < 172800) s = Math.floor(d / 3600) + "h";
    else s = Math.floor(d / 86400) + "d";
    return future ? "in " + s : s + " ago";
  }
  function tick() {
    const now = Date.now();
    document.querySelectorAll("time[datetime]").forEach(function (el) {
      const t = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(t)) el.textContent = relative(t, now);
    });
  }
  setInterval(tick, 1000);

  if (!main || !main.dataset.live) return;
  const source = main.dataset.live;
  const job = main.dataset.job || "";
  let pending = false, running = false, last = 0;
  const minGap = Number(main.dataset.gap) || 1000; // ms between two reloads

  function reload() {
    if (running) { pending = true; return; }
    const wait = Math.max(0, last + minGap - Date.now());
    running = true;
    setTimeout(function () {
      last = Date.now();
      const url = source + (source.indexOf("?") < 0 ? "?" : "&") + "fragment=1";
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
        .then(function (html) { main.innerHTML = html; main.dataset.loaded = String(Number(main.dataset.loaded || 0) + 1); tick(); })
        .catch(function () {})
        .finally(function () { running = false; if (pending) { pending = false; reload(); } });
    }, wait);
  }

  if (window.EventSource) {
    const es = new EventSource(main.dataset.events);
    es.onopen = function () { status.classList.add("on"); status.classList.remove("off"); };
    es.onerror = function () { status.classList.add("off"); status.classList.remove("on"); };
    es.addEventListener("resync", reload);
    es.addEventListener("key", function (e) {
      if (!job) { reload(); return; }
      try {
        const ev = JSON.parse(e.data);
        if ((ev.jobs || []).indexOf(job) >= 0) reload();
      } catch (err) { reload(); }
    });
  }
  // A job's state changes without its key changing (progress, a claim
  // renewed): its page also reloads every few seconds.
  if (job) setInterval(reload, 5000);
})();
