// The playground's tabs (Chat, Embeddings) and its Embeddings tab: one embeddings request as any client sends
// it (floats, so the values can be shown); the vector's dimension, its first values and the time from sending
// to the whole answer. The chat is playground.js; the snippets' text is snippets.js.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);

  const tabs = [$("tab-chat"), $("tab-embed")].filter(Boolean);
  function select(tab) {
    for (const t of tabs) {
      const on = t === tab;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      $(t.getAttribute("aria-controls")).hidden = !on;
    }
  }
  for (const t of tabs) {
    t.addEventListener("click", function () { select(t); });
    t.addEventListener("keydown", function (ev) {
      if (ev.key !== "ArrowRight" && ev.key !== "ArrowLeft") return;
      const next = tabs[(tabs.indexOf(t) + (ev.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
      select(next); next.focus();
    });
  }

  async function errorWords(resp) {
    // The API's own sentence; a bare status code tells the user nothing.
    try {
      const doc = await resp.json();
      if (doc && doc.error && doc.error.message) return doc.error.message;
    } catch (e) { /* not JSON: fall through */ }
    return "the server refused the request (" + resp.status + " " + resp.statusText + ") without saying why";
  }

  const embedForm = $("embed-form");
  if (!embedForm) return;
  embedForm.addEventListener("submit", async function (ev) {
    ev.preventDefault();
    const url = new URL(embedForm.dataset.api, location.href).href;
    const key = $("api-key").value.trim();
    const req = { model: $("embed-model").value, input: $("embed-input").value, encoding_format: "float" };
    const code = window.llmgwSnippets.embed(url, req, Boolean(key));
    $("curl").textContent = code.curl;
    $("python").textContent = code.python;
    const send = $("embed-send"), error = $("embed-error");
    send.disabled = true; error.hidden = true;
    $("embed-stats").textContent = ""; $("embed-values").textContent = "";
    $("embed-model-name").textContent = req.model;
    const headers = { "Content-Type": "application/json" };
    if (key) headers["Authorization"] = "Bearer " + key;
    const t0 = performance.now();
    try {
      const resp = await fetch(url, { method: "POST", headers: headers, body: JSON.stringify(req), credentials: "omit" });
      if (!resp.ok) throw new Error(await errorWords(resp));
      const doc = await resp.json();
      const ms = Math.round(performance.now() - t0);
      const vec = doc && doc.data && doc.data[0] && doc.data[0].embedding;
      if (!Array.isArray(vec)) throw new Error("the answer carried no embedding (data[0].embedding is missing)");
      const tokens = doc.usage && doc.usage.prompt_tokens ? " · " + doc.usage.prompt_tokens + " tokens" : "";
      $("embed-stats").textContent = "dimension " + vec.length + " · " + ms + " ms" + tokens;
      $("embed-values").textContent = "[" + vec.slice(0, 8).map((v) => Number(v).toFixed(6)).join(", ") +
        (vec.length > 8 ? ", … " + (vec.length - 8) + " more]" : "]");
    } catch (e) {
      error.textContent = req.model + ": " + e.message;
      error.hidden = false;
    }
    send.disabled = false;
    embedForm.dataset.done = String(Number(embedForm.dataset.done || 0) + 1);
  });
})();
