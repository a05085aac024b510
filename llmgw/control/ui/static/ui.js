// What the pages once did in inline handlers (onclick=, onsubmit=), which the UI's Content-Security-Policy
// (script-src 'self') no longer runs: a form with data-confirm asks first, and a button with data-copy copies
// the named element's text. Delegated from the document, so a part htmx swaps in later is covered too.
"use strict";
(function () {
  document.addEventListener("submit", function (event) {
    const form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });
  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    navigator.clipboard.writeText(source ? source.textContent : "").then(
      function () { button.textContent = "Copied"; },
      function () { button.textContent = "Copy failed: select the key and copy it"; });
  });
})();
