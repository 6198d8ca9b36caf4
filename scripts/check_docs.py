#!/usr/bin/env python3
"""Fails when the documentation cites a path or a name that no longer exists.

Docs rot quietly: a file is renamed, a function goes, a section moves to another note, and
the prose that pointed at it still reads well. This check reads README.md, docs/**/*.md,
tests/system/README.md and bench/README.md and, for every citation it can tell is one,
checks that what it names is there:

- a repository path in an inline code span or a link (`crates/vnet-reach/src/path.rs`,
  `docs/design/reach.md`, `vnetlab/wanlab.py`, [the note](design/reach.md)): a file or
  directory of this checkout. A path with a slash but no top-level directory of the repository
  first (`ports/udp_link.rs`, `src/layout_def.rs`) and a bare source file name (`splice.rs`) must be
  the end of some repository path; a link must resolve from the Markdown file's directory;
- a Rust path (`ForwardingTable::decide`, `vnet_cluster::derive`): every segment a word of
  some Rust source of the repository;
- a Python name under the repository's packages (`vnetlab.etcdlab.grpc_proxy_argv`): its
  module file, and the name in it;
- "`name` in `file`" (also "`a` and `b` in `file`"): the name in that file;
- a test's name (`test_late_keepalive_answers_keep_the_lease`): in some test source;
- a section cited by its words after a Markdown file (`docs/design/etcd-agent.md`, "The
  lasting watch starts at etcd's head"): those words in that file.

It is conservative: URLs, absolute paths (`/etc/vnet/vnet.conf`, `/sys/fs/bpf`), globs and
placeholders (`results/scale-*/`, `maps-HASH/`, `OUT_DIR/...`), command lines and files vnet
writes at run time (`host.json`) are not citations of the repository. Fenced code blocks are
not read. It also fails when docs/architecture.md, the map, grows past 300 lines.

    python3 scripts/check_docs.py              # exit 1 listing file:line: what dangles
    python3 scripts/check_docs.py --self-test  # the extraction and checks on sample text

Python 3 standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass

MAP = "docs/architecture.md"
MAP_MAX_LINES = 300

# Extensions of files the docs cite as part of the repository. A bare name (no slash) is
# checked only with a source extension: a bare `host.json` or `config.vnet` is a file vnet
# writes, not one of the repository's.
PATH_EXTS = (
    ".rs", ".py", ".sh", ".c", ".h", ".proto", ".md", ".toml", ".txt", ".json", ".png",
    ".service", ".conf", ".vnet", ".yml", ".yaml", ".8", ".1",
)
# A path with a slash that does not start at a top-level directory of the repository
# (`ports/udp_link.rs`) is checked with these only: `linux/if_tun.h` is the system's.
SUFFIX_EXTS = (".rs", ".py", ".sh", ".c", ".md", ".proto", ".png")
BARE_EXTS = (".rs", ".py", ".sh")
# What runs write into the checkout (ignored by git): cited as where output goes.
RUN_OUTPUT = {"results", "target"}
SKIP_DIRS = {".git", "target", "__pycache__", "node_modules", "corpus", "artifacts"}
# Names generated at build time, cited on purpose, never in the repository.
GENERATED = {"fastpath.skel.rs", "fastpath_layout.h"}

CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
RUST_PATH = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+")
PY_NAME = re.compile(r"^([a-z_][a-z0-9_]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
PYTEST_ID = re.compile(r"^([A-Za-z0-9_./-]+\.py)((?:::[A-Za-z_][A-Za-z0-9_]*)+)$")
TEST_NAME = re.compile(r"^test_[a-z0-9_]+$")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?$")
PATHLIKE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.\-/]*$")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Problem:
    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


class Repo:
    """The checkout's files (tracked and untracked, not ignored) and what is in them."""

    def __init__(self, root: str, files: list[str] | None = None):
        self.root = root
        self.files = sorted(files if files is not None else list_files(root))
        self.file_set = set(self.files)
        self.dirs: set[str] = set()
        for f in self.files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                self.dirs.add("/".join(parts[:i]))
        self.top = {f.split("/")[0] for f in self.files}
        self._words: dict[str, set[str]] = {}
        self._text: dict[str, str] = {}

    def text(self, rel: str) -> str:
        if rel not in self._text:
            try:
                with open(os.path.join(self.root, rel), encoding="utf-8", errors="replace") as f:
                    self._text[rel] = f.read()
            except OSError:
                self._text[rel] = ""
        return self._text[rel]

    def words(self, exts: tuple[str, ...]) -> set[str]:
        key = ",".join(exts)
        if key not in self._words:
            w: set[str] = set()
            for f in self.files:
                if f.endswith(exts):
                    w.update(WORD.findall(self.text(f)))
            self._words[key] = w
        return self._words[key]

    def exists(self, rel: str) -> bool:
        rel = rel.rstrip("/")
        return rel in self.file_set or rel in self.dirs

    def ending_with(self, tail: str) -> list[str]:
        """Repository files and directories whose path is `tail` or ends with "/tail"."""
        tail = tail.rstrip("/")
        out = [p for p in self.files if p == tail or p.endswith("/" + tail)]
        out += [d for d in self.dirs if d == tail or d.endswith("/" + tail)]
        return out


