#!/usr/bin/env python3
"""Find module import cycles in every crate of the workspace, and base modules that import a tier.

A module is a source file (`src/lib.rs` is the crate's root, `src/a/b.rs` and `src/a/b/mod.rs`
are `a::b`; each `src/bin/<name>` is a crate of its own); inline modules (`mod tests { .. }`)
count as part of their file. Module `a` imports module `b` when `a`'s code names a path into `b`:
`crate::b::..`, `super::..`, `self::..`, or a child module's name, in a `use` or inline. A
path that ends at an item a module re-exports (`pub use x::Item`) leads on to the module that
defines it, so `use crate::Error` reaches `error`, not the crate's root.

Cycles are strongly connected groups of two or more modules; each is printed with one import
that closes it. `--forbid CRATE:BASE,..:TIER,..` adds a rule: no module under a BASE prefix
may import a module under a TIER prefix. `--edges CRATE` prints that crate's imports instead.

Exit status: 0 when there is no cycle and no broken rule, 1 otherwise, 2 on bad usage.
`cargo-modules` would do this from rust-analyzer's view, but builds rust-analyzer's crates, many
minutes on 2 cores; the cycles we care about are visible in the paths alone.
"""

import argparse
import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text):
    """Blank comments and string/char literals, keeping line structure roughly intact."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif re.match(r'b?r#*"', text[i:i + 40]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'b?r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{d, e as f}, self, g::*}` -> ['a::b', 'a::c::d', 'a::c::e', 'a', 'a::g']."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, start = [], 0, 0
        for k, ch in enumerate(s):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        return [p for p in parts + [s[start:]] if p]

    def parse(s, prefix):
        paths = []
        for part in split_top(s):
            if "{" in part:
                head, rest = part.split("{", 1)
                head = [h for h in head.split("::") if h]
                paths += parse(rest[:-1], prefix + head)
                continue
            segs = [h for h in part.split("::") if h and h != "*"]
            if segs == ["self"]:
                segs = []
            paths.append("::".join(prefix + segs))
        return paths

    return [p for p in parse(tree, []) if p]


class Crate:
    def __init__(self, name, root):
        self.name = name
        self.root = root  # the file of the crate's root module
        self.files = {}  # module path (tuple) -> file
        self.edges = {}  # module -> {module: example path}
        self.reexports = {}  # module -> {name: module path it comes from}

    def module_of(self, file):
        base = self.root.parent
        rel = file.relative_to(base).with_suffix("")
        parts = list(rel.parts)
        if file == self.root:
            return ()
        if parts[-1] == "mod":
            parts.pop()
        return tuple(parts)

    def load(self):
        base = self.root.parent
        for file in sorted(base.rglob("*.rs")):
            # A library's src/bin/ holds other crates (binaries), not its modules.
            if self.root.name == "lib.rs" and file.relative_to(base).parts[0] == "bin":
                continue
            self.files[self.module_of(file)] = file
        self.code = {m: strip_code(f.read_text()) for m, f in self.files.items()}
        for m, code in self.code.items():
            self.reexports[m] = self.find_reexports(m, code)

    def children(self, module):
        return {m[-1] for m in self.files if len(m) == len(module) + 1 and m[:-1] == module}

    def resolve(self, module, path, seen=None):
        """The module a path written in `module` leads into, or None when it leaves the crate."""
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            cur, rest = (), segs[1:]
        elif head in ("super", "self"):
            cur, rest = module, segs
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    if not cur:
                        return None
                    cur = cur[:-1]
                rest = rest[1:]
        elif head in self.children(module):
            cur, rest = module, segs
        else:
            return None
        found = self.descend(cur, rest, set() if seen is None else seen)
        # A path into an inline module (`mod tests { .. }`) is a path into its file.
        while found not in self.files:
            found = found[:-1]
        return found

    def descend(self, cur, rest, seen):
        for k, seg in enumerate(rest):
            if cur + (seg,) in self.files:
                cur = cur + (seg,)
                continue
            # An item of `cur`: follow it if `cur` re-exports it from elsewhere.
            source = self.reexports.get(cur, {}).get(seg)
            if source is not None and (cur, seg) not in seen:
                seen.add((cur, seg))
                module = self.resolve(cur, source, seen)
                if module is not None:
                    return module
            return cur
        return cur

    def find_reexports(self, module, code):
        names = {}
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", code):
            for path in expand_use(m.group(1)):
                segs = path.split("::")
                if not segs or segs[0] in ("std", "core", "alloc"):
                    continue
                names[segs[-1]] = path
        return names

    def scan(self):
        for m, code in self.code.items():
            found = {}
            spans = inline_spans(code)
            for u in re.finditer(r"(?<![\w:])use\s+([^;]+);", code):
                for path in expand_use(u.group(1)):
                    found.setdefault((path, inline_at(spans, u.start())), None)
            pattern = r"(?<![\w$:])((?:crate|super|self)(?:::" + IDENT + ")+)"
            for p in re.finditer(pattern, code):
                found.setdefault((p.group(1), inline_at(spans, p.start())), None)
            kids = self.children(m)
            if kids:
                child = r"(?<![\w$:.])((?:" + "|".join(map(re.escape, kids)) + ")(?:::" + IDENT + ")+)"
                for p in re.finditer(child, code):
                    found.setdefault((p.group(1), inline_at(spans, p.start())), None)
            for path, inline in found:
                target = self.resolve(m + inline, path)
                if target is not None and target != m:
                    self.edges.setdefault(m, {}).setdefault(target, path)


def inline_spans(code):
    """Each inline module (`mod name { .. }`) of a file's code: its name and the span it covers."""
    spans, depth, opened = [], 0, []
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{|[{}]", code):
        if m.group(0) == "}":
            depth -= 1
            if opened and opened[-1][2] == depth:
                name, start, _ = opened.pop()
                spans.append((name, start, m.end()))
        else:
            if m.group(1):
                opened.append((m.group(1), m.start(), depth))
            depth += 1
    spans += [(name, start, len(code)) for name, start, _ in opened]
    return sorted(spans, key=lambda span: span[1])


def inline_at(spans, pos):
    """The inline modules open at `pos`, outermost first."""
    return tuple(name for name, start, end in spans if start <= pos < end)


def crates(workspace):
    for toml in sorted(workspace.glob("crates/*/Cargo.toml")):
        src = toml.parent / "src"
        name = toml.parent.name
        if (src / "lib.rs").exists():
            yield Crate(name, src / "lib.rs")
        for main in sorted(src.glob("bin/*/main.rs")):
            yield Crate(f"{name}/bin/{main.parent.name}", main)
        if (src / "main.rs").exists():
            yield Crate(name, src / "main.rs")


def fmt(module):
    return "::".join(module) or "crate"


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def under(module, prefixes):
    return any(module[: len(p)] == p for p in prefixes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workspace", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--forbid", action="append", default=[], metavar="CRATE:BASE,..:TIER,..")
    ap.add_argument("--edges", metavar="CRATE")
    args = ap.parse_args()
    rules = []
    for rule in args.forbid:
        parts = rule.split(":")
        if len(parts) != 3:
            ap.error(f"--forbid {rule!r}: expected CRATE:BASE,..:TIER,..")
        split = lambda s: [tuple(x.split("::")) for x in s.split(",") if x]
        rules.append((parts[0], split(parts[1]), split(parts[2])))
    bad = 0
    found_any = False
    for crate in crates(Path(args.workspace)):
        found_any = True
        crate.load()
        crate.scan()
        if args.edges is not None:
            if crate.name == args.edges:
                for a in sorted(crate.edges):
                    for b, path in sorted(crate.edges[a].items()):
                        print(f"{fmt(a)} -> {fmt(b)}  ({path})")
            continue
        for group in sccs(sorted(crate.files), crate.edges):
            bad += 1
            members = set(group)
            print(f"{crate.name}: cycle among {', '.join(fmt(m) for m in group)}")
            for a in group:
                for b, path in sorted(crate.edges.get(a, {}).items()):
                    if b in members:
                        print(f"    {fmt(a)} -> {fmt(b)}  (names {path})")
        for name, bases, tiers in rules:
            if name != crate.name:
                continue
            for a, targets in sorted(crate.edges.items()):
                if not under(a, bases):
                    continue
                for b, path in sorted(targets.items()):
                    if under(b, tiers):
                        bad += 1
                        print(f"{crate.name}: base module {fmt(a)} imports {fmt(b)} (names {path})")
    if not found_any:
        print(f"check-cycles: no crates under {args.workspace}/crates", file=sys.stderr)
        return 2
    if bad == 0 and args.edges is None:
        print("check-cycles: no module imports a module that imports it back")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
