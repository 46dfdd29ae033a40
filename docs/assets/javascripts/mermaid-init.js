// mermaid is loaded from the site itself (assets/vendor), never from a CDN.
// Material renders the diagrams on its own schedule, so mermaid must not also
// start on page load and draw each diagram a second time.
if (window.mermaid && typeof window.mermaid.initialize === "function") {
  window.mermaid.initialize({ startOnLoad: false });
}
