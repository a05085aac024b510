// A small Markdown renderer for model answers that builds DOM nodes only: every piece of the model's text
// becomes a Text node (createTextNode / textContent), never HTML, so `<img onerror=…>` or `<script>` in an
// answer is shown as those characters and nothing runs. What it knows: paragraphs (a single newline is a
// line break), ``` code fences (with a Copy button), # headings, - / * / 1. lists, > quotes, `inline code`,
// **bold**, *italic* / _italic_, and [links](https://…) whose address is http or https (opened with
// rel="noopener noreferrer" in a new tab); a link to anything else (javascript:, data:, a relative path) is
// left as its text. Unclosed syntax, as a stream mid-answer has, renders as far as it goes.
"use strict";
(function () {
  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
  const NUMBERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
  const QUOTE = /^\s{0,3}>\s?(.*)$/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
  // Inline syntax, earliest match first: code spans, bold, italic, links.
  const INLINE = new RegExp([
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",          // 1, 2: code span
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",              // 3: bold
    "(?<![\\w_])__(?=\\S)([\\s\\S]*?\\S)__(?![\\w_])", // 4: bold
    "\\*(?=[^\\s*])([^*]*?[^\\s*])?\\*",                // 5: italic (empty group: a single character)
    "(?<![\\w_])_(?=[^\\s_])([^_]*?[^\\s_])?_(?![\\w_])",  // 6: italic
    "\\[([^\\[\\]]+)\\]\\(\\s*([^()\\s]+)\\s*\\)",      // 7, 8: link text, address
  ].join("|"), "g");

  function el(tag, cls) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    return node;
  }

  // The address of a link when it is http(s), else null: javascript:, data: and the like are never links.
  function safeHref(address) {
    try {
      const url = new URL(address);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch (e) {
      return null;
    }
  }

  function inline(text, parent) {
    let last = 0;
    INLINE.lastIndex = 0;
    const matches = [];
    for (let m = INLINE.exec(text); m; m = INLINE.exec(text)) {
      matches.push(m);
      if (m[0].length === 0) INLINE.lastIndex += 1;
    }
    for (const m of matches) {
      if (m.index < last) continue;
      parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      last = m.index + m[0].length;
      if (m[1] !== undefined) {
        const code = el("code");
        code.textContent = m[2];
        parent.appendChild(code);
      } else if (m[3] !== undefined || m[4] !== undefined) {
        const strong = el("strong");
        inline(m[3] !== undefined ? m[3] : m[4], strong);
        parent.appendChild(strong);
      } else if (m[7] !== undefined) {
        const href = safeHref(m[8]);
        if (href) {
          const a = el("a");
          a.href = href;
          a.rel = "noopener noreferrer nofollow";
          a.target = "_blank";
          inline(m[7], a);
          parent.appendChild(a);
        } else {
          parent.appendChild(document.createTextNode(m[0]));
        }
      } else {
        // Italic: the whole match less its two markers (the group is absent for one character).
        const em = el("em");
        inline(m[0].slice(1, -1), em);
        parent.appendChild(em);
      }
    }
    parent.appendChild(document.createTextNode(text.slice(last)));
  }

  // Lines joined with <br>: a model's single newline is meant as one.
  function lines(texts, parent) {
    texts.forEach(function (t, i) {
      if (i) parent.appendChild(el("br"));
      inline(t, parent);
    });
  }

  function codeBlock(lang, body) {
    const wrap = el("div", "md-code");
    const bar = el("div", "md-code-bar");
    const label = el("span", "md-lang");
    label.textContent = lang || "code";
    const copy = el("button", "md-copy");
    copy.type = "button";
    copy.textContent = "Copy";
    copy.addEventListener("click", function () {
      const done = function (words) { copy.textContent = words; setTimeout(function () { copy.textContent = "Copy"; }, 1500); };
      if (!navigator.clipboard) { done("Select the text to copy"); return; }
      navigator.clipboard.writeText(body).then(function () { done("Copied"); }, function () { done("Select the text to copy"); });
    });
    bar.append(label, copy);
    const pre = el("pre");
    const code = el("code");
    code.textContent = body;
    pre.appendChild(code);
    wrap.append(bar, pre);
    return wrap;
  }

  // The answer's text as a fragment of DOM nodes; nothing in it is parsed as HTML.
  function render(text) {
    const out = document.createDocumentFragment();
    const src = String(text).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < src.length) {
      const line = src[i];
      let m;
      if ((m = FENCE.exec(line))) {
        const fence = m[1], body = [];
        i += 1;
        while (i < src.length && !(src[i].trim().startsWith(fence) && src[i].trim().replace(/[`~]/g, "") === "")) {
          body.push(src[i]);
          i += 1;
        }
        i += 1;  // the closing fence (or the end of an unfinished one)
        out.appendChild(codeBlock(m[2], body.join("\n")));
      } else if (!line.trim()) {
        i += 1;
      } else if (RULE.test(line)) {
        out.appendChild(el("hr"));
        i += 1;
      } else if ((m = HEADING.exec(line))) {
        const h = el("h" + Math.min(6, m[1].length + 2), "md-h");
        inline(m[2], h);
        out.appendChild(h);
        i += 1;
      } else if (BULLET.test(line) || NUMBERED.test(line)) {
        const numbered = !BULLET.test(line);
        const pattern = numbered ? NUMBERED : BULLET;
        const list = el(numbered ? "ol" : "ul");
        if (numbered && NUMBERED.exec(line)[1] !== "1") list.start = parseInt(NUMBERED.exec(line)[1], 10);
        while (i < src.length && (m = pattern.exec(src[i]))) {
          const item = el("li");
          const parts = [numbered ? m[2] : m[1]];
          i += 1;
          // A continuation line (indented, not a new item) belongs to the item.
          while (i < src.length && /^\s{2,}\S/.test(src[i]) && !pattern.test(src[i])) { parts.push(src[i].trim()); i += 1; }
          lines(parts, item);
          list.appendChild(item);
        }
        out.appendChild(list);
      } else if (QUOTE.test(line)) {
        const quoted = [];
        while (i < src.length && (m = QUOTE.exec(src[i]))) { quoted.push(m[1]); i += 1; }
        const q = el("blockquote");
        q.appendChild(render(quoted.join("\n")));
        out.appendChild(q);
      } else {
        const para = [];
        while (i < src.length && src[i].trim() && !FENCE.test(src[i]) && !HEADING.test(src[i]) &&
               !BULLET.test(src[i]) && !NUMBERED.test(src[i]) && !QUOTE.test(src[i]) && !RULE.test(src[i])) {
          para.push(src[i]);
          i += 1;
        }
        const p = el("p");
        lines(para, p);
        out.appendChild(p);
      }
    }
    return out;
  }

  window.llmgwMarkdown = Object.freeze({ render: render, safeHref: safeHref });
})();
