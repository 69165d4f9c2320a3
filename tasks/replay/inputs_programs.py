"""Seeded inputs of the wide catalog's programs (issue 43): the `tools` and `langs` images.

Registered into `tasks.replay.inputs.GENERATORS` (imported at the end of that module); the same
rules hold: (seed, size) -> the same bytes, every file plain and in one folder. Generic inputs
(`text`, `json`, `xml`) are shared by several programs (`text` by the compressors, sort, grep,
sed, gawk and diff); the others are one language's program each. Each `gen_*` says what it
writes and what its `size` counts; the table of them all: docs/tracing.md#the-inputs-generators.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

# Own word list (this module must not import tasks.replay.inputs: that module imports it).
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega heap arena chunk block slab page cache tree node leaf "
    "root list queue stack map set table index cursor pager btree vector string buffer"
).split()
COUNTRIES = ["de", "fr", "jp", "br", "in", "us", "ng", "au", "ca", "kr"]


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _fill(template: str, **fields: object) -> str:
    """`template` with each __NAME__ replaced (no brace escaping in the programs' own syntax)."""
    for key, value in fields.items():
        template = template.replace(f"__{key.upper()}__", str(value))
    return template


def _write(dest: Path, files: dict[str, str | bytes]) -> list[str]:
    for name, body in files.items():
        path = dest / name
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body)
    return list(files)


# ---------------------------------------------------------------- text, json, xml


