"""Seeded input generators: every workload input is made here from (seed, size), never downloaded.

`generate_input(generator, seed, size, dest)` writes the input files into `dest` and returns
their names; the same (generator, seed, size) always writes the same bytes (reproducible replays).
`GENERATORS` maps each generator's name to its function; what each writes and what its `size`
counts: docs/tracing.md#the-inputs-generators.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

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
        out.append(
            f"INSERT INTO users VALUES({uid},'{_words(rng, 1, 3)} {uid}',"
            f"'{rng.choice(countries)}',{rng.random() * 100:.3f});"
        )
    out.append("COMMIT;")
    for start in range(1, size + 1, 1000):
        out.append("BEGIN;")
        for iid in range(start, min(start + 1000, size + 1)):
            body = _words(rng, 3, 40)
            out.append(
                f"INSERT INTO items VALUES({iid},{rng.randint(1, n_users)},"
                f"'{_words(rng, 1, 6)}','{body}',{rng.random() * 500:.2f},"
                f"{rng.randint(0, 99)},'{rng.choice(_WORDS)}');"
            )
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
            out.append(
                f"SELECT u.country, count(*), avg(i.price) FROM items i JOIN users u "
                f"ON u.id = i.user_id WHERE i.tag = '{tag}' GROUP BY u.country "
                "ORDER BY 2 DESC;"
            )
        elif kind == 1:
            out.append(
                f"SELECT title, length(body) FROM items WHERE user_id = {uid} "
                "ORDER BY price LIMIT 20;"
            )
        elif kind == 2:
            out.append(
                f"UPDATE items SET qty = qty + 1, body = body || ' {tag}' WHERE user_id = {uid};"
            )
        elif kind == 3:
            out.append(
                f"SELECT tag, group_concat(title, '|') FROM items WHERE price < "
                f"{rng.random() * 50:.2f} GROUP BY tag;"
            )
        elif kind == 4:
            out.append(f"DELETE FROM items WHERE id % 97 = {rng.randrange(97)} AND tag = '{tag}';")
        elif kind == 5:
            out.append(
                f"SELECT upper(name), score FROM users WHERE name LIKE '%{tag}%' "
                "ORDER BY score DESC LIMIT 10;"
            )
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
    text = _PY_TEMPLATE.format(
        seed=seed, size=size, words=_WORDS[:40], phases=phases, rounds=rng.randint(2, 4)
    )
    (dest / "workload.py").write_text(text)
    return ["workload.py"]


_C_OPS = ["+", "-", "*", "^", "|", "&"]


def _c_switch(rng: random.Random, s: int, expr: Callable[[int], str], most_cases: int) -> list[str]:
    """A switch of 2 to `most_cases` random cases and a default, on statement s's value."""
    out = [f"  switch ((a + {s}) & 7) {{"]
    for case in range(rng.randint(2, most_cases)):
        out.append(f"    case {case}: c = {expr(2)}; break;")
    out.append(f"    default: c ^= {expr(2)};")
    out.append("  }")
    return out


def _c_branch(expr: Callable[[int], str]) -> str:
    """A random if/else that changes a or b."""
    return f"  if ({expr(2)} > {expr(2)}) b = {expr(3)}; else a = {expr(3)};"


def gen_c_file(seed: int, size: int, dest: Path) -> list[str]:
    """`size` functions over structs, loops, switches and arithmetic; no #include needed."""
    rng = random.Random(seed)
    out = [
        "typedef unsigned long u64;",
        "struct node { u64 key; long val; struct node *next; double w[4]; };",
        "",
    ]

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(["a", "b", "c", "i", str(rng.randint(1, 999)), "n->key", "n->val"])
        return f"({expr(depth - 1)} {rng.choice(_C_OPS)} {expr(depth - 1)})"

    for f in range(size):
        out.append(f"long f{f}(struct node *n, long a, long b) {{")
        out.append("  long c = a; long i;")
        for s in range(rng.randint(2, 8)):
            kind = rng.randrange(4)
            if kind == 0:
                out.append(
                    f"  for (i = 0; i < {rng.randint(2, 64)}; i++) {{ c += {expr(3)}; "
                    f"n->w[i & 3] += (double)c / {rng.randint(2, 9)}.0; }}"
                )
            elif kind == 1:
                out += _c_switch(rng, s, expr, 8)
            elif kind == 2:
                out.append(_c_branch(expr))
            else:
                out.append("  while (n && n->key != (u64)c) { c += n->val; n = n->next; }")
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
        for i in range(n_files)
    }
    authors = [
        "Ada <ada@example.org>",
        "Brian <bk@example.org>",
        "Grace <grace@example.org>",
        "Linus <lt@example.org>",
        "Margaret <mh@example.org>",
    ]
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
        for path in sorted(files) if c == 1 else touched:
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
        'set autosaves ""',
        "hard",
        "start",
    ]
    (dest / "script.serv").write_text("\n".join(lines) + "\n")
    return ["script.serv"]


