// The playground's "same request from your code": a curl command and a Python (openai) program that send
// exactly the request the page sent, body for body. The key is never written into them: they read
// $LLMGW_API_KEY from the environment, so a copied snippet carries no secret.
"use strict";
(function () {
  function shellQuote(s) { return "'" + s.replace(/'/g, "'\\''") + "'"; }

  // A JSON value as Python source: JSON is Python syntax except for the three literals below (outside strings).
  function pyValue(v, indent) {
    const text = JSON.stringify(v, null, 4).replace(/("(?:[^"\\]|\\.)*")|\btrue\b|\bfalse\b|\bnull\b/g, function (m, str) {
      if (str) return str;
      return m === "true" ? "True" : m === "false" ? "False" : "None";
    });
    return text.split("\n").join("\n" + indent);
  }

  function apiKey(keyed) {
    return keyed ? "os.environ[\"LLMGW_API_KEY\"]" : "os.environ.get(\"LLMGW_API_KEY\", \"none\")";
  }

  function curl(url, req, keyed, stream) {
    const lines = ["curl " + (stream ? "-N " : "") + shellQuote(url), "  -H 'Content-Type: application/json'"];
    if (keyed) lines.push("  -H \"Authorization: Bearer $LLMGW_API_KEY\"");
    lines.push("  -d " + shellQuote(JSON.stringify(req)));
    return lines.join(" \\\n");
  }

  // The chat request as the openai client's create(): every field of the body, one keyword argument each.
  function chatPython(url, req, keyed) {
    const base = url.replace(/\/chat\/completions$/, "");
    const args = Object.keys(req).map(function (k) { return "    " + k + "=" + pyValue(req[k], "    ") + ","; });
    const out = [
      "import os", "", "from openai import OpenAI", "",
      "client = OpenAI(base_url=" + JSON.stringify(base) + ", api_key=" + apiKey(keyed) + ")",
      (req.stream ? "stream" : "answer") + " = client.chat.completions.create(",
    ].concat(args, [")"]);
    if (req.stream) {
      out.push("for chunk in stream:",
               "    if chunk.choices and chunk.choices[0].delta.content:",
               "        print(chunk.choices[0].delta.content, end=\"\", flush=True)");
    } else {
      out.push("print(answer.choices[0].message.content)");
    }
    return out.join("\n");
  }

  function embedPython(url, req, keyed) {
    return [
      "import os", "", "from openai import OpenAI", "",
      "client = OpenAI(base_url=" + JSON.stringify(url.replace(/\/embeddings$/, "")) + ", api_key=" + apiKey(keyed) + ")",
      "result = client.embeddings.create(",
      "    model=" + JSON.stringify(req.model) + ",",
      "    input=" + JSON.stringify(req.input) + ",",
      "    encoding_format=" + JSON.stringify(req.encoding_format) + ",",
      ")",
      "vector = result.data[0].embedding",
      "print(len(vector), vector[:8])",
    ].join("\n");
  }

  window.llmgwSnippets = Object.freeze({
    chat: function (url, req, keyed) { return { curl: curl(url, req, keyed, req.stream), python: chatPython(url, req, keyed) }; },
    embed: function (url, req, keyed) { return { curl: curl(url, req, keyed, false), python: embedPython(url, req, keyed) }; },
  });
})();
