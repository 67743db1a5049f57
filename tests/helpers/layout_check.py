"""Measure a report's figures in a real browser: every text element's box, overlaps, figure edges.

A script added to a copy of the page waits until every plot is drawn, then, per figure, takes the
bounding box (``getBoundingClientRect``) of every visible, non-empty SVG ``text`` element, and
records into a ``<pre id="layout-check">`` element (read back from ``--dump-dom``) every pair whose
boxes overlap, every box that crosses the figure's edge, and a legend that scrolls (hides entries).
``test_report_layout.py`` uses it, with ``test_report._chromium``: no Chromium fails the test.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

SLACK = 1.0  # px: boxes that only touch (font ascent/descent of adjacent lines) are not overlaps

SCRIPT = """
<script>
(function () {
  const SLACK = %(slack)s;
  function visible(el, root) {
    for (let e = el; e && e !== root; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (cs.display === 'none' || cs.visibility === 'hidden' || parseFloat(cs.opacity) === 0) return false;
    }
    return true;
  }
  function check() {
    const out = {};
    document.querySelectorAll('.js-plotly-plot').forEach(function (div) {
      const edge = div.getBoundingClientRect();
      const items = [];
      div.querySelectorAll('svg text').forEach(function (t) {
        const text = t.textContent.trim();
        if (!text || !visible(t, div)) return;
        const r = t.getBoundingClientRect();
        if (r.width <= 0 || r.height <= 0) return;
        items.push({text: text.slice(0, 80), l: r.left, r: r.right, t: r.top, b: r.bottom});
      });
      const problems = [];
      items.forEach(function (a) {
        const out = a.l < edge.left - SLACK || a.r > edge.right + SLACK || a.t < edge.top - SLACK ||
          a.b > edge.bottom + SLACK;
        if (out) problems.push('crosses the figure edge: ' + JSON.stringify(a.text));
      });
      for (let i = 0; i < items.length; i++) for (let j = i + 1; j < items.length; j++) {
        const a = items[i], b = items[j];
        const w = Math.min(a.r, b.r) - Math.max(a.l, b.l), h = Math.min(a.b, b.b) - Math.max(a.t, b.t);
        if (w > SLACK && h > SLACK)
          problems.push('overlap: ' + JSON.stringify(a.text) + ' / ' + JSON.stringify(b.text));
      }
      div.querySelectorAll('.legend .scrollbar').forEach(function (bar) {
        const r = bar.getBoundingClientRect();
        if (r.height > 0 && r.width > 0) problems.push('the legend scrolls: some entries are hidden');
      });
      out[div.id] = {texts: items.length, width: edge.width, problems: problems};
    });
    const pre = document.createElement('pre');
    pre.id = 'layout-check';
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  function ready() {
    const plots = document.querySelectorAll('.js-plotly-plot');
    return Array.prototype.every.call(plots, function (d) { return d.querySelectorAll('.main-svg').length >= 2; });
  }
  let tries = 0;
  (function wait() {
    if (ready() || ++tries > 200) setTimeout(check, 300); else setTimeout(wait, 50);
  })();
})();
</script>
""" % {"slack": SLACK}


def measure(page: Path, browser: list[str], tmp_path: Path) -> dict[str, dict]:
    """{plot div id: {texts, width, problems}} of ``page`` (a copy with the measuring script is loaded)."""
    probe = tmp_path / f"{page.stem}-measured.html"
    text = page.read_text()
    probe.write_text(text.replace("</body>", SCRIPT + "</body>", 1) if "</body>" in text else text + SCRIPT)
    dom = subprocess.run([*browser, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="layout-check">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the measuring script did not run (no #layout-check in the page)"
    return json.loads(html.unescape(found.group(1)))


def problems(measured: dict[str, dict]) -> list[str]:
    """One line per problem, prefixed with the figure's div id."""
    return [f"{div}: {p}" for div, m in measured.items() for p in m["problems"]]