_C_LIBC_HEADERS = ["<stdio.h>", "<stdlib.h>", "<string.h>", "<stdint.h>", "<ctype.h>"]
# the utility module every generated module calls: a mixer, and a list pushed and dropped
_C_UTIL = [
    "#include <stdlib.h>",
    "#include <string.h>",
    '#include "common.h"',
    "u64 util_mix(u64 a, u64 b) { a ^= b + 0x9e3779b97f4a7c15UL + (a << 6) + (a >> 2); return a; }",
    "struct node *util_push(struct node *head, u64 key, u64 val) {",
    "  struct node *n = malloc(sizeof *n);",
    "  if (!n) abort();",
    "  n->key = key; n->val = val; n->next = head;",
    '  memcpy(n->tag, "heapcast-node", 14);',
    "  return n;",
    "}",
    "u64 util_drop(struct node *head) {",
    "  u64 s = 0;",
    "  while (head) { struct node *next = head->next; s += head->key ^ head->val;"
    " free(head); head = next; }",
    "  return s;",
    "}",
]


def _c_expr(rng: random.Random, depth: int) -> str:
    """A random C expression over a, b, c and the node's fields, `depth` operators deep at most."""
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(["a", "b", "c", "n->key", "n->val", f"{rng.randint(1, 999)}UL"])
    return f"({_c_expr(rng, depth - 1)} {rng.choice(_C_OPS)} {_c_expr(rng, depth - 1)})"


def _c_common_header(size: int) -> list[str]:
    """common.h: the node and table types, the utility functions and every module's entry."""
    common = [
        "#ifndef GEN_COMMON_H",
        "#define GEN_COMMON_H",
        "typedef unsigned long u64;",
        "struct node { u64 key; u64 val; struct node *next; char tag[16]; };",
        "struct table { struct node **slots; unsigned n_slots; unsigned count; };",
        "u64 util_mix(u64 a, u64 b);",
        "struct node *util_push(struct node *head, u64 key, u64 val);",
        "u64 util_drop(struct node *head);",
    ]
    common += [f"u64 mod{m:03d}_run(u64 x);" for m in range(size)]
    common.append("#endif")
    return common


def _c_function(rng: random.Random, m: int, f: int) -> list[str]:
    """Static function f of module m: random loops, switches, branches and mixes; each one
    after the first calls the one before it."""
    expr = lambda depth: _c_expr(rng, depth)  # noqa: E731
    out = [f"static u64 m{m}_f{f}(struct node *n, u64 a, u64 b) {{"]
    body = []
    for s in range(rng.randint(2, 6)):
        kind = rng.randrange(4)
        if kind == 0:
            body.append(f"  for (i = 0; i < {rng.randint(2, 40)}U; i++) c += {expr(3)} + i;")
        elif kind == 1:
            body += _c_switch(rng, s, expr, 6)
        elif kind == 2:
            body.append(_c_branch(expr))
        else:
            body.append(f"  c = util_mix(c, {expr(2)});")
    loops = any(line.startswith("  for") for line in body)
    out.append("  u64 c = a;" + (" unsigned i;" if loops else ""))
    out += body
    if f:  # a chain: every static function is used
        out.append(f"  c += m{m}_f{f - 1}(n, b, c);")
    out.append(f"  return c + {expr(2)};")
    out.append("}")
    return out


def _c_module(rng: random.Random, seed: int, m: int) -> list[str]:
    """Module m: a few of libc's headers, a chain of static functions, and its entry, which
    pushes nodes onto a list and drops it."""
    out = [f"/* module {m} (generated, seed {seed}) */"]
    for h in rng.sample(_C_LIBC_HEADERS, k=rng.randint(0, 3)):
        out.append(f"#include {h}")
    out.append('#include "common.h"')
    n_funcs = rng.randint(2, 6)
    for f in range(n_funcs):
        out += _c_function(rng, m, f)
    out.append(f"u64 mod{m:03d}_run(u64 x) {{")
    out.append("  struct node *head = 0; unsigned i; u64 s = x;")
    out.append(f"  for (i = 0; i < {rng.randint(4, 64)}U; i++) {{")
    out.append("    head = util_push(head, s, i);")
    out.append(f"    s = m{m}_f{n_funcs - 1}(head, s, i);")
    out.append("  }")
    out.append("  return s ^ util_drop(head);")
    out.append("}")
    return out


