"""Seeded input generators: every workload input is made here from (seed, size), never downloaded.

`generate_input(generator, seed, size, dest)` writes the input files into `dest` and returns
their names. The same (generator, seed, size) always writes the same bytes, so a replay of a
deterministic program on the same input is reproducible across machines and runners.

Generators (the meaning of `size` in brackets):
  sql             input.sql: tables, bulk inserts, indexes, mixed queries   [rows]
  python_script   workload.py: dicts, lists, strings, json, classes, sorts  [work units]
  c_file          gen.c: a large self-contained C file                      [functions]
  git_repo        repo.fi: a `git fast-import` stream with fixed dates      [commits]
  freeciv_script  script.serv: an AI-only autogame with fixed seeds         [turns]
  none            nothing; the command takes {seed} and {size} itself
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

_WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega heap arena chunk block slab page cache tree node leaf "
    "root list queue stack map set table index cursor pager btree vector string buffer"
).split()


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def gen_sql(seed: int, size: int, dest: Path) -> list[str]:
    """Bulk inserts in transactions, secondary indexes, then mixed queries, updates, deletes."""
    rng = random.Random(seed)
    n_users = max(10, size // 20)
    out: list[str] = [
        "PRAGMA journal_mode=OFF;",
        "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT, score REAL);",
        "CREATE TABLE items(id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, title TEXT, "
        "body TEXT, price REAL, qty INTEGER, tag TEXT);",
        "BEGIN;",
    ]
    countries = ["de", "fr", "jp", "br", "in", "us", "ng", "au", "ca", "kr"]
    for uid in range(1, n_users + 1):
        out.append(f"INSERT INTO users VALUES({uid},'{_words(rng, 1, 3)} {uid}',"
                   f"'{rng.choice(countries)}',{rng.random() * 100:.3f});")
    out.append("COMMIT;")
    for start in range(1, size + 1, 1000):
        out.append("BEGIN;")
        for iid in range(start, min(start + 1000, size + 1)):
            body = _words(rng, 3, 40)
            out.append(f"INSERT INTO items VALUES({iid},{rng.randint(1, n_users)},"
                       f"'{_words(rng, 1, 6)}','{body}',{rng.random() * 500:.2f},"
                       f"{rng.randint(0, 99)},'{rng.choice(_WORDS)}');")
        out.append("COMMIT;")
    out += [
        "CREATE INDEX items_user ON items(user_id);",
        "CREATE INDEX items_tag_price ON items(tag, price);",
        "CREATE INDEX users_country ON users(country);",
    ]
    # queries scan the tables: capped, or a large input spends its time in scans, not heap calls
    n_queries = max(20, min(size // 50, 300))
    for _ in range(n_queries):
        kind = rng.randrange(7)
        tag = rng.choice(_WORDS)
        uid = rng.randint(1, n_users)
        if kind == 0:
            out.append(f"SELECT u.country, count(*), avg(i.price) FROM items i JOIN users u "
                       f"ON u.id = i.user_id WHERE i.tag = '{tag}' GROUP BY u.country "
                       "ORDER BY 2 DESC;")
        elif kind == 1:
            out.append(f"SELECT title, length(body) FROM items WHERE user_id = {uid} "
                       "ORDER BY price LIMIT 20;")
        elif kind == 2:
            out.append(f"UPDATE items SET qty = qty + 1, body = body || ' {tag}' "
                       f"WHERE user_id = {uid};")
        elif kind == 3:
            out.append(f"SELECT tag, group_concat(title, '|') FROM items WHERE price < "
                       f"{rng.random() * 50:.2f} GROUP BY tag;")
        elif kind == 4:
            out.append(f"DELETE FROM items WHERE id % 97 = {rng.randrange(97)} AND tag = '{tag}';")
        elif kind == 5:
            out.append(f"SELECT upper(name), score FROM users WHERE name LIKE '%{tag}%' "
                       "ORDER BY score DESC LIMIT 10;")
        else:
            out.append("SELECT count(DISTINCT tag), sum(qty), max(length(body)) FROM items;")
    out.append("SELECT count(*) FROM items;")
    (dest / "input.sql").write_text("\n".join(out) + "\n")
    return ["input.sql"]


_PY_TEMPLATE = '''\
"""heapcast workload (generated, seed {seed}, size {size}): mixed object churn."""
import json
import random
import re
import sys
from collections import OrderedDict, defaultdict

SEED = {seed}
SIZE = {size}
rng = random.Random(SEED)
WORDS = {words!r}


class Record:
    __slots__ = ("key", "tags", "payload", "children")

    def __init__(self, key, tags, payload):
        self.key = key
        self.tags = tags
        self.payload = payload
        self.children = []


def phase_dicts(n):
    d = {{}}
    for i in range(n):
        k = "-".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) + str(i)
        d[k] = [rng.random() for _ in range(rng.randint(0, 8))]
        if i % 7 == 0 and d:
            d.pop(next(iter(d)))
    return len(d)


def phase_strings(n):
    parts = []
    for i in range(n):
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30)))
        parts.append(s.upper() if i % 3 else s[::-1])
        if len(parts) > 200:
            parts = [",".join(parts[:50])]
    pat = re.compile(r"(\\w+) (\\w+)")
    return sum(len(pat.findall(p)) for p in parts)


def phase_json(n):
    total = 0
    for i in range(n // 10 + 1):
        doc = {{"id": i, "words": [rng.choice(WORDS) for _ in range(rng.randint(1, 40))],
               "nested": {{str(j): rng.random() for j in range(rng.randint(0, 12))}}}}
        text = json.dumps(doc, sort_keys=True)
        total += len(json.loads(text)["words"])
    return total


def phase_objects(n):
    roots = []
    for i in range(n):
        r = Record(i, {{rng.choice(WORDS) for _ in range(rng.randint(0, 5))}},
                   bytearray(rng.randint(1, 600)))
        if roots and rng.random() < 0.6:
            rng.choice(roots).children.append(r)
        else:
            roots.append(r)
        if len(roots) > 500:
            del roots[: rng.randint(1, 250)]
    return len(roots)


def phase_sort(n):
    rows = [(rng.choice(WORDS), rng.randint(0, 1000), str(rng.random())) for _ in range(n)]
    rows.sort(key=lambda r: (r[0], -r[1]))
    groups = defaultdict(list)
    for w, k, s in rows:
        groups[w].append(k)
    lru = OrderedDict()
    for w, k, s in rows:
        lru[s] = k
        if len(lru) > 300:
            lru.popitem(last=False)
    return sum(len(v) for v in groups.values())


PHASES = {phases!r}
FUNCS = {{"dicts": phase_dicts, "strings": phase_strings, "json": phase_json,
         "objects": phase_objects, "sort": phase_sort}}
result = 0
for round_ in range({rounds}):
    for name in PHASES:
        result += FUNCS[name](SIZE // {rounds} + 1)
print("heapcast python workload done", result)
sys.exit(0)
'''


def gen_python_script(seed: int, size: int, dest: Path) -> list[str]:
    rng = random.Random(seed)
    phases = ["dicts", "strings", "json", "objects", "sort"]
    rng.shuffle(phases)
    text = _PY_TEMPLATE.format(seed=seed, size=size, words=_WORDS[:40], phases=phases,
                               rounds=rng.randint(2, 4))
    (dest / "workload.py").write_text(text)
    return ["workload.py"]


def gen_c_file(seed: int, size: int, dest: Path) -> list[str]:
    """`size` functions over structs, loops, switches and arithmetic; no #include needed."""
    rng = random.Random(seed)
    out = ["typedef unsigned long u64;",
           "struct node { u64 key; long val; struct node *next; double w[4]; };", ""]
    ops = ["+", "-", "*", "^", "|", "&"]

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(["a", "b", "c", "i", str(rng.randint(1, 999)), "n->key", "n->val"])
        return f"({expr(depth - 1)} {rng.choice(ops)} {expr(depth - 1)})"

    for f in range(size):
        out.append(f"long f{f}(struct node *n, long a, long b) {{")
        out.append("  long c = a; long i;")
        for s in range(rng.randint(2, 8)):
            kind = rng.randrange(4)
            if kind == 0:
                out.append(f"  for (i = 0; i < {rng.randint(2, 64)}; i++) {{ c += {expr(3)}; "
                           f"n->w[i & 3] += (double)c / {rng.randint(2, 9)}.0; }}")
            elif kind == 1:
                out.append(f"  switch ((a + {s}) & 7) {{")
                for case in range(rng.randint(2, 8)):
                    out.append(f"    case {case}: c = {expr(2)}; break;")
                out.append(f"    default: c ^= {expr(2)};")
                out.append("  }")
            elif kind == 2:
                out.append(f"  if ({expr(2)} > {expr(2)}) b = {expr(3)}; else a = {expr(3)};")
            else:
                out.append(f"  while (n && n->key != (u64)c) {{ c += n->val; n = n->next; }}")
                out.append("  if (!n) return c;")
        if f and rng.random() < 0.5:
            out.append(f"  c += f{rng.randrange(f)}(n, b, c);")
        out.append(f"  return c + {expr(2)};")
        out.append("}")
    out.append("long entry(struct node *n) { long s = 0;")
    for f in range(0, size, max(1, size // 50)):
        out.append(f"  s += f{f}(n, s, {f});")
    out.append("  return s; }")
    (dest / "gen.c").write_text("\n".join(out) + "\n")
    return ["gen.c"]


def gen_git_repo(seed: int, size: int, dest: Path) -> list[str]:
    """A fast-import stream: `size` commits editing text files, fixed authors and dates."""
    rng = random.Random(seed)
    n_files = max(4, size // 10)
    files: dict[str, list[str]] = {
        f"src/mod{i:03d}.txt": [_words(rng, 3, 12) for _ in range(rng.randint(20, 80))]
        for i in range(n_files)}
    authors = ["Ada <ada@example.org>", "Brian <bk@example.org>", "Grace <grace@example.org>",
               "Linus <lt@example.org>", "Margaret <mh@example.org>"]
    chunks: list[bytes] = []
    t0 = 1_600_000_000
    for c in range(1, size + 1):
        touched = rng.sample(sorted(files), k=min(len(files), rng.randint(1, 4)))
        for path in touched:
            lines = files[path]
            for _ in range(rng.randint(1, 6)):
                op = rng.randrange(3)
                pos = rng.randrange(len(lines) + 1)
                if op == 0 or len(lines) < 5:
                    lines.insert(pos, _words(rng, 3, 12))
                elif op == 1:
                    lines[min(pos, len(lines) - 1)] = _words(rng, 3, 12)
                else:
                    del lines[min(pos, len(lines) - 1)]
        author = rng.choice(authors)
        when = t0 + c * 3600
        msg = f"commit {c}: {_words(rng, 2, 8)}\n".encode()
        chunks.append(b"commit refs/heads/main\n")
        chunks.append(f"mark :{c}\n".encode())
        chunks.append(f"author {author} {when} +0000\n".encode())
        chunks.append(f"committer {author} {when} +0000\n".encode())
        chunks.append(f"data {len(msg)}\n".encode() + msg)
        if c > 1:
            chunks.append(f"from :{c - 1}\n".encode())
        for path in (sorted(files) if c == 1 else touched):
            body = ("\n".join(files[path]) + "\n").encode()
            chunks.append(f"M 100644 inline {path}\ndata {len(body)}\n".encode() + body)
        chunks.append(b"\n")
    (dest / "repo.fi").write_bytes(b"".join(chunks))
    # the files `git blame` looks at: the most edited ones are as good as any
    (dest / "blame.list").write_text("\n".join(sorted(files)[:3]) + "\n")
    return ["repo.fi", "blame.list"]


def gen_freeciv_script(seed: int, size: int, dest: Path) -> list[str]:
    """An AI-only autogame of `size` turns: fixed game and map seeds, a small map."""
    rng = random.Random(seed)
    players = rng.randint(4, 7)
    lines = [
        f"set gameseed {seed * 7919 + 1}",
        f"set mapseed {seed * 104729 + 3}",
        "set timeout -1",
        "set minplayers 0",
        f"set aifill {players}",
        f"set endturn {size}",
        "set mapsize FULLSIZE",
        "set size 2",
        "set autosaves \"\"",
        "hard",
        "start",
    ]
    (dest / "script.serv").write_text("\n".join(lines) + "\n")
    return ["script.serv"]


def gen_none(seed: int, size: int, dest: Path) -> list[str]:
    return []


GENERATORS: dict[str, Callable[[int, int, Path], list[str]]] = {
    "none": gen_none,
    "sql": gen_sql,
    "python_script": gen_python_script,
    "c_file": gen_c_file,
    "git_repo": gen_git_repo,
    "freeciv_script": gen_freeciv_script,
}


def generate_input(generator: str, seed: int, size: int, dest: str | Path) -> list[str]:
    """Write the input files of (generator, seed, size) into `dest`; returns their names."""
    try:
        gen = GENERATORS[generator]
    except KeyError:
        raise ValueError(f"unknown input generator {generator!r}; known: "
                         f"{', '.join(sorted(GENERATORS))}") from None
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    return gen(seed, size, dest)
