"""How the explorer page behaves inside a notebook output (kept free of heavy imports: the server process reads it)."""

from __future__ import annotations

EMBED_HEIGHT_PX = 720

# Injected into Model Explorer's page by our server (the stock app takes no option for it): inside an IFrame (a
# notebook output) each pane's info panel starts collapsed, so the graphs get the width (two 370 px panels left
# ~100 px strips of graph in a 935 px output); the chevron at a pane's right edge opens it. A page opened in a tab of
# its own keeps the panels open.
EMBED_SCRIPT = """<script>(function () {
  if (window.self === window.top) { return; }
  var collapsed = new WeakSet();
  function collapse() {
    document.querySelectorAll("info-panel > .hide-toggle").forEach(function (toggle) {
      if (!collapsed.has(toggle)) { collapsed.add(toggle); toggle.click(); }
    });
  }
  var observer = new MutationObserver(collapse);
  observer.observe(document.documentElement, { childList: true, subtree: true });
  setTimeout(function () { observer.disconnect(); }, 120000);
})();</script>"""
