"""The layout of course/ and its import rules (the map is in course/__init__.py).

- lessons import only the top level of course/ (what they share);
- the top level imports nothing from grader/, probes/ or tools/;
- the probes import nothing heavy when they load: they run inside every launched
  process, before the lesson's own first line;
- no import cycles among the course's modules;
- the diagram of docs/contributing.md shows exactly the folders' imports.

Read from the source (ast), so a test run imports none of it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "course"
FOLDERS = ("grader", "launch", "measure", "probes", "tools")
# The layering, from the bottom: a folder imports only from those below it (or itself).
LAYERS = ("top", "measure", "probes", "launch", "grader", "tools")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(COURSE.rglob("*.py")) if "_site" not in p.parts}


def imports(path: Path) -> set[str]:
    """Every course module `path` imports, anywhere in the file (lazy imports too)."""
    known = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` reads the submodule; the package itself only when a
            # name it defines is imported.
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [*subs, node.module] if not all(s in known for s in subs) else subs
        else:
            continue
        found |= {n for n in names if n in known}
    # A package that loads its names on first use (course/launch/__init__.py) lists them in
    # _EXPORTS = {name: submodule}: those are its imports too.
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS":
            package = module_name(path)
            found |= {f"{package}.{v.value}" for v in node.value.values} & set(known)
    return found


def folder(module: str) -> str:
    """ "top", or the folder below course/ that holds `module`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FOLDERS) else "top"


def test_lessons_import_only_the_top_level():
    scripts = sorted([*ROOT.glob("solutions/*/*.py"), *ROOT.glob("lessons/*/*.py")])
    assert scripts
    wrong = {
        str(p.relative_to(ROOT)): sorted(m for m in imports(p) if folder(m) != "top")
        for p in scripts
    }
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"lessons import from course's sub-packages: {wrong}"


def test_the_top_level_imports_nothing_below_it():
    # course/__main__.py is the entry point of `python -m course`, the tools' front door.
    top = {m: p for m, p in modules().items() if folder(m) == "top" and m != "course.__main__"}
    wrong = {m: sorted(i for i in imports(p) if folder(i) != "top") for m, p in top.items()}
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"top-level modules import the grader, probes or tools: {wrong}"


def test_probes_import_nothing_heavy_when_they_load():
    probes = sorted(m for m in modules() if folder(m) == "probes")
    code = (
        "import importlib, sys\n"
        f"for m in {probes!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pytest') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"importing the probes loaded {out.stdout.strip()}"


def test_no_import_cycles():
    graph = {m: imports(p) - {m} for m, p in modules().items()}
    # A package imports its own submodules when they are named in `from pkg import sub`;
    # that is the package reading its parts, not a part needing the whole package back.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycle = stack[stack.index(n) :] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_folder_imports_from_a_folder_above_it():
    """The folders' layering (LAYERS, bottom first): the top level, the measuring kit, the
    probes, the launcher, the grader, the tools; each imports only from below itself.
    Inside launch/, the optional warm start builds on the launcher: launch/warm/ may import
    launch/'s modules, never the other way round."""
    up = []
    for m, p in modules().items():
        if m == "course.__main__":  # the entry point: it dispatches to the tools
            continue
        for i in imports(p):
            if LAYERS.index(folder(i)) > LAYERS.index(folder(m)):
                up.append(f"{m} -> {i}")
            elif _warm(i) and not _warm(m) and folder(m) == "launch":
                up.append(f"{m} -> {i} (launch/ needs its optional warm start)")
    assert not up, f"imports that run up the layering: {sorted(up)}"


def _warm(module: str) -> bool:
    return module.startswith("course.launch.warm")


EDGE = re.compile(r"^\s*(\w+)\s*-->\s*(\w+)\s*$", re.M)


def test_the_contributing_diagram_shows_the_folders_imports():
    edges = set()
    for m, p in modules().items():
        if m == "course.__main__":  # the entry point (see above)
            continue
        for i in imports(p):
            a, b = folder(m), folder(i)
            if a != b:
                edges.add((a, b))
    page = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    block = re.search(r"```mermaid\n(flowchart[^`]*?course layout[^`]*?)```", page, re.S)
    assert block, "docs/contributing.md has no mermaid flowchart of the course layout"
    drawn = set(EDGE.findall(block.group(1)))
    assert drawn == edges, (
        f"the diagram draws {sorted(drawn)}; the imports are {sorted(edges)}. "
        "Redraw it (docs/contributing.md, 'Where things go')"
    )


def test_no_module_over_300_lines_without_a_reason_at_its_top():
    """A long file says why it is one file ("Over 300 lines, on purpose: ...")."""
    files = [*COURSE.rglob("*.py"), *(ROOT / "docs" / "hooks").rglob("*.py")]
    long = {
        str(p.relative_to(ROOT)): n
        for p in files
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300
        and "Over 300 lines, on purpose" not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    }
    assert not long, f"files over 300 lines without a reason at their top: {long}"


def test_the_site_hook_imports_the_course_by_name_only_to_reload_the_registry():
    """docs/hooks imports course.tools statically, so that the layout test and a reader see
    what the site depends on; only the lesson registry is imported by string, to reload it
    for `mkdocs serve`."""
    hooks = ROOT / "docs" / "hooks"
    found = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in sorted(hooks.rglob("*.py"))
        for m in re.findall(r"import_module\(\s*\"([\w.]+)\"", p.read_text(encoding="utf-8"))
        if m != "course.registry"
    ]
    assert not found, f"modules imported by string in the site hook: {found}"