def _c_makefile(seed: int, size: int) -> list[str]:
    """The Makefile: each module compiled into obj/, archived, linked, the program run once."""
    objs = " ".join(f"obj/mod{m:03d}.o" for m in range(size))
    # one rule per object (no wildcard: the order of every list is fixed by the input);
    # -pipe: no temporary .s files; -frandom-seed: gcc's own randomness fixed per file;
    # gcc-ar: ar with gcc's LTO plugin named, so it does not load every plugin in
    # /usr/lib/bfd-plugins (LLVM's gold plugin there adds thousands of calls on some hosts)
    return [
        f"# generated, seed {seed}: {size} modules",
        "CC = gcc",
        "AR = gcc-ar",
        "CFLAGS = -O2 -pipe -Wall",
        f"LIBOBJS = obj/util.o {objs}",
        "all: check.txt",
        "check.txt: prog",
        "\t./prog > check.txt",
        "prog: obj/main.o libgen.a",
        "\t$(CC) -o $@ obj/main.o libgen.a",
        "libgen.a: $(LIBOBJS)",
        "\t$(AR) rcs $@ $(LIBOBJS)",
        "obj/%.o: %.c common.h | obj",
        "\t$(CC) $(CFLAGS) -frandom-seed=$< -c $< -o $@",
        "obj:",
        "\tmkdir -p obj",
        ".PHONY: all",
    ]


def gen_c_project(seed: int, size: int, dest: Path) -> list[str]:
    """A C project for `make -j2`: `size` small modules (some including libc's headers), a
    shared header, a utility module, a main, and a Makefile that compiles each module into obj/,
    archives them with ar, links the program and runs it once. All files in one flat folder
    (the runner makes each input file read-only 0644: a subfolder could not be entered)."""
    rng = random.Random(seed)
    (dest / "common.h").write_text("\n".join(_c_common_header(size)) + "\n")
    (dest / "util.c").write_text("\n".join(_C_UTIL) + "\n")
    for m in range(size):
        (dest / f"mod{m:03d}.c").write_text("\n".join(_c_module(rng, seed, m)) + "\n")
    main = ["#include <stdio.h>", '#include "common.h"', "int main(void) {", "  u64 s = 1;"]
    main += [f"  s = util_mix(s, mod{m:03d}_run(s));" for m in range(size)]
    main += ['  printf("heapcast c project %lu\\n", s);', "  return 0;", "}"]
    (dest / "main.c").write_text("\n".join(main) + "\n")
    (dest / "Makefile").write_text("\n".join(_c_makefile(seed, size)) + "\n")
    return ["Makefile", "common.h", "util.c", "main.c"] + [f"mod{m:03d}.c" for m in range(size)]


