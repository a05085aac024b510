// Follow mode of a replica's log page: the API's own follow stream (GET /api/v1/nodes/N/logs?follow=true,
// NDJSON batches of lines), read by the browser with its own session cookie and appended to the <pre> as
// each batch comes. Plain JS, no build step. While following, the page's 2 s htmx re-read is held back:
// its swap would replace the streamed lines with a snapshot.
"use strict";
(function () {
  const button = document.getElementById("follow");
  const live = document.getElementById("replica-log-live");
  const status = document.getElementById("follow-state");
  if (!button || !live || !status) return;
  const url = button.dataset.follow;
  // A page left following for hours keeps this many lines, not every line the engine ever wrote.
  const KEEP = 5000;
  let running = null;  // the AbortController of the stream being read, or null

  function pre() { return document.getElementById("replica-log"); }

  function show(words, isError) {
    status.textContent = words;
    status.classList.toggle("error", Boolean(isError));
  }

  function append(lines) {
    const box = pre();
    if (!box || !lines.length) return;
    const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    const text = (box.textContent ? "\n" : "") + lines.join("\n");
    box.appendChild(document.createTextNode(text));
    const all = box.textContent.split("\n");
    if (all.length > KEEP) box.textContent = all.slice(all.length - KEEP).join("\n");
    if (atEnd) box.scrollTop = box.scrollHeight;
  }

  async function message(resp) {
    try {
      const doc = await resp.json();
      if (doc && doc.error && doc.error.message) return doc.error.message;
    } catch (e) { /* not JSON: said below */ }
    return "the API answered " + resp.status + " " + resp.statusText + " without saying why";
  }

  async function follow() {
    const ctl = new AbortController();
    running = ctl;
    button.setAttribute("aria-pressed", "true");
    button.textContent = "Stop following";
    show("following: new lines appear as the engine writes them");
    let first = true;
    try {
      const resp = await fetch(url, { signal: ctl.signal, credentials: "same-origin",
                                      headers: { accept: "application/x-ndjson" } });
      if (!resp.ok) { show("not following: " + await message(resp), true); return; }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const raw = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!raw) continue;
          let batch;
          try { batch = JSON.parse(raw); } catch (e) { show("the log stream sent a line that is not JSON", true); continue; }
          if (batch.error) { show("the log ended: " + batch.error, true); continue; }
          // The first batch is the last lines as they stand: it replaces the snapshot, so none shows twice.
          if (first) { const box = pre(); if (box) box.textContent = ""; first = false; }
          append(batch.lines || []);
        }
      }
      if (running === ctl) show("the log stream ended (the replica stopped?); press Follow to start again", true);
    } catch (e) {
      if (running === ctl) show("the log stream broke: " + e.message + "; press Follow to start again", true);
    } finally {
      if (running === ctl) stop(false);
    }
  }

  function stop(said) {
    if (running) running.abort();
    running = null;
    button.setAttribute("aria-pressed", "false");
    button.textContent = "Follow";
    if (said) show("re-read every 2 s");
  }

  // Held back while following: a re-read would put the 2 s snapshot over the streamed lines.
  live.addEventListener("htmx:beforeRequest", function (ev) { if (running) ev.preventDefault(); });
  live.addEventListener("htmx:beforeSwap", function (ev) { if (running) ev.detail.shouldSwap = false; });
  button.addEventListener("click", function () { if (running) stop(true); else follow(); });
  if (new URLSearchParams(location.search).get("follow") === "1") follow();
})();
