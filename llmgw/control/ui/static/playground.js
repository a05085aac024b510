// The playground's chat: a conversation with one model, or two side by side, sent to the server's own OpenAI
// endpoint (/v1/chat/completions, same origin), streamed, exactly as any client's request would be.
//
// Each send carries the whole conversation (the system prompt, every user turn and that side's own answers)
// and the parameters as the form sets them. Stop aborts the fetches (AbortController): the connection closes,
// the router cancels its upstream request and the engine stops generating. Answers are rendered by
// markdown.js, which builds DOM nodes and never parses the model's text as HTML. Per answer: time to first
// token and tokens/s (the stream's usage, else its chunk count, over the time from first to last token).
//
// The conversation is kept in this tab's sessionStorage only (Clear empties it); the API key is never stored
// and the snippets (snippets.js) name $LLMGW_API_KEY instead of it.
"use strict";
(function () {
  const form = document.getElementById("chat-form");
  if (!form) return;
  const $ = (id) => document.getElementById(id);
  const STORE = "llmgw.playground.chat";
  const SIDES = ["a", "b"];
  // Form fields kept with the conversation, so a reload shows the same setup.
  const KEPT = ["model", "compare", "system", "temperature", "top-p", "max-tokens", "seed", "stop-seqs"];

  // {turns: [{user, a: answer, b: answer | null}]}; an answer is {model, content, stats, error, stopped}.
  let chat = { turns: [] };
  let controllers = [];
  let lastRequests = [];

  function load() {
    try {
      const doc = JSON.parse(sessionStorage.getItem(STORE) || "null");
      if (!doc || !Array.isArray(doc.turns)) return;
      chat = { turns: doc.turns };
      const fields = doc.fields || {};
      for (const id of KEPT) {
        if (typeof fields[id] !== "string") continue;
        const field = $(id);
        // A model no longer offered stays as the page chose it.
        if (field.tagName === "SELECT" && !Array.from(field.options).some((o) => o.value === fields[id])) continue;
        field.value = fields[id];
      }
      $("json-mode").checked = Boolean(fields.json);
    } catch (e) { /* storage unreadable or not ours: start empty */ }
  }

  function save() {
    const fields = { json: $("json-mode").checked };
    for (const id of KEPT) fields[id] = $(id).value;
    try { sessionStorage.setItem(STORE, JSON.stringify({ turns: chat.turns, fields: fields })); } catch (e) { /* full or off */ }
  }

  // The messages side `side` sends for a new user message: its own answers, or the other side's where it
  // gave none (the turns before compare was switched on); a turn neither side answered is left out.
  function messages(side, text) {
    const out = [];
    const system = $("system").value.trim();
    if (system) out.push({ role: "system", content: system });
    for (const turn of chat.turns) {
      const own = turn[side], other = turn[side === "a" ? "b" : "a"];
      const answer = own && own.content ? own.content : other && other.content ? other.content : "";
      if (!answer) continue;
      out.push({ role: "user", content: turn.user }, { role: "assistant", content: answer });
    }
    out.push({ role: "user", content: text });
    return out;
  }

  // A number field's value, or undefined when it is empty or not a number (then the field is not sent and
  // the engine's default applies).
  function number(id, parse) {
    const text = $(id).value.trim();
    const value = text === "" ? NaN : parse(text);
    return Number.isFinite(value) ? value : undefined;
  }

  // The request body, field for field what the snippets show.
  function body(model, msgs) {
    const req = { model: model, messages: msgs, stream: true, stream_options: { include_usage: true } };
    const fields = { temperature: number("temperature", Number), top_p: number("top-p", Number),
                     max_tokens: number("max-tokens", (t) => parseInt(t, 10)), seed: number("seed", (t) => parseInt(t, 10)) };
    for (const name of ["temperature", "top_p", "max_tokens"]) if (fields[name] !== undefined) req[name] = fields[name];
    const stop = $("stop-seqs").value.split("\n").filter((s) => s.length > 0);
    if (stop.length) req.stop = stop;
    if (fields.seed !== undefined) req.seed = fields.seed;
    if ($("json-mode").checked) req.response_format = { type: "json_object" };
    return req;
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // An answer's list item; its parts are refreshed by paint() as the stream grows.
  function answerNode(answer) {
    const li = el("li", "msg assistant");
    li.append(el("div", "who", answer.model), el("div", "content md"), el("p", "error"), el("p", "stats obj"));
    li.querySelector(".error").setAttribute("role", "alert");
    paint(li, answer);
    return li;
  }

  function paint(li, answer) {
    const content = li.querySelector(".content");
    content.replaceChildren(window.llmgwMarkdown.render(answer.content));
    const error = li.querySelector(".error");
    error.textContent = answer.error || "";
    error.hidden = !answer.error;
    li.querySelector(".stats").textContent = (answer.stopped ? "Stopped · " : "") + (answer.stats || "");
    li.classList.toggle("streaming", Boolean(answer.streaming));
    // A screen reader reads the answer once it is whole, not at every repaint of the stream.
    li.setAttribute("aria-busy", String(Boolean(answer.streaming)));
  }

  function show() {
    const compare = chat.turns.some((t) => t.b) || Boolean($("compare").value);
    $("compare-pane").hidden = !compare;
    $("pane-a").classList.toggle("half", compare);
    for (const side of SIDES) {
      const list = $("conv-" + side);
      list.replaceChildren();
      for (const turn of chat.turns) {
        if (!turn[side]) continue;
        list.append(el("li", "msg user", turn.user), answerNode(turn[side]));
      }
    }
    $("conv-a-model").textContent = $("model").value;
    $("conv-b-model").textContent = $("compare").value;
  }

  async function errorWords(resp) {
    // The API's own sentence; a bare status code tells the user nothing.
    try {
      const doc = await resp.json();
      if (doc && doc.error && doc.error.message) return doc.error.message;
    } catch (e) { /* not JSON: fall through */ }
    return "the server refused the request (" + resp.status + " " + resp.statusText + ") without saying why";
  }

  // Stream one answer into `answer`, repainting `li` at most once a frame.
  async function run(url, req, key, answer, li, signal) {
    const headers = { "Content-Type": "application/json", "Accept": "text/event-stream" };
    if (key) headers["Authorization"] = "Bearer " + key;
    let queued = false;
    const repaint = function () {
      if (queued) return;
      queued = true;
      requestAnimationFrame(function () { queued = false; paint(li, answer); });
    };
    const t0 = performance.now();
    let first = 0, last = 0, chunks = 0, usageTokens = 0;
    answer.streaming = true;
    try {
      const resp = await fetch(url, { method: "POST", headers: headers, body: JSON.stringify(req),
                                      credentials: "omit", signal: signal });
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
            answer.content += text;
            repaint();
          }
        }
      }
    } catch (e) {
      if (e.name === "AbortError") answer.stopped = true;
      else answer.error = req.model + ": " + e.message;
    }
    answer.streaming = false;
    if (first) {
      const tokens = usageTokens || chunks;
      const span = (last - first) / 1000;
      const tps = span > 0 && tokens > 1 ? ((tokens - 1) / span).toFixed(1) : "n/a";
      answer.stats = "TTFT " + Math.round(first - t0) + " ms · " + tokens + " tokens · " + tps + " tokens/s";
    }
    paint(li, answer);
  }

  function showSnippets() {
    const picker = $("snippet-for");
    const chosen = lastRequests.find((r) => r.req.model === picker.value) || lastRequests[0];
    if (!chosen) return;
    const code = window.llmgwSnippets.chat(chosen.url, chosen.req, chosen.keyed);
    $("curl").textContent = code.curl;
    $("python").textContent = code.python;
  }

  function copy(id) {
    const text = $(id).textContent;
    const status = $("copy-status");
    if (!text) { status.textContent = "Send a message first: the snippets are of the request last sent."; return; }
    if (!navigator.clipboard) { status.textContent = "This browser gives no clipboard here: select the text below."; return; }
    navigator.clipboard.writeText(text).then(
      function () { status.textContent = "Copied (" + (id === "curl" ? "curl" : "Python") + ")."; },
      function () { status.textContent = "The browser refused the clipboard: select the text below."; });
  }

  form.addEventListener("submit", async function (ev) {
    ev.preventDefault();
    const text = $("message").value;
    if (!text.trim()) return;
    const url = new URL(form.dataset.api, location.href).href;
    const key = $("api-key").value.trim();
    const models = { a: $("model").value, b: $("compare").value };
    const turn = { user: text, a: null, b: null };
    const sends = [];
    for (const side of SIDES) {
      if (!models[side]) continue;
      const req = body(models[side], messages(side, text));
      turn[side] = { model: models[side], content: "", stats: "", error: "", stopped: false };
      sends.push({ side: side, req: req });
    }
    chat.turns.push(turn);
    show();
    lastRequests = sends.map((s) => ({ url: url, req: s.req, keyed: Boolean(key) }));
    const picker = $("snippet-for");
    picker.replaceChildren(...sends.map((s) => el("option", "", s.req.model)));
    picker.parentElement.hidden = sends.length < 2;
    showSnippets();
    $("message").value = "";
    save();
    $("send").disabled = true;
    $("stop").disabled = false;
    controllers = sends.map(() => new AbortController());
    await Promise.all(sends.map(function (s, i) {
      const li = $("conv-" + s.side).lastElementChild;
      return run(url, s.req, key, turn[s.side], li, controllers[i].signal);
    }));
    controllers = [];
    save();
    $("send").disabled = false;
    $("stop").disabled = true;
    form.dataset.done = String(Number(form.dataset.done || 0) + 1);
  });

  $("stop").addEventListener("click", function () {
    for (const c of controllers) c.abort();
    $("stop").disabled = true;
  });
  $("clear").addEventListener("click", function () {
    for (const c of controllers) c.abort();
    chat = { turns: [] };
    try { sessionStorage.removeItem(STORE); } catch (e) { /* off */ }
    show();
  });
  $("snippet-for").addEventListener("change", showSnippets);
  $("copy-curl").addEventListener("click", function () { copy("curl"); });
  $("copy-python").addEventListener("click", function () { copy("python"); });
  for (const id of ["model", "compare"]) $(id).addEventListener("change", function () { show(); save(); });
  $("message").addEventListener("keydown", function (ev) {
    // Ctrl/Cmd+Enter sends, as chat boxes do; Enter alone is a new line.
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey) && !$("send").disabled) form.requestSubmit();
  });

  load();
  show();
})();
