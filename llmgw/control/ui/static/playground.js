// The playground: send one chat to the server's OpenAI endpoint, streamed, and show it as it arrives.
// Plain JS, no build step. The API key field is never filled by the server; the snippets print a
// placeholder ($LLMGW_API_KEY) instead of the key so a copied snippet never carries the secret.
"use strict";
(function () {
  const form = document.getElementById("chat-form");
  if (!form) return;
  const $ = (id) => document.getElementById(id);

  // Tabs: Chat and Embeddings share the key field and the snippets below them.
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

  function body(model) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push({ role: "user", content: $("message").value });
    return {
      model: model, messages: messages, stream: true, stream_options: { include_usage: true },
      temperature: Number($("temperature").value), max_tokens: parseInt($("max-tokens").value, 10),
    };
  }

  function shellQuote(s) { return "'" + s.replace(/'/g, "'\\''") + "'"; }

  function pyValue(v, indent) {
    // JSON is Python syntax except for the three literals below.
    return JSON.stringify(v, null, 4).replace(/\btrue\b/g, "True").replace(/\bfalse\b/g, "False")
      .replace(/\bnull\b/g, "None").split("\n").join("\n" + indent);
  }

  function snippets(url, req, keyed) {
    const curl = ["curl -N " + shellQuote(url), "  -H 'Content-Type: application/json'"];
    if (keyed) curl.push("  -H \"Authorization: Bearer $LLMGW_API_KEY\"");
    curl.push("  -d " + shellQuote(JSON.stringify(req)));
    $("curl").textContent = curl.join(" \\\n");
    const base = url.replace(/\/chat\/completions$/, "");
    const py = [
      "import os", "", "from openai import OpenAI", "",
      "client = OpenAI(base_url=" + JSON.stringify(base) + ", api_key=" +
        (keyed ? "os.environ[\"LLMGW_API_KEY\"]" : "os.environ.get(\"LLMGW_API_KEY\", \"none\")") + ")",
      "stream = client.chat.completions.create(",
      "    model=" + JSON.stringify(req.model) + ",",
      "    messages=" + pyValue(req.messages, "    ") + ",",
      "    temperature=" + req.temperature + ",",
      "    max_tokens=" + req.max_tokens + ",",
      "    stream=True,",
      "    stream_options={\"include_usage\": True},",
      ")",
      "for chunk in stream:",
      "    if chunk.choices and chunk.choices[0].delta.content:",
      "        print(chunk.choices[0].delta.content, end=\"\", flush=True)",
    ];
    $("python").textContent = py.join("\n");
  }

  async function errorWords(resp) {
    // The API's own sentence; a bare status code tells the user nothing.
    try {
      const doc = await resp.json();
      if (doc && doc.error && doc.error.message) return doc.error.message;
    } catch (e) { /* not JSON: fall through */ }
    return "the server refused the request (" + resp.status + " " + resp.statusText + ") without saying why";
  }

  async function run(url, req, key, out) {
    out.reply.textContent = ""; out.stats.textContent = ""; out.error.hidden = true; out.model.textContent = req.model;
    const headers = { "Content-Type": "application/json", "Accept": "text/event-stream" };
    if (key) headers["Authorization"] = "Bearer " + key;
    const t0 = performance.now();
    let first = 0, last = 0, chunks = 0, usageTokens = 0;
    try {
      const resp = await fetch(url, { method: "POST", headers: headers, body: JSON.stringify(req), credentials: "omit" });
      if (!resp.ok) throw new Error(await errorWords(resp));
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        const lines = buffered.split("\n");
        buffered = lines.pop();
        for (const raw of lines) {
          const line = raw.trim();
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const doc = JSON.parse(data);
          if (doc.error) throw new Error(doc.error.message || "the stream ended with an error it did not describe");
          if (doc.usage && doc.usage.completion_tokens) usageTokens = doc.usage.completion_tokens;
          const text = doc.choices && doc.choices[0] && doc.choices[0].delta && doc.choices[0].delta.content;
          if (text) {
            const now = performance.now();
            if (!first) first = now;
            last = now; chunks += 1;
            out.reply.textContent += text;
          }
        }
      }
    } catch (e) {
      out.error.textContent = req.model + ": " + e.message;
      out.error.hidden = false;
    }
    if (first) {
      const tokens = usageTokens || chunks;
      const span = (last - first) / 1000;
      const tps = span > 0 && tokens > 1 ? ((tokens - 1) / span).toFixed(1) : "n/a";
      out.stats.textContent = "TTFT " + Math.round(first - t0) + " ms · " + tokens + " tokens · " + tps + " tokens/s";
    }
  }

  function embedSnippets(url, req, keyed) {
    const curl = ["curl " + shellQuote(url), "  -H 'Content-Type: application/json'"];
    if (keyed) curl.push("  -H \"Authorization: Bearer $LLMGW_API_KEY\"");
    curl.push("  -d " + shellQuote(JSON.stringify(req)));
    $("curl").textContent = curl.join(" \\\n");
    const py = [
      "import os", "", "from openai import OpenAI", "",
      "client = OpenAI(base_url=" + JSON.stringify(url.replace(/\/embeddings$/, "")) + ", api_key=" +
        (keyed ? "os.environ[\"LLMGW_API_KEY\"]" : "os.environ.get(\"LLMGW_API_KEY\", \"none\")") + ")",
      "result = client.embeddings.create(",
      "    model=" + JSON.stringify(req.model) + ",",
      "    input=" + JSON.stringify(req.input) + ",",
      ")",
      "vector = result.data[0].embedding",
      "print(len(vector), vector[:8])",
    ];
    $("python").textContent = py.join("\n");
  }

  // One embeddings request as any client sends it (floats, so the values can be shown); the vector's
  // dimension, its first values and the time from sending to the whole answer.
  const embedForm = $("embed-form");
  if (embedForm) {
    embedForm.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      const url = new URL(embedForm.dataset.api, location.href).href;
      const key = $("api-key").value.trim();
      const req = { model: $("embed-model").value, input: $("embed-input").value, encoding_format: "float" };
      embedSnippets(url, req, Boolean(key));
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
  }

  form.addEventListener("submit", async function (ev) {
    ev.preventDefault();
    const url = new URL(form.dataset.api, location.href).href;
    const key = $("api-key").value.trim();
    const req = body($("model").value);
    snippets(url, req, Boolean(key));
    const send = $("send");
    send.disabled = true;
    const runs = [run(url, req, key, { reply: $("reply"), stats: $("stats"), error: $("reply-error"),
                                       model: $("reply-model") })];
    const other = $("compare").value;
    $("compare-pane").hidden = !other;
    if (other) {
      runs.push(run(url, body(other), key, { reply: $("reply-b"), stats: $("stats-b"), error: $("reply-b-error"),
                                             model: $("reply-b-model") }));
    }
    await Promise.all(runs);
    send.disabled = false;
    form.dataset.done = String(Number(form.dataset.done || 0) + 1);
  });
})();
