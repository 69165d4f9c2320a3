// Reads a folded-stacks file with speedscope's own importer (npm `speedscope`, the bundle its
// app runs) and prints what speedscope makes of it as JSON: {total, frames: {name: [total, self]}}.
//
//   node speedscope_folded.mjs SPEEDSCOPE_PACKAGE_DIR FILE
//
// The importer is not exported by the bundle: it is found by its parser's regular expression
// (`/^(.*) (\d+)$/gm`, speedscope's src/import/bg-flamegraph.ts) and handed out at the start of
// the bundle's scope (its functions are hoisted). The bundle's last statement draws the app
// into document.body: reading document.body stops it there, every definition made.
import fs from 'node:fs'
import path from 'node:path'
import vm from 'node:vm'

const [pkg, file] = process.argv.slice(2)
const dir = path.join(pkg, 'dist', 'release')
const bundle = fs.readdirSync(dir).find(f => /^speedscope-.*\.js$/.test(f))
let src = fs.readFileSync(path.join(dir, bundle), 'utf8')
const parser = src.match(/function ([\w$]+)\(\w\)\{let \w=\[\];for\(let \w of \w\.splitLines\(\)\)\{let \w=\/\^\(\.\*\) \(\\d\+\)\$\/gm/)
if (!parser) throw new Error(`${bundle}: speedscope's folded-stacks parser not found`)
const importer = src.match(new RegExp(`function ([\\w$]+)\\(\\w\\)\\{let \\w=${parser[1].replace('$', '\\$')}\\(\\w\\)`))
if (!importer) throw new Error(`${bundle}: speedscope's folded-stacks importer not found`)
const head = '"use strict";(()=>{'
if (!src.startsWith(head)) throw new Error(`${bundle}: not the bundle shape expected`)
src = `${head}globalThis.__importFolded=${importer[1]};${src.slice(head.length)}`

const inert = new Proxy(function () {}, {
  get: (_t, k) => (k === Symbol.toPrimitive ? () => '' : inert),
  apply: () => inert,
  construct: () => inert,
})
const stop = new Error('stop before drawing the app')
const documentStub = new Proxy({}, {
  get: (_t, k) => {
    if (k === 'body') throw stop
    return inert
  },
})
const ctx = {
  console: { log() {}, warn() {}, error() {} }, self: inert, global: inert, window: inert,
  document: documentStub, navigator: inert, location: inert, localStorage: inert,
  requestAnimationFrame: () => 0, addEventListener() {}, devicePixelRatio: 1,
  setTimeout, clearTimeout, setInterval, clearInterval, URL, TextDecoder, TextEncoder, Blob,
}
vm.createContext(ctx)
try {
  vm.runInContext(src, ctx)
} catch (err) {
  if (err !== stop) throw new Error(`${bundle}: ${err.message}`)
}

const text = fs.readFileSync(file, 'utf8')
const contents = { splitLines: () => text.split('\n'), firstChunk: () => text }
const profile = ctx.__importFolded(contents)
const frames = {}
profile.forEachFrame(f => { frames[f.name] = [f.getTotalWeight(), f.getSelfWeight()] })
process.stdout.write(JSON.stringify({ total: profile.getTotalWeight(), frames }) + '\n')