_PERL_TEMPLATE = r"""# heapcast workload (generated, seed __SEED__, size __SIZE__):
# hashes, arrays, strings, sorts, joins.
use strict;
use warnings;

my $SEED = __SEED__;
my $SIZE = __SIZE__;
srand($SEED);
my @WORDS = qw(__WORDS__);

sub word { return $WORDS[int(rand(@WORDS))]; }
sub words {
    my ($lo, $hi) = @_;
    return join(" ", map { word() } 1 .. $lo + int(rand($hi - $lo + 1)));
}

sub phase_hashes {
    my ($n) = @_;
    my %h;
    my %count;
    for my $i (1 .. $n) {
        my $k = join("-", map { word() } 1 .. 1 + int(rand(4))) . $i;
        $h{$k} = { id => $i, tags => [ map { word() } 0 .. int(rand(6)) ], score => rand(100) };
        $count{$_}++ for @{ $h{$k}{tags} };
        if ($i % 7 == 0) {
            my @ks = sort keys %h;
            delete @h{ @ks[0 .. int(@ks / 3)] };
        }
    }
    my $total = 0;
    while (my ($k, $v) = each %h) { $total += scalar @{ $v->{tags} }; }
    return $total + scalar(keys %count);
}

sub phase_strings {
    my ($n) = @_;
    my @parts;
    my $acc = "";
    for my $i (1 .. $n) {
        my $s = words(2, 30);
        $s = $i % 3 ? uc($s) : scalar reverse($s);
        $s =~ s/(\w+) (\w+)/$2:$1/g;
        push @parts, sprintf("%05d|%s|%.3f", $i, $s, rand());
        $acc .= substr($s, 0, 1 + int(rand(length($s))));
        if (@parts > 200) { @parts = (join(",", splice(@parts, 0, 50)), @parts); }
        if (length($acc) > 4096) {
            $acc = join("", reverse split(/ /, $acc));
            $acc = substr($acc, 0, 512);
        }
    }
    my $matches = 0;
    for my $p (@parts) { my @m = ($p =~ /(\w+):(\w+)/g); $matches += @m; }
    return $matches + length($acc);
}

sub phase_arrays {
    my ($n) = @_;
    my @q;
    my @grid;
    for my $i (1 .. $n) {
        push @q, [ $i, word(), int(rand(1000)) ];
        unshift @q, [ -$i, word() ] if $i % 5 == 0;
        shift @q if @q > 300;
        pop @q if $i % 11 == 0;
        if ($i % 13 == 0 && @q > 10) {
            splice(@q, int(rand(@q - 5)), 3, map { [ $_, word() ] } 1 .. 4);
        }
        push @{ $grid[$i % 17] }, $i * 2 if $i % 2;
    }
    my @flat = map { @$_ } grep { defined } @grid;
    return scalar(@q) + scalar(@flat);
}

sub phase_sort {
    my ($n) = @_;
    my @rows = map { [ word(), int(rand(1000)), sprintf("%.6f", rand()) ] } 1 .. $n;
    my @sorted = sort { $a->[0] cmp $b->[0] or $b->[1] <=> $a->[1] } @rows;
    # the Schwartzian transform: decorate, sort, undecorate
    my @by_len = map { $_->[1] } sort { $a->[0] <=> $b->[0] or $a->[1] cmp $b->[1] }
                 map { [ length($_->[2] . $_->[0]), join("/", @$_) ] } @rows;
    my %groups;
    push @{ $groups{ $_->[0] } }, $_->[1] for @sorted;
    my @keys = sort { scalar(@{ $groups{$b} }) <=> scalar(@{ $groups{$a} }) or $a cmp $b }
               keys %groups;
    my @nums = sort { $a <=> $b } map { $_->[1] } @rows;
    return scalar(@by_len) + scalar(@keys) + ($nums[-1] // 0);
}

sub phase_join {
    my ($n) = @_;
    my (%users, %orders);
    my $n_users = 1 + int($n / 10);
    for my $u (1 .. $n_users) {
        $users{$u} = { name => words(1, 3) . " $u", country => word() };
    }
    for my $o (1 .. $n) {
        my $u = 1 + int(rand($n_users));
        push @{ $orders{$u} }, { id => $o, item => words(1, 5), price => int(rand(50000)) / 100 };
    }
    my %by_country;
    for my $u (sort { $a <=> $b } keys %orders) {
        my $c = $users{$u}{country};
        for my $o (@{ $orders{$u} }) {
            $by_country{$c}{total} += $o->{price};
            push @{ $by_country{$c}{lines} }, join("\t", $users{$u}{name}, $o->{id}, $o->{item});
        }
    }
    my $out = "";
    for my $c (sort keys %by_country) {
        my $lines = $by_country{$c}{lines};
        $out .= sprintf("%s %.2f %d\n", $c, $by_country{$c}{total}, scalar @$lines);
        $out .= join("\n", (sort @$lines)[0 .. 2]) . "\n" if @$lines > 2;
    }
    return length($out);
}

package Node;
sub new { my ($class, %a) = @_; return bless { %a, children => [] }, $class; }
sub add { my ($self, $c) = @_; push @{ $self->{children} }, $c; return $c; }
sub weight {
    my ($self) = @_;
    my $w = length($self->{label});
    $w += $_->weight() for @{ $self->{children} };
    return $w;
}
package main;

sub phase_objects {
    my ($n) = @_;
    my @roots;
    my $sum = 0;
    for my $i (1 .. $n) {
        my $node = Node->new(key => $i, label => words(1, 4),
                             payload => "x" x (1 + int(rand(600))));
        if (@roots && rand() < 0.6) { $roots[int(rand(@roots))]->add($node); }
        else { push @roots, $node; }
        if (@roots > 200) {
            my @gone = splice(@roots, 0, 1 + int(rand(100)));
            $sum += $_->weight() for @gone;
        }
    }
    my @closures = map { my $k = $_; sub { return $k * $_[0] } } 1 .. 50;
    $sum += $_->(3) for @closures;
    return $sum;
}

my %FUNCS = (hashes => \&phase_hashes, strings => \&phase_strings, arrays => \&phase_arrays,
             sort => \&phase_sort, join => \&phase_join, objects => \&phase_objects);
my @PHASES = qw(__PHASES__);
my $ROUNDS = __ROUNDS__;
my $result = 0;
for my $round (1 .. $ROUNDS) {
    for my $name (@PHASES) {
        $result += $FUNCS{$name}->(int($SIZE / $ROUNDS) + 1);
    }
}
printf("heapcast perl workload done %d\n", $result);
exit 0;
"""


def gen_perl_script(seed: int, size: int, dest: Path) -> list[str]:
    """Perl 5: hashes of records, string building and regexes, array churn, sorts (the
    Schwartzian transform), a hash join with group-by, blessed trees and closures."""
    rng = random.Random(seed)
    phases = ["hashes", "strings", "arrays", "sort", "join", "objects"]
    rng.shuffle(phases)
    fill = {
        "__SEED__": str(seed),
        "__SIZE__": str(size),
        "__WORDS__": " ".join(_WORDS[:40]),
        "__PHASES__": " ".join(phases),
        "__ROUNDS__": str(rng.randint(2, 4)),
    }
    text = _PERL_TEMPLATE
    for key, value in fill.items():
        text = text.replace(key, value)
    (dest / "workload.pl").write_text(text)
    return ["workload.pl"]


# How every numpy workload imports numpy: from its folder (argv[1], else Debian's), not through
# sys.path, so that the host and an image with other dist-packages run the same code.
_NUMPY_FROM_ITS_FOLDER = """\
NUMPY_DIR = sys.argv[1] if len(sys.argv) > 1 else {numpy_dir!r}
_spec = importlib.util.spec_from_file_location(
    "numpy", NUMPY_DIR + "/__init__.py", submodule_search_locations=[NUMPY_DIR]
)
np = importlib.util.module_from_spec(_spec)
sys.modules["numpy"] = np
_spec.loader.exec_module(np)
"""


