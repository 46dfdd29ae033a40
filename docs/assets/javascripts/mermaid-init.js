// mermaid is loaded from the site itself (assets/vendor), never from a CDN.
// Material renders the diagrams on its own schedule, so mermaid must not also
// start on page load and draw each diagram a second time.
if (window.mermaid && typeof window.mermaid.initialize === "function") {
  window.mermaid.initialize({ startOnLoad: false });
}

// A wide diagram on a narrow screen shrinks to the column, and its text with it, to a few
// pixels on a phone. Each drawn diagram gets a minimum width at which its smallest text is
// MIN_TEXT_PX; below that its box (div.mermaid, overflow-x: auto) scrolls sideways.
// Material draws the diagrams in shadow roots, late and on its own schedule: look again
// every few hundred milliseconds, each diagram once.
// Material's shadow roots are closed (host.shadowRoot is null): keep a reference to each
// one as it is attached, to find the drawn SVG. Nothing else about them changes.
(function () {
  var MIN_TEXT_PX = 12;
  var roots = new WeakMap();
  var attach = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) {
    var root = attach.call(this, init);
    roots.set(this, root);
    return root;
  };
  function keepLegible() {
    document.querySelectorAll("div.mermaid").forEach(function (host) {
      var root = host.shadowRoot || roots.get(host);
      var svg = root && root.querySelector("svg");
      if (!svg || svg.dataset.legible) return;
      var box = svg.viewBox && svg.viewBox.baseVal;
      if (!box || !box.width) return;
      var smallest = Infinity;
      svg.querySelectorAll("text, foreignObject div, foreignObject span").forEach(function (el) {
        if (!el.textContent.trim()) return;
        var size = parseFloat(getComputedStyle(el).fontSize);
        if (size < smallest) smallest = size;
      });
      if (!isFinite(smallest)) return;
      svg.style.minWidth = Math.ceil(box.width * MIN_TEXT_PX / smallest) + "px";
      svg.dataset.legible = "1";
    });
  }
  setInterval(keepLegible, 300);
})();
