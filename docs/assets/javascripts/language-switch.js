// Switching language keeps the reader's place: the Chinese pages give their headings the
// English ids ({#goal}), so the same #section exists on the twin page. The switcher's links
// are plain links to the twin page (mkdocs-static-i18n writes them per page); the section
// the reader is in (the last heading above the top of the window, whatever the address's
// hash says: a tab's or a heading long scrolled past) is added as they are followed.
document.addEventListener(
  "click",
  function (event) {
    var link = event.target.closest && event.target.closest("a.md-select__link[hreflang]");
    if (!link) return;
    var here = "";
    var headings = document.querySelectorAll(".md-content h2[id], .md-content h3[id]");
    for (var i = 0; i < headings.length; i++) {
      if (headings[i].getBoundingClientRect().top > 80) break;
      here = "#" + headings[i].id;
    }
    link.href = link.href.split("#")[0] + here;
  },
  true
);