def _numpy_workload(dest: Path, template: str, **fields: object) -> list[str]:
    """workload.py from one of the numpy templates (numpy imported from Debian's folder)."""
    (dest / "workload.py").write_text(template.format(numpy_dir=DEBIAN_NUMPY_DIR, **fields))
    return ["workload.py"]


_NUMPY_TEMPLATE = (
    '''\
"""heapcast workload (generated, seed {seed}, size {size}): Debian's numpy, every object on malloc.

numpy is imported from its own folder (argv[1], else Debian's), not through sys.path: run with
-S (no site module), sys.path holds only the standard library, so the host and an image with
different dist-packages run the same code (an optional import numpy tries fails the same way).
"""
import importlib.util
import random
import secrets
import sys

SEED = {seed}
SIZE = {size}
# numpy.random seeds its global legacy RandomState at import with secrets.randbits (the OS's
# entropy), whose Python ints are 28 or 32 bytes as the drawn value falls: seeded here instead
secrets.randbits = random.Random(SEED).getrandbits

'''
    + _NUMPY_FROM_ITS_FOLDER
    + """
rng = np.random.default_rng(SEED)
WORDS = np.array({words!r})


def phase_create(n):
    total = 0.0
    for i in range(n):
        k = 4 + i % 60
        a = np.arange(k * 3, dtype=np.float64)
        b = np.zeros((k, 3)) + np.ones((k, 3)) * i
        c = np.linspace(0.0, 1.0, k)
        d = rng.random(k) + rng.integers(0, 100, size=k)
        e = np.array([[j, j * 2.5, -j] for j in range(k % 9 + 1)])
        f = np.full((2, k), 7, dtype=np.int32)
        total += a.sum() + b[-1, 0] + c[-1] + d.mean() + e.size + f.sum()
    return total


def phase_reshape(n):
    total = 0
    for i in range(n):
        k = 2 + i % 12
        a = np.arange(k * k * 4).reshape(k, k, 4)
        b = a.transpose(2, 0, 1).reshape(4, -1)
        c = np.concatenate([b, b[::-1]], axis=1)
        d = np.stack([c[0], c[-1]]).ravel()
        parts = np.array_split(d, 3)
        mask = d % 3 == 0
        e = np.where(mask, d, -d)[mask.nonzero()[0][:5]]
        f = a[..., None] * np.arange(3)
        total += int(e.sum()) + len(parts) + f.shape[-1] + int(d[rng.integers(0, d.size, 4)].sum())
    return total


def phase_reduce(n):
    total = 0.0
    for i in range(n):
        k = 8 + i % 40
        a = rng.normal(size=(k, 6))
        total += float(a.sum(axis=0).max() + a.mean(axis=1).min() + a.std())
        total += float(np.cumsum(a, axis=0)[-1].sum() + np.abs(a).max())
        labels = rng.integers(0, 8, size=k)
        counts = np.bincount(labels, minlength=8)
        uniq, inv = np.unique(labels, return_inverse=True)
        hist, _ = np.histogram(a[:, 0], bins=5)
        total += float(counts.argmax() + uniq.size + inv.sum() + hist.sum())
    return total


def phase_sort(n):
    total = 0
    for i in range(n):
        k = 16 + i % 200
        a = rng.integers(0, 1000, size=k)
        s = np.sort(a)
        order = np.argsort(a, kind="stable")
        keys = np.lexsort((a, a % 7))
        part = np.partition(a, k // 2)[k // 2]
        pos = np.searchsorted(s, [100, 500, 900])
        w = WORDS[a % len(WORDS)]
        ws = np.sort(w)
        total += int(s[0] + order[0] + keys[-1] + part + pos.sum()) + len(ws[0])
    return total


def phase_linalg(n):
    total = 0.0
    for i in range(n):
        k = 3 + i % 10
        m = rng.normal(size=(k, k)) + np.eye(k) * k
        v = rng.normal(size=k)
        x = np.linalg.solve(m, v)
        inv = np.linalg.inv(m)
        q, r = np.linalg.qr(m)
        sv = np.linalg.svd(m, compute_uv=False)
        w = np.linalg.eigvalsh(m @ m.T)
        total += float(x.sum() + inv.trace() + abs(r[0, 0]) + sv[0] + w[-1] + np.linalg.det(m))
        total += float(np.einsum("ij,j->i", m, v).sum() + np.dot(v, v) + np.outer(v, v).sum())
    return total


def phase_text(n):
    total = 0
    for i in range(n // 4 + 1):
        a = rng.random((3 + i % 5, 4)).round(3)
        total += len(str(a)) + len(repr(a.tolist())) + len(np.array2string(a, precision=2))
        total += len(",".join(str(x) for x in a.ravel()[:8]))
        b = np.array(" ".join(str(j) for j in range(i % 30 + 1)).split(), dtype=np.int64)
        total += int(b.sum())
    return total


PHASES = {phases!r}
FUNCS = {{"create": phase_create, "reshape": phase_reshape, "reduce": phase_reduce,
         "sort": phase_sort, "linalg": phase_linalg, "text": phase_text}}
result = 0.0
for round_ in range({rounds}):
    for name in PHASES:
        result += FUNCS[name](SIZE // {rounds} + 1)
print("heapcast numpy workload done", round(float(result), 3), np.__version__)
sys.exit(0)
"""
)

