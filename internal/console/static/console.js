// outbox console: refreshes the overview's live part, and ticks every box
// of a dead-letter page at once. Everything else is plain HTML forms.
"use strict";
(function () {
  const live = document.querySelector("[data-refresh]");
  if (live) {
    const url = live.dataset.refresh;
    const every = Math.max(500, Number(live.dataset.every) || 2000);
    let failures = 0;
    const tick = async function () {
      try {
        const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
        if (r.ok) {
          // The server renders this part with html/template: every value in
          // it is escaped there, so it is inserted as it comes.
          live.innerHTML = await r.text();
          live.dataset.refreshed = String((Number(live.dataset.refreshed) || 0) + 1);
          failures = 0;
        } else {
          failures++;
        }
      } catch (e) {
        failures++;
      }
      live.classList.toggle("stale", failures > 0);
      setTimeout(tick, every * Math.min(1 + failures, 10));
    };
    setTimeout(tick, every);
  }
  for (const all of document.querySelectorAll("input[data-select-all]")) {
    all.addEventListener("change", function () {
      for (const box of document.querySelectorAll('input[type=checkbox][name=id]')) {
        box.checked = all.checked;
      }
    });
  }
})();