def list_files(root: str) -> list[str]:
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            check=True, capture_output=True,
        ).stdout.decode()
        files = [f for f in out.split("\0") if f]
        # A file deleted in the work tree but still in the index is gone for the docs.
        return [f for f in files if os.path.exists(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
            for n in names:
                files.append(os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/"))
        return files


def blank_fences(text: str) -> str:
    """The text with fenced code blocks blanked (newlines kept, so line numbers hold)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```") or line.lstrip().startswith("~~~"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def placeholder(token: str) -> bool:
    """A token that stands for many names: a glob, a template, an upper-case placeholder
    segment (`maps-HASH`, `OUT_DIR`, `config.journal.N`)."""
    if any(c in token for c in "*?<>{}[]$~…") or "..." in token:
        return True
    for seg in token.strip("/").split("/"):
        for part in re.split(r"[-.]", seg):
            if part and re.fullmatch(r"[A-Z][A-Z0-9_]*", part) and part not in (
                "README", "LICENSE", "BRIEF", "HELPER",
            ):
                return True
    return False


def path_token(token: str, repo: Repo) -> str | None:
    """The repository path a code span names, or None when it names none."""
    t = re.sub(r":\d+(-\d+)?$", "", token.strip())  # a line number after a path
    if not PATHLIKE.match(t) or "//" in t or t.startswith(("/", "-")):
        return None
    if placeholder(t) or t.rsplit("/", 1)[-1] in GENERATED:
        return None
    first = t.split("/")[0]
    if first in RUN_OUTPUT or first == "..":
        return None  # run output, or outside the repository (`../shared/seeds/`)
    if "/" in t:
        if first in repo.top or first == ".":
            return t if first in repo.top or t.endswith(PATH_EXTS) else None
        return t if t.endswith(SUFFIX_EXTS) else None
    if t.endswith(BARE_EXTS) or t in repo.top:
        return t
    return None


def resolve(path: str, doc: str, repo: Repo) -> bool:
    """Whether a cited path exists: from the repository's root, from the citing file's
    directory, or as the end of some repository path."""
    here = os.path.dirname(doc)
    rel = os.path.normpath(os.path.join(here, path)).replace(os.sep, "/")
    if not rel.startswith("..") and repo.exists(rel):
        return True
    if path.startswith(("./", "../")):
        return False
    return bool(repo.ending_with(path))


def files_for(path: str, doc: str, repo: Repo) -> list[str]:
    here = os.path.dirname(doc)
    rel = os.path.normpath(os.path.join(here, path)).replace(os.sep, "/")
    if rel in repo.file_set:
        return [rel]
    return [p for p in repo.ending_with(path) if p in repo.file_set]


def norm(s: str) -> str:
    s = re.sub(r"[*`_]", "", s)
    return re.sub(r"\s+", " ", s).strip().lower()


CHECKED: Counter[str] = Counter()  # citations checked, by kind, for the summary line


def check_doc(doc: str, text: str, repo: Repo) -> list[Problem]:
    problems: list[Problem] = []
    body = blank_fences(text)

    def bad(pos: int, what: str) -> None:
        problems.append(Problem(doc, line_of(body, pos), what))

    spans = [(m.start(), m.end(), re.sub(r"\s+", " ", m.group(1)).strip())
             for m in CODE_SPAN.finditer(body)]

    rust_words = None
    for start, end, tok in spans:
        m = PYTEST_ID.match(tok)
        if m:  # a pytest node id: its file, and every name in it
            CHECKED["pytest id"] += 1
            targets = files_for(m.group(1), doc, repo)
            if not targets:
                bad(start, f"`{tok}`: no such file in the repository")
            for name in m.group(2).split("::")[1:]:
                if targets and not any(re.search(r"\b" + name + r"\b", repo.text(f)) for f in targets):
                    bad(start, f"`{tok}`: {name} not in {targets[0]}")
            continue
        p = path_token(tok, repo)
        if p is not None:
            CHECKED["path"] += 1
            if not resolve(p, doc, repo):
                bad(start, f"`{tok}`: no such file or directory in the repository")
            elif p.endswith(".md"):
                check_section(doc, body, end, p, repo, bad)
            continue
        m = PY_NAME.match(tok)
        if m and m.group(1) in repo.top and os.path.isdir(os.path.join(repo.root, m.group(1))):
            CHECKED["python name"] += 1
            check_python(tok, repo, start, bad)
            continue
        if TEST_NAME.match(tok) and not tok.endswith("_"):
            CHECKED["test name"] += 1
            if tok not in repo.words((".py", ".rs")):
                bad(start, f"`{tok}`: no test of that name in the repository")
            continue
        if " " in tok or tok.startswith("-"):
            continue  # a command line, or an option with its argument
        for rp in RUST_PATH.findall(tok):
            CHECKED["rust path"] += 1
            if rust_words is None:
                rust_words = repo.words((".rs",))
            missing = [s for s in rp.split("::") if s not in rust_words]
            if missing:
                bad(start, f"`{rp}`: {', '.join(missing)} in no Rust source of the repository")

    # "`a` in `file`", "`a` and `b` in `file`", "`a`, `b` in `file`".
    for i, (start, end, tok) in enumerate(spans):
        if i == 0:
            continue
        p = path_token(tok, repo)
        if p is None or not re.fullmatch(r"\s+in\s+", body[spans[i - 1][1]:start]):
            continue
        targets = files_for(p, doc, repo)
        if not targets:
            continue  # already reported as a missing path
        j = i - 1
        while j >= 0:
            name = spans[j][2]
            if not IDENT.match(name):
                break
            word = name.removesuffix("()").split("::")[-1]
            CHECKED["name in file"] += 1
            if not any(re.search(r"\b" + re.escape(word) + r"\b", repo.text(f)) for f in targets):
                bad(spans[j][0], f"`{name}`: not in `{tok}`")
            if j == 0 or not re.fullmatch(r",\s*|,?\s+(?:and|or)\s+", body[spans[j - 1][1]:spans[j][0]]):
                break
            j -= 1

    for m in LINK.finditer(body):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, mailto:, or an anchor in this file
        path = target.split("#")[0]
        if not path or placeholder(path) or path.startswith("/"):
            continue
        CHECKED["link"] += 1
        here = os.path.dirname(doc)
        rel = os.path.normpath(os.path.join(here, path)).replace(os.sep, "/")
        if rel.startswith("..") or not repo.exists(rel):
            bad(m.start(), f"link ({target}): no such file or directory (from {here or '.'}/)")
    return problems


def check_section(doc, body, end, path, repo, bad) -> None:
    """After a Markdown file: `, "Words"` or ` ("Words")` or `, section "Words"` names a
    part of it; the words must be in it."""
    m = re.match(r"\s*(?:,|\()\s*(?:section\s+|sections\s+)?\"([^\"]{3,200})\"", body[end:end + 260])
    if not m:
        return
    targets = [f for f in files_for(path, doc, repo) if f.endswith(".md")]
    if not targets:
        return
    CHECKED["section"] += 1
    want = norm(m.group(1))
    if not any(want in norm(repo.text(f)) for f in targets):
        words = re.sub(r"\s+", " ", m.group(1)).strip()
        bad(end, f"\"{words}\": no such words in `{path}` (a section that moved?)")


def check_python(tok: str, repo: Repo, pos: int, bad) -> None:
    """`pkg.module.name`: the longest prefix that is a module file, the rest a name in it."""
    parts = tok.split(".")
    for k in range(len(parts), 0, -1):
        mod = "/".join(parts[:k])
        for cand in (mod + ".py", mod + "/__init__.py"):
            if cand in repo.file_set:
                rest = parts[k:]
                if rest and not re.search(r"\b" + re.escape(rest[0]) + r"\b", repo.text(cand)):
                    bad(pos, f"`{tok}`: {rest[0]} not in {cand}")
                return
        if mod in repo.dirs and k == len(parts):
            return
    bad(pos, f"`{tok}`: no such module in the repository")


def docs_to_check(repo: Repo) -> list[str]:
    """README.md, docs/**/*.md, tests/system/README.md, bench/README.md. Under docs/results/
    only the notes written by hand (README.md files, and the index docs/results/*.md): the
    rest are reports a run wrote, kept as they came out (their charts were not all kept)."""
    def written(f: str) -> bool:
        if not f.startswith("docs/results/"):
            return True
        return f.endswith("/README.md") or f.count("/") == 2
    out = [f for f in repo.files if f.startswith("docs/") and f.endswith(".md") and written(f)]
    for f in ("README.md", "tests/system/README.md", "bench/README.md"):
        if f in repo.file_set:
            out.append(f)
    return sorted(set(out))


def check(repo: Repo) -> list[Problem]:
    problems: list[Problem] = []
    for doc in docs_to_check(repo):
        problems += check_doc(doc, repo.text(doc), repo)
    if MAP in repo.file_set:
        n = repo.text(MAP).count("\n")
        if n > MAP_MAX_LINES:
            problems.append(Problem(MAP, n, f"{n} lines: the map is at most {MAP_MAX_LINES}; move design into docs/design/"))
    else:
        problems.append(Problem(MAP, 0, "the map is missing"))
    return problems


def self_test() -> int:
    """The checks on a small repository made here: every kind of citation, good and dangling."""
    files = {
        "crates/vnet-core/src/forward.rs": "pub struct ForwardingTable;\nimpl ForwardingTable { pub fn decide() {} }\n",
        "crates/vnet-etcd/src/lease.rs": "fn keep_open() {}\n",
        "crates/vnet-etcd/tests/live.rs": "fn a_dropped_watch_ends() {}\nfn keepalives_leave_one_stream_open() {}\n",
        "vnetlab/__init__.py": "",
        "vnetlab/etcdlab.py": "def grpc_proxy_argv():\n    pass\n",
        "tests/system/test_etcd.py": "def test_join():\n    pass\n",
        "docs/design/reach.md": "# Reach\n\n## Words\n\n**The lasting watch starts at\netcd's head**\n",
        "docs/architecture.md": "# map\n",
        "scripts/bench.sh": "",
    }
    good = """# ok
`crates/vnet-core/src/forward.rs` and `forward.rs` and `src/forward.rs:12` and `crates/vnet-etcd/`,
[the note](design/reach.md), [a site](https://example.org/x.md), [here](#ok),
`ForwardingTable::decide`, `vnetlab.etcdlab.grpc_proxy_argv`, `test_join`, `scripts/bench.sh`,
`keep_open` in `lease.rs`; `a_dropped_watch_ends` and `keepalives_leave_one_stream_open` in
`crates/vnet-etcd/tests/live.rs`; `docs/design/reach.md`, "The lasting watch starts at etcd's head".
Not citations: `/etc/vnet/vnet.conf`, `/sys/fs/bpf`, `results/scale-*/summary.md`, `maps-HASH/`,
`host.json`, `OUT_DIR/fastpath.skel.rs`, `python3 -m bench.run --quick`, `--etcd`, `vnet:NAME`,
`results/system-tests.json`, `../shared/seeds/`, `linux/if_tun.h`, `rpc.proto`.
`tests/system/test_etcd.py::test_join`, `lease.rs:1`.
```
crates/gone.rs  `crates/gone.rs`
```
"""
    bad = """# dangling
`crates/vnet-core/src/gone.rs`
`gone.rs`
[the note](reach.md)
`ForwardingTable::vanished`
`vnetlab.etcdlab.gone`
`test_gone`
`missing_fn` in `lease.rs`
`docs/design/reach.md`, "A section that moved"
`vnetlab/wanlab.py`
`test_etcd.py::test_gone`
"""
    with tempfile.TemporaryDirectory() as root:
        for rel, body in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(body)
        repo = Repo(root, list(files))
        ok = check_doc("docs/good.md", good, repo)
        assert not ok, "false failures:\n" + "\n".join(map(str, ok))
        found = check_doc("docs/bad.md", bad, repo)
        lines = sorted(p.line for p in found)
        assert lines == list(range(2, 12)), "missed or extra:\n" + "\n".join(map(str, found))
        # The map's length.
        assert not check(repo)
        with open(os.path.join(root, MAP), "w") as f:
            f.write("x\n" * (MAP_MAX_LINES + 1))
        repo = Repo(root, list(files))
        assert any(p.file == MAP for p in check(repo)), "a long map passed"
        # A renamed file: the citation dangles.
        os.rename(os.path.join(root, "scripts/bench.sh"), os.path.join(root, "scripts/run.sh"))
        files2 = [f for f in files if f != "scripts/bench.sh"] + ["scripts/run.sh"]
        repo = Repo(root, files2)
        again = check_doc("docs/good.md", good, repo)
        assert [p.line for p in again] == [4], "a renamed file passed:\n" + "\n".join(map(str, again))
    print("check_docs self-test: ok")
    return 0


def main(argv: list[str]) -> int:
    if "--self-test" in argv:
        return self_test()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    repo = Repo(root)
    problems = check(repo)
    for p in problems:
        print(p)
    kinds = ", ".join(f"{n} {k}s" for k, n in sorted(CHECKED.items()))
    print(f"check_docs: {len(docs_to_check(repo))} files, {kinds} checked")
    if problems:
        print(f"check_docs: {len(problems)} dangling reference(s) or limits broken (above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