# Debian's python3-numpy (1.24): the same path on the host and in the image
DEBIAN_NUMPY_DIR = "/usr/lib/python3/dist-packages/numpy"


def gen_numpy_script(seed: int, size: int, dest: Path) -> list[str]:
    """numpy on CPython: array creation, reshapes and fancy indexing, reductions, sorting, small
    linear algebra (LAPACK), array printing; numpy imported from its folder (see the script)."""
    rng = random.Random(seed)
    phases = ["create", "reshape", "reduce", "sort", "linalg", "text"]
    rng.shuffle(phases)
    text = _NUMPY_TEMPLATE.format(
        seed=seed,
        size=size,
        words=_WORDS[:40],
        phases=phases,
        rounds=rng.randint(2, 4),
        numpy_dir=DEBIAN_NUMPY_DIR,
    )
    (dest / "workload.py").write_text(text)
    return ["workload.py"]


_NUMPY_TEMPORARIES_TEMPLATE = (
    '''\
"""heapcast workload (generated, seed {seed}, size {size}): seed 002's case, numpy paying page
faults for its large temporaries: `(a * b) ** 2 + 3` on two float arrays of {size} thousand
elements, {iterations} times. Each temporary is above glibc's mmap threshold, so glibc maps and
unmaps (and the kernel zero-fills) every one of them on every iteration; an allocator that keeps
them pays once. numpy imported from its folder, as in the numpy_stack workload.
"""
import importlib.util
import sys

'''
    + _NUMPY_FROM_ITS_FOLDER
    + """
n = {size} * 1000
a = np.arange(n, dtype=np.float64)
b = np.full(n, {factor!r})
total = 0.0
for i in range({iterations}):
    c = (a * b) ** 2 + 3
    total += float(c[(i * 7919) % n])
print("heapcast numpy temporaries done", round(total, 3))
sys.exit(0)
"""
)


def gen_numpy_temporaries(seed: int, size: int, dest: Path) -> list[str]:
    """Seed 002's case: large numpy temporaries allocated and freed every iteration (size:
    thousands of elements per array)."""
    rng = random.Random(seed)
    return _numpy_workload(
        dest,
        _NUMPY_TEMPORARIES_TEMPLATE,
        seed=seed,
        size=size,
        iterations=30,
        factor=round(1.0 + rng.random(), 3),
    )


def gen_none(seed: int, size: int, dest: Path) -> list[str]:
    return []


GENERATORS: dict[str, Callable[[int, int, Path], list[str]]] = {
    "none": gen_none,
    "sql": gen_sql,
    "python_script": gen_python_script,
    "c_file": gen_c_file,
    "git_repo": gen_git_repo,
    "freeciv_script": gen_freeciv_script,
    "perl_script": gen_perl_script,
    "c_project": gen_c_project,
    "numpy_script": gen_numpy_script,
    "numpy_temporaries": gen_numpy_temporaries,
}


def generate_input(generator: str, seed: int, size: int, dest: str | Path) -> list[str]:
    """Write the input files of (generator, seed, size) into `dest`; returns their names."""
    try:
        gen = GENERATORS[generator]
    except KeyError:
        raise ValueError(
            f"unknown input generator {generator!r}; known: {', '.join(sorted(GENERATORS))}"
        ) from None
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    return gen(seed, size, dest)


def prepare_input_dir(generator: str, seed: int, size: int, scratch: Path) -> Path:
    """The input of (generator, seed, size) in `<scratch>/input`, readable by the sandbox's
    user (nobody), a program kept executable; for measured runs (allocators, the layer)."""
    input_dir = scratch / "input"
    input_dir.mkdir()
    files = generate_input(generator, seed, size, input_dir)
    for d in (scratch, input_dir):
        d.chmod(0o755)
    for f in files:
        path = input_dir / f
        path.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)
    return input_dir


# Workloads where the choice of allocator matters (issue 22); registered below, after the others.
#   keras_gru          train.py: a small Keras GRU trained on token windows    [windows]
#   keras_video        train.py: a small Keras video classifier, batches decoded [steps]

# What both Keras workloads start with: TensorFlow on the CPU, quiet, seeded, deterministic ops.
_KERAS_PREAMBLE = """\
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the CPU alone, same on any host

import numpy as np
import keras
import tensorflow as tf

SEED = {seed}
keras.utils.set_random_seed(SEED)
tf.config.experimental.enable_op_determinism()

rng = np.random.default_rng(SEED)
"""