# --- the house's rules (issue 51): what each folder may hold and import -------------------

LESSON_FACING = {"course", "course.__main__", "course.registry"}  # besides what lessons import


def _closure(start: set[str], within: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    files = modules()
    while todo:
        m = todo.pop()
        if m in seen or m not in within:
            continue
        seen.add(m)
        todo.extend(imports(files[m]))
    return seen


def test_the_top_level_holds_only_what_lessons_import_and_the_registry():
    top = {m for m in modules() if folder(m) == "top"}
    scripts = [*ROOT.glob("solutions/*/*.py"), *ROOT.glob("lessons/*/*.py")]
    used = _closure(set().union(*(imports(p) for p in scripts)), top)
    extra = sorted(top - used - LESSON_FACING)
    assert not extra, (
        f"top-level modules no lesson imports (directly or through another): {extra}; "
        "they belong in a sub-package (launch/, grader/, probes/, tools/)"
    )


def test_launch_is_imported_by_the_grader_tools_and_probes_entry_point_only():
    """course/launch/ starts processes: the grader, the tools and the probes' entry point
    (probes/_site/sitecustomize.py hands a process to its zygote) use it; lessons, the top
    level and the probes themselves never do."""
    allowed = {"grader", "tools", "launch"}
    wrong = {
        m: sorted(i for i in imports(p) if folder(i) == "launch")
        for m, p in modules().items()
        if folder(m) not in allowed
    }
    wrong = {m: v for m, v in wrong.items() if v}
    site = COURSE / "probes" / "_site" / "sitecustomize.py"
    assert "course.launch.warm" in site.read_text(encoding="utf-8")
    scripts = [*ROOT.glob("solutions/*/*.py"), *ROOT.glob("lessons/*/*.py")]
    wrong |= {str(p): ["course.launch"] for p in scripts if "course.launch" in p.read_text()}
    assert not wrong, f"imports of course.launch outside the grader and the tools: {wrong}"


def test_no_module_over_400_lines():
    files = [*COURSE.rglob("*.py"), *(ROOT / "docs" / "hooks").rglob("*.py")]
    long = {
        str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"modules over 400 lines: {long}; split them by job"


def _course_aliases(tree: ast.AST) -> dict[str, str]:
    """{local name: course module} for `from course[.x] import m` and `import course.x as m`."""
    known, found = modules(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    found[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    found[a.asname] = a.name
    return found


def test_no_module_writes_another_modules_globals():
    """State travels as arguments: no `other_module.NAME = value` (a global one module writes
    and another reads, as the grader's cancel once was)."""
    wrong = []
    for m, p in modules().items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        aliases = _course_aliases(tree)
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            targets += [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    if t.value.id in aliases and aliases[t.value.id] != m:
                        wrong.append(f"{m}:{node.lineno} writes {aliases[t.value.id]}.{t.attr}")
    assert not wrong, f"modules write other modules' globals: {wrong}"


MUTABLE = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def test_no_mutable_module_state_is_shared_across_packages():
    """A module's mutable globals (a cache, a registry of live processes) stay inside its
    folder: another folder neither imports them by name nor reads them as module.NAME."""
    files = modules()
    mutable: dict[str, set[str]] = {}
    for m, p in files.items():
        for node in ast.parse(p.read_text(encoding="utf-8")).body:
            value = getattr(node, "value", None)
            targets = (
                node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            )
            made = isinstance(value, MUTABLE) or (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in {"dict", "list", "set", "defaultdict", "OrderedDict"}
            )
            if made:
                mutable.setdefault(m, set()).update(
                    t.id for t in targets if isinstance(t, ast.Name)
                )
    wrong = []
    for m, p in files.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        aliases = _course_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in mutable:
                shared = {a.name for a in node.names} & mutable[node.module]
                if shared and folder(node.module) != folder(m):
                    wrong.append(f"{m} imports {node.module}.{sorted(shared)}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = aliases.get(node.value.id)
                if owner in mutable and node.attr in mutable[owner] and folder(owner) != folder(m):
                    wrong.append(f"{m}:{node.lineno} reads {owner}.{node.attr}")
    assert not wrong, f"mutable module state shared across folders: {sorted(set(wrong))}"


def test_no_module_imports_another_folders_module_by_string():
    """Imports are statements, so that this test and a reader see every dependency: no
    importlib.import_module("course.x") or preload list naming a module of another folder.
    (`python -m course ...` command lines name the package itself, which is allowed.)"""
    files = modules()
    wrong = []
    for m, p in files.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                s = node.value
                if s in files and s != "course" and folder(s) != folder(m):
                    wrong.append(f"{m}:{node.lineno} names {s}")
    assert not wrong, f"modules named by string across folders: {wrong}"


# --- the maps: course/__init__.py, the README's layout table, the contributing page -------


def _map_sections() -> dict[str, str]:
    """{folder: its part of course/__init__.py's map}, "top" for course/ itself."""
    doc = ast.get_docstring(ast.parse((COURSE / "__init__.py").read_text(encoding="utf-8")))
    sections, current = {}, None
    for line in doc.splitlines():
        head = re.match(r"^  course/(\w+/)?\s", line)
        if head:
            current = head.group(1).rstrip("/") if head.group(1) else "top"
        elif line.strip() and not line.startswith("    ") and current is not None:
            current = None if not line.startswith("                 ") else current
        if current is not None:
            sections[current] = sections.get(current, "") + line + "\n"
    return sections


def test_the_map_names_every_module_in_its_folder_and_nothing_else():
    sections = _map_sections()
    assert set(sections) == {"top", *FOLDERS}, sorted(sections)
    missing = []
    for m in modules():
        parts = m.split(".")
        if m in ("course", "course.__main__") or (len(parts) == 2 and parts[1] in FOLDERS):
            continue
        text = sections[folder(m)]
        if folder(m) == "top":
            want = parts[1]
        elif len(parts) == 3:
            want = parts[2] + ("/" if (COURSE / parts[1] / parts[2]).is_dir() else "")
        else:  # in a sub-folder: the sub-folder, and the module when it is one level down
            want = parts[3] if len(parts) == 4 else parts[3] + "/"
            missing += [f"{m} ({parts[2]}/)"] if f"{parts[2]}/" not in text else []
        if not re.search(rf"(?<![\w/]){re.escape(want)}(?![\w])", text):
            missing.append(f"{m} ({want})")
    assert not missing, f"course/__init__.py's map does not name: {missing}"
    listed = {
        (name, section)
        for section, text in sections.items()
        for name in re.findall(r"^    (\w+/?) {2,}", text, re.M)
    }
    known = {m.split(".")[-1] for m in modules()} | {
        p.name + "/" for p in COURSE.rglob("*") if p.is_dir() and (p / "__init__.py").exists()
    }
    unknown = sorted(f"{s}: {n}" for n, s in listed if n not in known)
    assert not unknown, f"the map names modules that do not exist: {unknown}"


def test_the_readme_and_the_contributing_page_show_every_folder():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 1)]
    page = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    table = page[page.index("## Where things go") :]
    wanted = [f"course/{f}/" for f in FOLDERS]
    tests = ["tests/lessons/", "tests/mutants/", "tests/course/", "tests/site/", "tests/ops/"]
    assert not [w for w in [*wanted, *tests] if f"`{w}`" not in layout], layout
    assert not [w for w in wanted if f"| `{w}` |" not in table], "contributing: Where things go"
    for folder_ in tests:  # they exist, and nothing else sits beside them but the conftest
        assert (ROOT / folder_).is_dir(), folder_
    loose = sorted(p.name for p in (ROOT / "tests").glob("*.py") if p.name != "conftest.py")
    assert not loose, f"test files outside the audiences' folders: {loose}"


def test_the_maps_of_the_top_level_and_the_tools_name_every_module():
    """The contributing page's rows for `course/` and `course/tools/` (in both languages)
    and the README's row for `course/` name every module there: a new one is added to the
    maps a newcomer reads, not only to course/__init__.py's."""
    top = {p.stem for p in (ROOT / "course").glob("*.py")} - {"__init__", "__main__"}
    tools = {p.stem for who in ("student", "instructor", "author")
             for p in (ROOT / "course" / "tools" / who).glob("*.py")} - {"__init__"}  # fmt: skip

    def row(text: str, folder: str) -> set[str]:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{folder}` |"))
        return set(re.findall(r"`([a-z_]+)/?`", line))

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = top - row(readme, "course/")
    assert not missing, f"README's course/ row lacks {sorted(missing)}"
    for name in ("contributing.md", "contributing.zh.md"):
        page = (ROOT / "docs" / name).read_text(encoding="utf-8")
        for folder_, wanted in (("course/", top), ("course/tools/", tools | {"bench"})):
            missing = wanted - row(page, folder_)
            assert not missing, f"{name}: the {folder_} row lacks {sorted(missing)}"