def gen_text(seed: int, size: int, dest: Path) -> list[str]:
    """`size` tab-separated lines (key, words, country, count, price), an edited copy of them
    (for diff), extended regular expressions (grep), a sed script and a gawk report."""
    rng = random.Random(seed)
    lines = [
        f"{rng.randrange(10**6):06d}\t{_words(rng, 2, 14)}\t{rng.choice(COUNTRIES)}\t"
        f"{rng.randint(0, 9999)}\t{rng.random() * 500:.2f}"
        for _ in range(size)
    ]
    edited = list(lines)
    for _ in range(max(3, size // 20)):
        pos = rng.randrange(len(edited))
        op = rng.randrange(3)
        if op == 0:
            edited.insert(pos, f"{rng.randrange(10**6):06d}\t{_words(rng, 2, 14)}\tzz\t0\t0.00")
        elif op == 1 and len(edited) > 1:
            del edited[pos]
        else:
            edited[pos] = edited[pos].upper()
    picks = rng.sample(WORDS, 8)
    patterns = [
        rf"\b{picks[0]}( [a-z]+){{2,4}} {picks[1]}\b",
        f"^[0-9]{{3}}{rng.randint(0, 9)}[0-9]*\t",  # a real tab: grep has no \t
        rf"({picks[2]}|{picks[3]}|{picks[4]})[a-z]* (tree|node|leaf)",
        "\t(de|fr|jp)\t[0-9]{4}\t",
        rf"[0-9]+\.{rng.randint(0, 9)}[0-9]$",
        rf"{picks[5]} .*{picks[6]} .*{picks[7]}",
    ]
    sed = [
        rf"s/\b({picks[0]}|{picks[1]}) ([a-z]+)/\2-\1/g",
        r"s/\t([a-z]{2})\t/\t<\1>\t/",
        rf"/{picks[2]}/{{s/[aeiou]/\U&/g}}",
        r"y/abcdef/ABCDEF/",
        rf"/{picks[3]}.*{picks[4]}/d",
        r"s/([0-9]+)\.([0-9]+)$/\2.\1/",
        "$a\\\nheapcast sed workload done",
    ]
    awk = r"""# heapcast gawk report: per country and per word, sums, counts, sorted output
BEGIN { FS = "\t" }
{
    n = split($2, w, " ")
    for (i = 1; i <= n; i++) { words[w[i]]++; byc[$3 SUBSEP w[i]] += $4 }
    total[$3] += $5; count[$3]++
    key = substr($1, 1, 3)
    seen[key] = seen[key] " " NR
    if (length(seen[key]) > 400) seen[key] = substr(seen[key], 200)
    line[NR % 500] = toupper($2) sprintf("|%08.2f", $5)
}
END {
    PROCINFO["sorted_in"] = "@ind_str_asc"
    for (c in total) printf "%s %d %.2f\n", c, count[c], total[c] / count[c]
    PROCINFO["sorted_in"] = "@val_num_desc"
    k = 0
    for (x in words) { if (k++ < 20) printf "%s %d\n", x, words[x] }
    PROCINFO["sorted_in"] = "@ind_str_asc"
    m = 0
    for (x in byc) { split(x, p, SUBSEP); m += byc[x] }
    for (x in seen) m += length(seen[x])
    print "heapcast gawk workload done", NR, m, length(line)
}
"""
    return _write(
        dest,
        {
            "text.txt": "\n".join(lines) + "\n",
            "text2.txt": "\n".join(edited) + "\n",
            "patterns.txt": "\n".join(patterns) + "\n",
            "edit.sed": "\n".join(sed) + "\n",
            "report.awk": awk,
        },
    )


_JQ_FILTER = r"""# heapcast jq workload: grouping, sorting, reductions, string building
def words_of: .title | split(" ");
{
  by_country: (group_by(.country) | map({country: .[0].country, n: length,
      total: (map(.price) | add), tags: ([.[].tags[]] | unique)})),
  top: (sort_by(-.score, .id) | .[:25] | map({id, title, score})),
  words: ([.[] | words_of[]] | group_by(.) | map({(.[0]): length}) | add),
  nested: (map(.attrs | to_entries[] | select(.value > 0.5) | .key) | unique | length),
  joined: (map(.title | ascii_upcase) | join("|") | length),
  paths: ([paths(type == "number")] | length),
  rebuilt: (reduce .[] as $r ({}; .[$r.country] += [$r.id]) | map_values(length))
}
"""


def gen_json(seed: int, size: int, dest: Path) -> list[str]:
    """data.json: `size` records (ids, titles, tags, nested attributes); filter.jq."""
    rng = random.Random(seed)
    recs = []
    for i in range(size):
        attrs = ", ".join(
            f'"{rng.choice(WORDS)}{k}": {rng.random():.4f}' for k in range(rng.randint(0, 6))
        )
        tags = ", ".join(f'"{rng.choice(WORDS)}"' for _ in range(rng.randint(0, 5)))
        recs.append(
            f'{{"id": {i}, "title": "{_words(rng, 1, 8)}", "country": "{rng.choice(COUNTRIES)}", '
            f'"price": {rng.random() * 500:.2f}, "score": {rng.randint(0, 1000)}, '
            f'"tags": [{tags}], "attrs": {{{attrs}}}}}'
        )
    return _write(dest, {"data.json": "[\n" + ",\n".join(recs) + "\n]\n", "filter.jq": _JQ_FILTER})


_DTD = """<!ELEMENT catalog (item*)>
<!ATTLIST catalog seed CDATA #REQUIRED>
<!ELEMENT item (title, country, price, tags, note?)>
<!ATTLIST item id ID #REQUIRED score CDATA #IMPLIED>
<!ELEMENT title (#PCDATA)>
<!ELEMENT country (#PCDATA)>
<!ELEMENT price (#PCDATA)>
<!ELEMENT tags (tag*)>
<!ELEMENT tag (#PCDATA)>
<!ELEMENT note (#PCDATA | em)*>
<!ELEMENT em (#PCDATA)>
"""

_XSL = """<?xml version="1.0"?>
<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:output method="html" indent="yes"/>
  <xsl:key name="by-country" match="item" use="country"/>
  <xsl:key name="by-tag" match="tag" use="."/>
  <xsl:template match="/catalog">
    <html><body>
      <h1>catalog <xsl:value-of select="@seed"/></h1>
      <xsl:for-each select="item[generate-id() = generate-id(key('by-country', country)[1])]">
        <xsl:sort select="country"/>
        <h2><xsl:value-of select="country"/></h2>
        <p>items: <xsl:value-of select="count(key('by-country', country))"/>,
           total: <xsl:value-of select="format-number(sum(key('by-country', country)/price), '0.00')"/></p>
        <table>
          <xsl:for-each select="key('by-country', country)">
            <xsl:sort select="@score" data-type="number" order="descending"/>
            <xsl:if test="position() &lt;= 20">
              <tr><td><xsl:value-of select="@id"/></td>
                  <td><xsl:value-of select="translate(title, 'abcdefghij', 'ABCDEFGHIJ')"/></td>
                  <td><xsl:value-of select="concat(substring(title, 1, 5), '-', string-length(title))"/></td></tr>
            </xsl:if>
          </xsl:for-each>
        </table>
      </xsl:for-each>
      <ul>
        <xsl:for-each select="//tag[generate-id() = generate-id(key('by-tag', .)[1])]">
          <xsl:sort select="."/>
          <li><xsl:value-of select="."/>: <xsl:value-of select="count(key('by-tag', .))"/></li>
        </xsl:for-each>
      </ul>
    </body></html>
  </xsl:template>
</xsl:stylesheet>
"""


def gen_xml(seed: int, size: int, dest: Path) -> list[str]:
    """doc.xml: a catalog of `size` items valid against doc.dtd; style.xsl groups and sorts it."""
    rng = random.Random(seed)
    out = ['<?xml version="1.0" encoding="UTF-8"?>', f'<catalog seed="{seed}">']
    for i in range(size):
        tags = "".join(f"<tag>{rng.choice(WORDS)}</tag>" for _ in range(rng.randint(0, 5)))
        note = ""
        if rng.random() < 0.4:
            note = f"<note>{_words(rng, 2, 10)} <em>{rng.choice(WORDS)}</em> {_words(rng, 1, 6)}</note>"
        out.append(
            f'  <item id="i{i}" score="{rng.randint(0, 1000)}"><title>{_words(rng, 1, 8)}</title>'
            f"<country>{rng.choice(COUNTRIES)}</country><price>{rng.random() * 500:.2f}</price>"
            f"<tags>{tags}</tags>{note}</item>"
        )
    out.append("</catalog>")
    return _write(dest, {"doc.xml": "\n".join(out) + "\n", "doc.dtd": _DTD, "style.xsl": _XSL})


# ---------------------------------------------------------------- documents and images


def gen_man_page(seed: int, size: int, dest: Path) -> list[str]:
    """page.man: a manual page of `size` sections (paragraphs, tagged lists, tbl tables)."""
    rng = random.Random(seed)
    out = [f'.TH HEAPCAST 1 "2026-01-01" "heapcast {seed}" "Generated manual"']
    for s in range(size):
        out.append(f".SH SECTION {s} {rng.choice(WORDS).upper()}")
        for _ in range(rng.randint(1, 3)):
            out.append(".PP")
            out.append(_words(rng, 20, 80) + f" \\fB{rng.choice(WORDS)}\\fP {_words(rng, 5, 30)}.")
        out.append(".TP")
        out.append(f"\\fB\\-\\-{rng.choice(WORDS)}\\fR=\\fI{rng.choice(WORDS)}\\fR")
        out.append(_words(rng, 10, 40) + ".")
        if rng.random() < 0.6:
            cols = rng.randint(2, 4)
            out += [".TS", "allbox;", " ".join(["l"] * cols) + "."]
            for _ in range(rng.randint(2, 8)):
                out.append("\t".join(_words(rng, 1, 3) for _ in range(cols)))
            out.append(".TE")
        out.append(".IP \\(bu 2")
        out.append(_words(rng, 8, 25) + ".")
    return _write(dest, {"page.man": "\n".join(out) + "\n"})


_PS_PROLOGUE = """%!PS-Adobe-3.0
%%Title: heapcast ghostscript workload
/Helvetica findfont 10 scalefont setfont
/star { % x y r star -
  /r exch def gsave translate newpath 0 r moveto
  4 { 144 rotate 0 r lineto } repeat closepath fill grestore
} def
/label { % x y string label -
  3 1 roll moveto show
} def
/words [__WORDS__] def
"""


def gen_postscript(seed: int, size: int, dest: Path) -> list[str]:
    """doc.ps: `size` pages of filled stars, curves, strings built at run time and text."""
    rng = random.Random(seed)
    out = [_fill(_PS_PROLOGUE, words=" ".join(f"({w})" for w in WORDS))]
    for page in range(size):
        out.append(f"%%Page: {page + 1} {page + 1}")
        out.append(f"{rng.random():.3f} {rng.random():.3f} {rng.random():.3f} setrgbcolor")
        for _ in range(rng.randint(10, 30)):
            out.append(f"{rng.randint(20, 580)} {rng.randint(20, 800)} {rng.randint(3, 30)} star")
        out.append("newpath 50 50 moveto")
        for _ in range(rng.randint(5, 20)):
            pts = " ".join(str(rng.randint(20, 580)) for _ in range(6))
            out.append(f"{pts} curveto")
        out.append("stroke")
        out.append(
            f"0 1 {rng.randint(20, 60)} {{ /i exch def 40 i 12 mul 60 add "
            "words i words length mod get 20 string cvs label } for"
        )
        out.append(
            f"1 1 {rng.randint(20, 80)} {{ /j exch def j 7 mul 20 add 780 j 3 string cvs label }} for"
        )
        out.append("showpage")
    out.append("%%EOF")
    return _write(dest, {"doc.ps": "\n".join(out) + "\n"})


def gen_ppm_image(seed: int, size: int, dest: Path) -> list[str]:
    """in.ppm: a binary PPM of `size` x (3/4 size) pixels: seeded gradients, bands and noise."""
    rng = random.Random(seed)
    w, h = size, max(1, size * 3 // 4)
    fx, fy = rng.randint(1, 9), rng.randint(1, 9)
    row_noise = [rng.randrange(64) for _ in range(w)]
    pixels = bytearray()
    for y in range(h):
        for x in range(w):
            band = ((x * fx + y * fy) // 16) & 1
            pixels += bytes(
                (
                    (x * 255 // w + row_noise[x]) & 255,
                    (y * 255 // h + band * 90) & 255,
                    ((x ^ y) * fx) & 255,
                )
            )
    return _write(dest, {"in.ppm": f"P6\n{w} {h}\n255\n".encode() + bytes(pixels)})


def gen_dot_graph(seed: int, size: int, dest: Path) -> list[str]:
    """graph.dot: `size` nodes in clusters, about 2 edges a node, labels and attributes."""
    rng = random.Random(seed)
    clusters = max(2, size // 25)
    # newrank: rank the clusters' nodes together; without it, dot 2.42 loses labelled edges
    # between clusters on some graphs ("lost edge", exit 1)
    out = [
        f"digraph heapcast_{seed} {{",
        "  rankdir=LR;",
        "  newrank=true;",
        "  node [shape=box, fontsize=10];",
    ]
    for c in range(clusters):
        out.append(f"  subgraph cluster_{c} {{")
        out.append(f'    label="{rng.choice(WORDS)} {c}";')
        for n in range(c, size, clusters):
            shape = rng.choice(["box", "ellipse", "record", "diamond"])
            label = (
                f"{{{rng.choice(WORDS)}|{rng.choice(WORDS)}}}"
                if shape == "record"
                else _words(rng, 1, 3)
            )
            out.append(f'    n{n} [shape={shape}, label="{label}"];')
        out.append("  }")
    for n in range(1, size):
        out.append(f"  n{rng.randrange(n)} -> n{n};")
        if rng.random() < 0.9:
            a, b = rng.randrange(size), rng.randrange(size)
            out.append(f'  n{a} -> n{b} [label="{rng.choice(WORDS)}"];')
    out.append("}")
    return _write(dest, {"graph.dot": "\n".join(out) + "\n"})


def gen_gnuplot_script(seed: int, size: int, dest: Path) -> list[str]:
    """plot.gp: data blocks of `size` points, an SVG of four plots, stats and a fitted curve."""
    rng = random.Random(seed)
    a, b = rng.uniform(0.5, 3.0), rng.uniform(0.01, 0.2)
    out = [
        f"# heapcast gnuplot workload (generated, seed {seed}, size {size})",
        "set terminal svg size 900,700 dynamic",
        "set fit quiet",
        "set fit logfile '/dev/null'",
        "$data << EOD",
    ]
    for i in range(size):
        x = i / max(1, size) * 20
        out.append(
            f"{x:.4f} {a * 2.718281828 ** (-b * x) * 100 + rng.gauss(0, 3):.4f} {rng.random():.4f}"
        )
    out.append("EOD")
    out += [
        "$grid << EOD",
        *(
            " ".join(f"{rng.random() * 10:.3f}" for _ in range(3))
            for _ in range(max(20, size // 4))
        ),
        "EOD",
        "f(x) = p * exp(-q * x)",
        "p = 100; q = 0.1",
        "fit f(x) $data using 1:2 via p, q",
        "stats $data using 2 name 'S' nooutput",
        "set multiplot layout 2,2",
        "plot $data using 1:2 with points title 'data', f(x) title 'fit'",
        "plot $data using 1:3 smooth cumulative title 'cumulative'",
        "set dgrid3d 20,20",
        "splot $grid using 1:2:3 with lines title 'grid'",
        "unset dgrid3d",
        "plot $data using 1:($2 / S_max) with boxes title sprintf('mean %.2f', S_mean)",
        "unset multiplot",
        "print sprintf('heapcast gnuplot workload done %.3f %.3f', p, q)",
    ]
    return _write(dest, {"plot.gp": "\n".join(out) + "\n"})


# ---------------------------------------------------------------- language scripts

_LUA = r"""-- heapcast workload (generated, seed __SEED__, size __SIZE__): tables, strings, closures
local SIZE = __SIZE__
local WORDS = {__WORDS__}
local state = __SEED__
local function rnd(n) state = (state * 1103515245 + 12345) % 2147483648; return state % n end
local function word() return WORDS[rnd(#WORDS) + 1] end

local function phase_tables(n)
  local t, count = {}, 0
  for i = 1, n do
    local k = word() .. "-" .. word() .. i
    t[k] = { id = i, tags = { word(), word() }, score = rnd(1000) }
    if i % 7 == 0 then
      for key in pairs(t) do t[key] = nil; count = count + 1; break end
    end
  end
  for _, v in pairs(t) do count = count + #v.tags end
  return count
end

local function phase_strings(n)
  local parts = {}
  for i = 1, n do
    local s = word() .. " " .. word() .. " " .. word()
    s = (i % 3 == 0) and s:upper() or s:reverse()
    s = s:gsub("(%w+) (%w+)", "%2:%1")
    parts[#parts + 1] = string.format("%05d|%s|%d", i, s, rnd(100))
    if #parts > 200 then parts = { table.concat(parts, ",", 1, 50) } end
  end
  local m = 0
  for _, p in ipairs(parts) do for _ in p:gmatch("%w+:%w+") do m = m + 1 end end
  return m
end

local function phase_sort(n)
  local rows = {}
  for i = 1, n do rows[i] = { word(), rnd(1000), tostring(i) } end
  table.sort(rows, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] > b[2] end)
  local groups = {}
  for _, r in ipairs(rows) do
    groups[r[1]] = groups[r[1]] or {}
    table.insert(groups[r[1]], r[2])
  end
  local s = 0
  for _, g in pairs(groups) do s = s + #g end
  return s
end

local function phase_closures(n)
  local fs, acc = {}, 0
  for i = 1, n do
    local captured = { i, word() }
    fs[#fs + 1] = function(x) return x + captured[1] + #captured[2] end
    if #fs > 100 then
      for j = 1, 50 do acc = acc + fs[j](j) end
      fs = { table.unpack(fs, 51) }
    end
  end
  return acc
end

local total = 0
for _ = 1, 3 do
  total = total + phase_tables(SIZE // 3 + 1) + phase_strings(SIZE // 3 + 1)
  total = total + phase_sort(SIZE // 3 + 1) + phase_closures(SIZE // 3 + 1)
end
print("heapcast lua workload done", total)
"""

_RUBY = r"""# heapcast workload (generated, seed __SEED__, size __SIZE__): hashes, arrays, strings, structs
SIZE = __SIZE__
WORDS = %w[__WORDS_SPACED__]
R = Random.new(__SEED__)
Rec = Struct.new(:id, :tags, :score, :children)

def word = WORDS[R.rand(WORDS.size)]

def phase_hashes(n)
  h = {}
  n.times do |i|
    h["#{word}-#{word}#{i}"] = Rec.new(i, Array.new(R.rand(5)) { word }, R.rand(1000), [])
    h.delete(h.keys.first) if (i % 7).zero?
  end
  h.values.sum { |r| r.tags.size } + h.keys.map(&:size).max.to_i
end

def phase_strings(n)
  parts = []
  n.times do |i|
    s = Array.new(2 + R.rand(20)) { word }.join(" ")
    s = i % 3 == 0 ? s.upcase : s.reverse
    parts << format("%05d|%s|%.3f", i, s.gsub(/(\w+) (\w+)/, '\2:\1'), R.rand)
    parts = [parts.first(50).join(",")] + parts.drop(50) if parts.size > 200
  end
  parts.sum { |p| p.scan(/\w+:\w+/).size }
end

def phase_trees(n)
  roots = []
  n.times do |i|
    r = Rec.new(i, [word], R.rand(1000), [])
    if !roots.empty? && R.rand < 0.6 then roots.sample(random: R).children << r else roots << r end
    roots.shift(R.rand(1..250)) if roots.size > 500
  end
  roots.sum { |r| r.children.size }
end

def phase_sort(n)
  rows = Array.new(n) { [word, R.rand(1000), R.rand.to_s] }
  rows.sort_by! { |w, k, _| [w, -k] }
  rows.group_by(&:first).transform_values(&:size).sum { |_, v| v }
end

total = 0
3.times do
  total += phase_hashes(SIZE / 3 + 1) + phase_strings(SIZE / 3 + 1)
  total += phase_trees(SIZE / 3 + 1) + phase_sort(SIZE / 3 + 1)
end
puts "heapcast ruby workload done #{total}"
"""

_TCL = r"""# heapcast workload (generated, seed __SEED__, size __SIZE__): dicts, lists, arrays, strings
set SIZE __SIZE__
set WORDS {__WORDS_SPACED__}
expr {srand(__SEED__)}
proc word {} { global WORDS; lindex $WORDS [expr {int(rand() * [llength $WORDS])}] }

proc phase_dicts {n} {
    set d [dict create]
    for {set i 0} {$i < $n} {incr i} {
        dict set d "[word]-[word]$i" [list $i [word] [expr {int(rand() * 1000)}]]
        if {$i % 7 == 0} { set d [dict remove $d [lindex [dict keys $d] 0]] }
    }
    set total 0
    dict for {k v} $d { incr total [string length $k] }
    return $total
}

proc phase_strings {n} {
    set parts {}
    for {set i 0} {$i < $n} {incr i} {
        set s "[word] [word] [word] [word]"
        if {$i % 3 == 0} { set s [string toupper $s] } else { set s [string reverse $s] }
        regsub -all {(\w+) (\w+)} $s {\2:\1} s
        lappend parts [format "%05d|%s|%.3f" $i $s [expr {rand()}]]
        if {[llength $parts] > 200} { set parts [list [join [lrange $parts 0 49] ,] {*}[lrange $parts 50 end]] }
    }
    set m 0
    foreach p $parts { incr m [llength [regexp -all -inline {\w+:\w+} $p]] }
    return $m
}

proc phase_arrays {n} {
    array set a {}
    for {set i 0} {$i < $n} {incr i} {
        set k [word]
        lappend a($k) $i
        if {[llength $a($k)] > 50} { set a($k) [lsort -integer -decreasing [lrange $a($k) 10 end]] }
    }
    set rows {}
    foreach k [lsort [array names a]] { lappend rows [list $k [llength $a($k)]] }
    return [llength [lsort -index 1 -integer $rows]]
}

set total 0
for {set r 0} {$r < 3} {incr r} {
    set n [expr {$SIZE / 3 + 1}]
    incr total [phase_dicts $n]
    incr total [phase_strings $n]
    incr total [phase_arrays $n]
}
puts "heapcast tcl workload done $total"
"""

_PHP = r"""<?php
// heapcast workload (generated, seed __SEED__, size __SIZE__): arrays, strings, preg, objects
const SIZE = __SIZE__;
const WORDS = [__WORDS__];
mt_srand(__SEED__);
function word() { return WORDS[mt_rand(0, count(WORDS) - 1)]; }

class Rec {
    public $children = [];
    public function __construct(public int $id, public array $tags, public int $score) {}
}

function phase_arrays($n) {
    $h = [];
    for ($i = 0; $i < $n; $i++) {
        $h[word() . '-' . word() . $i] = ['id' => $i, 'tags' => [word(), word()], 'score' => mt_rand(0, 999)];
        if ($i % 7 == 0) { unset($h[array_key_first($h)]); }
    }
    $t = 0;
    foreach ($h as $k => $v) { $t += count($v['tags']) + strlen($k); }
    return $t;
}

function phase_strings($n) {
    $parts = [];
    for ($i = 0; $i < $n; $i++) {
        $s = implode(' ', array_map(fn($x) => word(), range(0, mt_rand(2, 20))));
        $s = $i % 3 ? strtoupper($s) : strrev($s);
        $parts[] = sprintf('%05d|%s|%.3f', $i, preg_replace('/(\w+) (\w+)/', '$2:$1', $s), mt_rand() / mt_getrandmax());
        if (count($parts) > 200) { $parts = array_merge([implode(',', array_slice($parts, 0, 50))], array_slice($parts, 50)); }
    }
    $m = 0;
    foreach ($parts as $p) { $m += preg_match_all('/\w+:\w+/', $p); }
    return $m;
}

function phase_objects($n) {
    $roots = [];
    for ($i = 0; $i < $n; $i++) {
        $r = new Rec($i, [word()], mt_rand(0, 999));
        if ($roots && mt_rand(0, 9) < 6) { $roots[mt_rand(0, count($roots) - 1)]->children[] = $r; }
        else { $roots[] = $r; }
        if (count($roots) > 500) { $roots = array_slice($roots, mt_rand(1, 250)); }
    }
    usort($roots, fn($a, $b) => $b->score <=> $a->score ?: $a->id <=> $b->id);
    return array_sum(array_map(fn($r) => count($r->children), $roots));
}

$total = 0;
for ($r = 0; $r < 3; $r++) {
    $n = intdiv(SIZE, 3) + 1;
    $total += phase_arrays($n) + phase_strings($n) + phase_objects($n);
}
echo "heapcast php workload done $total\n";
"""

_SCHEME = r""";; heapcast workload (generated, seed __SEED__, size __SIZE__): lists, vectors, hashes, strings
(use-modules (ice-9 hash-table) (srfi srfi-1))
(define size __SIZE__)
(define words (vector __WORDS_QUOTED__))
(define state __SEED__)
(define (rnd n) (set! state (modulo (+ (* state 1103515245) 12345) 2147483648)) (modulo state n))
(define (word) (vector-ref words (rnd (vector-length words))))

(define (phase-hash n)
  (let ((h (make-hash-table)))
    (do ((i 0 (+ i 1))) ((= i n))
      (hash-set! h (string-append (word) "-" (word) (number->string i))
                 (list i (word) (rnd 1000)))
      (when (= 0 (modulo i 7))
        (hash-remove! h (string-append (word) "-" (word) (number->string (rnd (+ i 1)))))))
    (hash-count (lambda (k v) (> (caddr v) 500)) h)))

(define (phase-strings n)
  (let loop ((i 0) (parts '()) (m 0))
    (if (= i n)
        (+ m (length parts))
        (let* ((s (string-join (list (word) (word) (word)) " "))
               (s2 (if (= 0 (modulo i 3)) (string-upcase s) (string-reverse s)))
               (p (string-append (number->string i) "|" s2)))
          (loop (+ i 1)
                (if (> (length parts) 200) (list (string-join (take parts 50) ",")) (cons p parts))
                (+ m (string-length p)))))))

(define (phase-sort n)
  (let* ((rows (list-tabulate n (lambda (i) (cons (word) (rnd 1000)))))
         (sorted (sort rows (lambda (a b) (or (string<? (car a) (car b))
                                              (and (string=? (car a) (car b)) (> (cdr a) (cdr b))))))))
    (length (delete-duplicates (map car sorted)))))

(define (phase-vectors n)
  (let ((v (make-vector 64 '())))
    (do ((i 0 (+ i 1))) ((= i n))
      (let ((k (rnd 64)))
        (vector-set! v k (cons (make-string (+ 1 (rnd 40)) #\x) (vector-ref v k)))
        (when (> (length (vector-ref v k)) 30) (vector-set! v k (take (vector-ref v k) 10)))))
    (apply + (map length (vector->list v)))))

(define total 0)
(do ((r 0 (+ r 1))) ((= r 3))
  (let ((n (+ 1 (quotient size 3))))
    (set! total (+ total (phase-hash n) (phase-strings n) (phase-sort n) (phase-vectors n)))))
(display "heapcast guile workload done ")
(display total)
(newline)
"""

_BC = r"""/* heapcast workload (generated, seed __SEED__, size __SIZE__): arbitrary precision arithmetic */
define m(x, y) { auto o, r; o = scale; scale = 0; r = x % y; scale = o; return (r); }
define fact(n) { auto r; r = 1; while (n > 1) { r = r * n; n = n - 1; }; return (r); }
define fib(n) { auto a, b, t; a = 0; b = 1; while (n > 0) { t = a + b; a = b; b = t; n = n - 1; }; return (a); }
define pw(x, n) { auto r; r = 1; while (n > 0) { r = r * x; n = n - 1; }; return (r); }
define sum_arr(n) { auto i, s; s = 0; for (i = 0; i < n; i++) s = s + a[i]; return (s); }
scale = __SCALE__
n = __SIZE__
s = 0
for (i = 0; i < n; i++) {
  a[m(i, 500)] = sqrt(i + __SEED__) * fib(m(i, 97)) / (1 + m(i, 13))
  if (m(i, 10) == 0) s = s + fact(m(i, 60)) / pw(3, m(i, 40))
  if (m(i, 25) == 0) s = s + l(i + 2) * e(1 / (i + 1)) + a(1 / (i + 2)) + s(i) + c(i)
}
t = sum_arr(500)
print "heapcast bc workload done ", length(s), " ", length(t), "\n"
quit
"""

_M4 = r"""dnl heapcast workload (generated, seed __SEED__, size __SIZE__): recursive macros and builtins
divert(-1)
define(`forloop', `pushdef(`$1', `$2')_forloop($@)popdef(`$1')')
define(`_forloop', `$4`'ifelse($1, `$3', `', `define(`$1', incr($1))$0($@)')')
define(`reverse', `ifelse(`$#', `0', , `$#', `1', ``$1'', `reverse(shift($@)), `$1'')')
define(`fib', `ifelse(eval($1 < 2), 1, $1, `eval(fib(decr($1)) + fib(eval($1 - 2)))')')
define(`WORDS', `__WORDS_M4__')
define(`pick', `substr(WORDS, eval(($1 * 7 + __SEED__) % 400), 12)')
divert(0)dnl
forloop(`i', 1, __SIZE__, `define(`m'i, `pick(i)-'i)dnl
translit(m`'i, `abcdefgh', `ABCDEFGH') patsubst(pick(eval(i * 3)), `\([a-z]+\) \([a-z]+\)', `\2:\1') dnl
regexp(pick(i), `[aeiou]+') len(m`'i) ifelse(eval(i % 5), 0, `fib(eval(i % 12))', `reverse(a, b, c)')
divert(1)diverted i
divert(0)dnl
ifelse(eval(i % 3), 0, `undefine(`m'i)')dnl
')dnl
undivert(1)dnl
heapcast m4 workload done
"""


def _script(
    template: str, name: str, seed: int, size: int, dest: Path, **extra: object
) -> list[str]:
    text = _fill(
        template,
        seed=seed,
        size=size,
        words=", ".join(f'"{w}"' for w in WORDS),
        words_spaced=" ".join(WORDS),
        words_quoted=" ".join(f'"{w}"' for w in WORDS),
        **extra,
    )
    return _write(dest, {name: text})


def gen_lua_script(seed: int, size: int, dest: Path) -> list[str]:
    """workload.lua: `size` work units of tables, strings, gsub, sorts, closures."""
    return _script(_LUA, "workload.lua", seed, size, dest)


def gen_ruby_script(seed: int, size: int, dest: Path) -> list[str]:
    """workload.rb: `size` work units of hashes, arrays, strings, structs, sorts."""
    return _script(_RUBY, "workload.rb", seed, size, dest)


def gen_tcl_script(seed: int, size: int, dest: Path) -> list[str]:
    """workload.tcl: `size` work units of dicts, lists, arrays, strings, regsub."""
    return _script(_TCL, "workload.tcl", seed, size, dest)


def gen_php_script(seed: int, size: int, dest: Path) -> list[str]:
    """workload.php: `size` work units of arrays, strings, preg, objects, sorts."""
    return _script(_PHP, "workload.php", seed, size, dest)


def gen_scheme_script(seed: int, size: int, dest: Path) -> list[str]:
    """workload.scm (Guile): `size` work units of lists, vectors, hash tables, strings."""
    return _script(_SCHEME, "workload.scm", seed, size, dest)


def gen_bc_script(seed: int, size: int, dest: Path) -> list[str]:
    """calc.bc: `size` work units of arbitrary precision arithmetic, arrays, functions."""
    return _script(_BC, "calc.bc", seed, size, dest, scale=20 + seed % 20)


def gen_m4_macros(seed: int, size: int, dest: Path) -> list[str]:
    """macros.m4: `size` work units of recursive macros, loops, string builtins, diversions."""
    rng = random.Random(seed)
    # not `index`: an m4 builtin, it would expand inside the text
    text = " ".join(rng.choice([w for w in WORDS if w != "index"]) for _ in range(120))
    return _script(_M4, "macros.m4", seed, size, dest, words_m4=text)


# ---------------------------------------------------------------- language tools


def gen_bison_grammar(seed: int, size: int, dest: Path) -> list[str]:
    """grammar.y: `size` binary-operator levels (e0 loosest), primaries, calls, statements;
    unambiguous (one operator chain per level), so bison reports no conflicts."""
    rng = random.Random(seed)
    ops = [f"OP{i}" for i in range(size)]
    keywords = [f"KW_{w.upper()}{i}" for i, w in enumerate(rng.sample(WORDS, min(12, len(WORDS))))]
    out = [
        f"/* heapcast bison workload (generated, seed {seed}, size {size}) */",
        "%{",
        "int yylex(void);",
        "void yyerror(const char *s);",
        "%}",
        "%define parse.error verbose",
        "%token ID NUM STR " + " ".join(ops) + " " + " ".join(keywords),
        "%%",
        "program: %empty | program stmt ;",
        "stmt: e0 ';' | ID '=' e0 ';' | '{' program '}' ;",
    ]
    for i, kw in enumerate(keywords):
        out.append(
            f"stmt: {kw} '(' e0 ')' stmt{' ' + keywords[i - 1] + ' stmt' if i % 2 else ''} ;"
        )
    for i in range(size - 1):
        out.append(f"e{i}: e{i} {ops[i]} e{i + 1} | e{i + 1} ;")
    out.append(f"e{size - 1}: e{size - 1} {ops[size - 1]} primary | primary ;")
    out.append("primary: ID | NUM | STR | '(' e0 ')' | ID '(' args ')' | primary '[' e0 ']' ;")
    out.append("args: %empty | arglist ;")
    out.append("arglist: e0 | arglist ',' e0 ;")
    out.append("%%")
    return _write(dest, {"grammar.y": "\n".join(out) + "\n"})


def gen_flex_spec(seed: int, size: int, dest: Path) -> list[str]:
    """lexer.l: `size` keywords, operators, and number, string and comment patterns."""
    rng = random.Random(seed)
    kws = sorted({f"{rng.choice(WORDS)}{rng.choice(WORDS)}{i}" for i in range(size)})
    out = [
        f"/* heapcast flex workload (generated, seed {seed}, size {size}) */",
        "%option noyywrap nounput noinput",
        "%{",
        "int count;",
        "%}",
        "DIGIT [0-9]",
        "ID [a-zA-Z_][a-zA-Z0-9_]*",
        "%x COMMENT",
        "%%",
    ]
    out += [f'"{k}" {{ return {i + 256}; }}' for i, k in enumerate(kws)]
    ops = ["==", "!=", "<=", ">=", "&&", "||", "<<", ">>", "+=", "-=", "->", "::"]
    out += [f'"{op}" {{ return {1000 + i}; }}' for i, op in enumerate(ops)]
    out += [
        "{DIGIT}+(\\.{DIGIT}+)?([eE][+-]?{DIGIT}+)? { return 2000; }",
        "0[xX][0-9a-fA-F]+ { return 2001; }",
        '\\"([^"\\\\\\n]|\\\\.)*\\" { return 2002; }',
        '"/*" { BEGIN(COMMENT); }',
        '<COMMENT>"*/" { BEGIN(INITIAL); }',
        "<COMMENT>.|\\n { }",
        "{ID} { return 2003; }",
        "[ \\t\\n]+ { }",
        ". { return yytext[0]; }",
        "%%",
    ]
    return _write(dest, {"lexer.l": "\n".join(out) + "\n"})


def gen_nasm_source(seed: int, size: int, dest: Path) -> list[str]:
    """prog.asm: `size` functions using macros, local labels, %rep blocks and data."""
    rng = random.Random(seed)
    regs = ["rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11"]
    out = [
        f"; heapcast nasm workload (generated, seed {seed}, size {size})",
        "bits 64",
        "%macro MIX 3",
        "  mov %1, %2",
        "  xor %1, %3",
        "  rol %1, 7",
        "  add %1, %2",
        "%endmacro",
        "%macro TABLE 2",
        "%assign k 0",
        "%rep %2",
        "  dq %1 + k * 8",
        "%assign k k + 1",
        "%endrep",
        "%endmacro",
        "section .text",
        "global entry",
    ]
    for f in range(size):
        out.append(f"f{f}:")
        for b in range(rng.randint(2, 6)):
            r1, r2, r3 = rng.sample(regs, 3)
            out.append(f"  MIX {r1}, {r2}, {r3}")
            out.append(f"  cmp {r1}, {rng.randint(0, 1 << 20)}")
            out.append(f"  jb .l{b}")
            out.append(f"  imul {r2}, {r3}, {rng.randint(2, 99)}")
            out.append(f".l{b}:")
        if f:
            out.append(f"  call f{rng.randrange(f)}")
        out.append("  ret")
    out.append("entry:")
    out += [f"  call f{f}" for f in range(0, size, max(1, size // 20))]
    out.append("  ret")
    out.append("section .data")
    for t in range(max(1, size // 10)):
        out.append(f"tab{t}:")
        out.append(f"  TABLE {rng.randint(1, 1 << 16)}, {rng.randint(4, 32)}")
        out.append(f'  db "{_words(rng, 1, 6)}", 0')
    return _write(dest, {"prog.asm": "\n".join(out) + "\n"})


WIDE_GENERATORS: dict[str, Callable[[int, int, Path], list[str]]] = {
    "text": gen_text,
    "json": gen_json,
    "xml": gen_xml,
    "man_page": gen_man_page,
    "postscript": gen_postscript,
    "ppm_image": gen_ppm_image,
    "dot_graph": gen_dot_graph,
    "gnuplot_script": gen_gnuplot_script,
    "lua_script": gen_lua_script,
    "ruby_script": gen_ruby_script,
    "tcl_script": gen_tcl_script,
    "php_script": gen_php_script,
    "scheme_script": gen_scheme_script,
    "bc_script": gen_bc_script,
    "m4_macros": gen_m4_macros,
    "bison_grammar": gen_bison_grammar,
    "flex_spec": gen_flex_spec,
    "nasm_source": gen_nasm_source,
}