_KERAS_GRU_TEMPLATE = (
    '''\
"""heapcast workload (generated, seed {seed}, size {size}): Keras training (seed 003).

A small recurrent network like heapcast's own predictor: an embedding of 64 heap-call tokens, a
GRU of 64 and one of 32 units, a softmax over the next token, trained for {epochs} epoch(s) on
{windows} windows of {window} tokens drawn from a seeded Markov chain. TensorFlow allocates and
frees tensors from many threads on every step: the seed's training slowed by the system
allocator. Op determinism is on, so the printed losses are the same run to run and under any
allocator.
"""
'''
    + _KERAS_PREAMBLE
    + """# a Markov chain over 64 tokens whose rows favour a few successors, as heap calls do
weights = rng.random((64, 64)) ** 8
cum = np.cumsum(weights / weights.sum(axis=1, keepdims=True), axis=1)
length = {windows} + {window}
seq = np.empty(length, dtype=np.int32)
seq[0] = 0
draws = rng.random(length)
for i in range(1, length):
    seq[i] = min(int(np.searchsorted(cum[seq[i - 1]], draws[i])), 63)
x = np.lib.stride_tricks.sliding_window_view(seq[:-1], {window})[: {windows}]
y = seq[{window} : {window} + {windows}]

model = keras.Sequential(
    [
        keras.Input(shape=({window},), dtype="int32"),
        keras.layers.Embedding(64, 16),
        keras.layers.GRU(64, return_sequences=True),
        keras.layers.GRU(32),
        keras.layers.Dense(64, activation="softmax"),
    ]
)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=128, epochs={epochs}, shuffle=True, verbose=0)
losses = " ".join(f"{{v:.4f}}" for v in history.history["loss"])
print("heapcast keras gru done", {windows}, {epochs}, losses)
"""
)


def gen_keras_gru(seed: int, size: int, dest: Path) -> list[str]:
    """Seed 003's case: Keras training of a small GRU on `size` token windows of 100 (one
    epoch up to 2000 windows, two above)."""
    text = _KERAS_GRU_TEMPLATE.format(
        seed=seed, size=size, windows=size, window=100, epochs=1 if size <= 2000 else 2
    )
    (dest / "train.py").write_text(text)
    return ["train.py"]


GENERATORS["keras_gru"] = gen_keras_gru


_KERAS_VIDEO_TEMPLATE = (
    '''\
"""heapcast workload (generated, seed {seed}, size {size}): seed 003's case in its own shape,
video classification training in TensorFlow/Keras.

Each of {steps} steps decodes a batch of {batch} clips of {frames} frames ({height}x{width}, RGB)
from a small library of seeded uint8 videos, as an input pipeline does: the clips stacked,
converted to float32 ({batch_mb:.1f} MB), normalised in place and half of them flipped, then one
training step of a small 3D convolutional classifier over it. Keras feeds the batches through
a tf.data generator dataset, whose kernel (on Python 3.11) fixes glibc's mmap threshold at
128 KiB with mallopt: from then on every block of 128 KiB or more, each tensor and each batch,
is a fresh mapping under glibc, zero-filled page by page, where an allocator that keeps freed
blocks (or ignores mallopt) hands the last one back. The batch is above glibc's largest dynamic
threshold (32 MiB) besides. Op determinism is on, so the printed loss is the same run to run
and under any allocator.
"""
'''
    + _KERAS_PREAMBLE
    + '''STEPS, B, T, H, W, CLASSES = {steps}, {batch}, {frames}, {height}, {width}, {classes}
videos = rng.integers(0, 256, size=({videos}, 2 * T, H, W, 3), dtype=np.uint8)


class Clips(keras.utils.PyDataset):
    """Batch i: clips cut from the videos at seeded offsets, normalised, half flipped."""

    def __len__(self):
        return STEPS

    def __getitem__(self, i):
        rng = np.random.default_rng(SEED * 100003 + i)
        which = rng.integers(0, len(videos), size=B)
        start = rng.integers(0, T, size=B)
        clips = np.stack([videos[v, s : s + T] for v, s in zip(which, start)])
        x = clips.astype(np.float32)
        x /= 255.0
        x -= 0.45
        x /= 0.225
        flip = rng.random(B) < 0.5
        x[flip] = x[flip][:, :, :, ::-1]
        return x, (which % CLASSES).astype(np.int32)


model = keras.Sequential(
    [
        keras.Input(shape=(T, H, W, 3)),
        keras.layers.AveragePooling3D((2, 4, 4)),
        keras.layers.Conv3D(8, 3, activation="relu"),
        keras.layers.GlobalAveragePooling3D(),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ]
)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
history = model.fit(Clips(), epochs=1, verbose=0)
print("heapcast keras video done", STEPS, f"{{history.history['loss'][-1]:.4f}}")
'''
)


def gen_keras_video(seed: int, size: int, dest: Path) -> list[str]:
    """Seed 003's case in its shape: Keras training of a small video classifier, `size` steps
    over batches of 16 clips of 16 frames of 112x112 (38.5 MB in float32 each)."""
    batch, frames, height, width = 16, 16, 112, 112
    text = _KERAS_VIDEO_TEMPLATE.format(
        seed=seed,
        size=size,
        steps=size,
        batch=batch,
        frames=frames,
        height=height,
        width=width,
        classes=3,
        videos=6,
        batch_mb=batch * frames * height * width * 3 * 4 / 1e6,
    )
    (dest / "train.py").write_text(text)
    return ["train.py"]


GENERATORS["keras_video"] = gen_keras_video


_NUMPY_TRAINING_LOOP_TEMPLATE = (
    '''\
"""heapcast workload (generated, seed {seed}, size {size}): seed 001's case, a training loop
that allocates and frees the same-shaped tensors step after step: a two-layer network on a
batch of {size} thousand rows, {steps} steps of forward pass, gradients and update. Every step
makes the same temporaries (activations, masks, gradients) and drops them; an allocator that
keeps them by size hands them back. numpy imported from its folder, as in numpy_temporaries.
"""
import importlib.util
import sys

'''
    + _NUMPY_FROM_ITS_FOLDER
    + """
rng = np.random.default_rng({seed})
n, d, h = {size} * 1000, {features}, {hidden}
x = rng.standard_normal((n, d))
y = np.tanh(x[:, :1] * {factor!r})
w1 = rng.standard_normal((d, h)) * 0.1
w2 = rng.standard_normal((h, 1)) * 0.1
for step in range({steps}):
    z = x @ w1
    a = np.maximum(z, 0.0)
    out = a @ w2
    err = out - y
    loss = float((err * err).mean())
    d_a = (err @ w2.T) * (z > 0.0)
    w2 -= 0.01 * (a.T @ err) / n
    w1 -= 0.01 * (x.T @ d_a) / n
    del z, a, out, err, d_a
print("heapcast numpy training loop done", {steps}, f"{{loss:.6g}}")
sys.exit(0)
"""
)


def gen_numpy_training_loop(seed: int, size: int, dest: Path) -> list[str]:
    """Seed 001's case: a training loop allocating and freeing same-shaped tensors every step
    (size: thousands of rows in the batch; each activation is rows x 64 float64)."""
    rng = random.Random(seed)
    return _numpy_workload(
        dest,
        _NUMPY_TRAINING_LOOP_TEMPLATE,
        seed=seed,
        size=size,
        steps=20,
        features=16,
        hidden=64,
        factor=round(0.5 + rng.random(), 3),
    )


GENERATORS["numpy_training_loop"] = gen_numpy_training_loop


_NUMPY_PIPELINE_TEMPLATE = (
    '''\
"""heapcast workload (generated, seed {seed}, size {size}): a producer/consumer pipeline, the
shape of a data loader. A reader thread makes {chunks} chunks of {size} thousand float64 values
(40 MB at 5000) and hands each through a queue of {depth} to the main thread, which reduces it
and drops it: every chunk is allocated in the reader and freed in the main thread. Above glibc's
largest dynamic mmap threshold (32 MiB), glibc maps and zero-fills each chunk; an allocator that
keeps the freed chunk hands it to the reader's next request. The freeing thread itself never
asks for a block that large, so a predictor of the freeing thread's own calls never keeps it; a
prediction of the process's reuse does. numpy imported from its folder, as in numpy_temporaries.
"""
import importlib.util
import queue
import sys
import threading

'''
    + _NUMPY_FROM_ITS_FOLDER
    + """
n = {size} * 1000
chunks = queue.Queue(maxsize={depth})


def reader():
    for i in range({chunks}):
        # no reference kept here: the consumer's drop frees the chunk
        chunks.put(np.full(n, float((i * {step}) % 11)))
    chunks.put(None)


t = threading.Thread(target=reader)
t.start()
total = 0.0
while (chunk := chunks.get()) is not None:
    total += float(chunk[::4099].sum())
    del chunk
t.join()
print("heapcast numpy pipeline done", {chunks}, round(total, 3))
sys.exit(0)
"""
)


def gen_numpy_pipeline(seed: int, size: int, dest: Path) -> list[str]:
    """A reader thread allocates large chunks, the main thread frees them (size: thousands of
    float64 values per chunk)."""
    rng = random.Random(seed)
    return _numpy_workload(
        dest,
        _NUMPY_PIPELINE_TEMPLATE,
        seed=seed,
        size=size,
        chunks=40,
        depth=2,
        step=rng.randint(1, 10),
    )


GENERATORS["numpy_pipeline"] = gen_numpy_pipeline


# The wide catalog's programs (issue 43): generic text, json and xml inputs, documents, images,
# and one script or source file per language (tasks/replay/inputs_programs.py lists them).
from tasks.replay.inputs_programs import WIDE_GENERATORS  # noqa: E402

GENERATORS.update(WIDE_GENERATORS)
