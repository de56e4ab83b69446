// Vivarium's JavaScript and TypeScript kernel: one Node process per code
// context, started by kernels.py inside the sandbox (see its doc for the
// protocol). Cells run in this process's global scope with vm, so
// variables, functions and top-level const/let live from one cell to the
// next; the value of a cell's last expression is its result. Top-level
// await is rewritten as Node's own REPL does it. console output is the
// sandbox's stdout and stderr. TypeScript cells have their types stripped
// (stripTypes below: what it supports is listed there).
'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const Module = require('module');

const [reqFd, evtFd, ackFd] = (process.env.VIVARIUM_KERNEL_FDS || '').split(',').map(Number);
delete process.env.VIVARIUM_KERNEL_FDS;
const typescript = process.argv[2] === 'typescript';
const kernelFile = __filename;

let processTopLevelAwait = null;
try {
  processTopLevelAwait = require('internal/repl/await').processTopLevelAwait;
} catch {
  // Without --expose-internals: top-level await runs in an async function
  // of its own (see evaluate).
}

function writeAll(fd, text) {
  const buf = Buffer.from(text, 'utf8');
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(fd, buf, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

function send(ev) {
  writeAll(evtFd, JSON.stringify(ev) + '\n');
}

// waitAck blocks until the runner has passed a result on.
function waitAck() {
  const b = Buffer.alloc(1);
  for (;;) {
    let n;
    try {
      n = fs.readSync(ackFd, b, 0, 1, null);
    } catch (e) {
      if (e.code === 'EAGAIN') continue;
      throw e;
    }
    if (n === 0) process.exit(0); // the runner is gone
    if (b[0] === 10) return;
  }
}

// mimeBundle returns a value's representations by MIME type. An object may
// offer its own through Symbol.for('Jupyter.display'), as in Deno's and
// tslab's kernels.
function mimeBundle(value) {
  const data = {};
  const display = value !== null && (typeof value === 'object' || typeof value === 'function')
    ? value[Symbol.for('Jupyter.display')] : undefined;
  if (typeof display === 'function') {
    const own = display.call(value);
    if (own && typeof own === 'object') {
      for (const [mime, v] of Object.entries(own)) {
        if (typeof v === 'string') data[mime] = v;
        else if (mime === 'application/json') data[mime] = v;
        else if (Buffer.isBuffer(v) || v instanceof Uint8Array) data[mime] = Buffer.from(v).toString('base64');
      }
    }
  }
  if (!('text/plain' in data)) {
    data['text/plain'] = typeof value === 'string' ? value : util.inspect(value, { depth: 4, maxArrayLength: 200 });
  }
  return data;
}

function emit(value, main) {
  send({ type: 'result', data: mimeBundle(value), main });
  waitAck();
}

// display(...values) shows values as results, as IPython's display().
globalThis.display = (...values) => {
  for (const v of values) emit(v, false);
};

// A cell's require and import resolve from the context's directory, as in
// Node's REPL.
function setRequire() {
  globalThis.require = Module.createRequire(path.join(process.cwd(), '<cell>'));
}

// Static imports are not allowed in a script: the simple forms become
// require calls ("npm:" specifiers, as Deno writes them, lose the prefix).
function rewriteImports(code) {
  const spec = `['"](?:npm:|node:)?([^'"\\n]+)['"]`;
  const ns = (s) => `require(${JSON.stringify(s)})`;
  return code
    .replace(new RegExp(`^([ \\t]*)import\\s+\\*\\s+as\\s+([\\w$]+)\\s+from\\s+${spec}[ \\t]*;?`, 'gm'),
      (m, ind, name, s) => `${ind}const ${name} = ${ns(s)};`)
    .replace(new RegExp(`^([ \\t]*)import\\s+([\\w$]+)\\s*(?:,\\s*\\{([^}]*)\\})?\\s+from\\s+${spec}[ \\t]*;?`, 'gm'),
      (m, ind, name, named, s) => `${ind}const ${name} = __vivariumDefault(${ns(s)});` +
        (named ? ` const {${named.replace(/\bas\b/g, ':')}} = ${ns(s)};` : ''))
    .replace(new RegExp(`^([ \\t]*)import\\s+\\{([^}]*)\\}\\s+from\\s+${spec}[ \\t]*;?`, 'gm'),
      (m, ind, named, s) => `${ind}const {${named.replace(/\bas\b/g, ':')}} = ${ns(s)};`)
    .replace(new RegExp(`^([ \\t]*)import\\s+${spec}[ \\t]*;?`, 'gm'), (m, ind, s) => `${ind}${ns(s)};`);
}
globalThis.__vivariumDefault = (m) => (m && m.__esModule && 'default' in m ? m.default : m);

let interruptCell = null; // rejects the awaited promise of the running cell

process.on('SIGINT', () => {
  // Outside a synchronous run (breakOnSigint covers that): end the wait of
  // the cell, whose promise goes on unobserved.
  if (interruptCell) interruptCell(new InterruptedError());
});

class InterruptedError extends Error {
  constructor() {
    super('the cell was interrupted');
    this.name = 'KeyboardInterrupt';
  }
}

// Errors of code the cell left running: printed, the kernel lives on.
process.on('uncaughtException', (e) => {
  process.stderr.write(`Uncaught ${e && e.stack ? e.stack : util.inspect(e)}\n`);
});
process.on('unhandledRejection', (e) => {
  process.stderr.write(`Unhandled rejection: ${e && e.stack ? e.stack : util.inspect(e)}\n`);
});

function interruptible(promise) {
  return new Promise((resolve, reject) => {
    interruptCell = reject;
    Promise.resolve(promise).then(resolve, reject);
  }).finally(() => {
    interruptCell = null;
  });
}

async function evaluate(code) {
  let src = rewriteImports(typescript ? stripTypes(code) : code);
  let wrapped = null;
  if (processTopLevelAwait) {
    try {
      wrapped = processTopLevelAwait(src);
    } catch {
      wrapped = null; // a syntax error: running src reports it
    }
  }
  const opts = { filename: '<cell>', breakOnSigint: true, displayErrors: false };
  if (wrapped !== null) {
    const r = await interruptible(vm.runInThisContext(wrapped, opts));
    return r ? r.value : undefined;
  }
  try {
    return vm.runInThisContext(src, opts);
  } catch (e) {
    if (!processTopLevelAwait && e instanceof SyntaxError && /await/.test(e.message)) {
      // No REPL rewriting: the cell runs as an async function's body, its
      // declarations local to it.
      return interruptible(vm.runInThisContext(`(async () => {\n${src}\n})()`, opts));
    }
    throw e;
  }
}

function errorEvent(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    const stack = String(e.stack || `${e.name}: ${e.message}`)
      .split('\n').filter((l) => !l.includes(kernelFile) && !/\((node:internal\/|node:vm:)/.test(l) && !/ at (node:internal\/|node:vm:)/.test(l))
      .join('\n');
    let name = e.name || 'Error';
    let value = e.message === undefined ? '' : String(e.message);
    if (e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
      name = 'KeyboardInterrupt';
      value = 'the cell was interrupted';
    }
    return { type: 'error', name, value, traceback: stack + '\n' };
  }
  return { type: 'error', name: 'Error', value: util.inspect(e), traceback: `Uncaught ${util.inspect(e)}\n` };
}

async function runCell(code, env) {
  const saved = {};
  for (const [k, v] of Object.entries(env)) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = v;
  }
  let status = 0;
  try {
    setRequire();
    const value = await evaluate(code);
    if (value !== undefined) emit(value, true);
  } catch (e) {
    status = 1;
    send(errorEvent(e));
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
  send({ type: 'done', code: status });
}

function parseRequest(line) {
  const parts = line.trim().split(' ');
  if (parts[0] !== 'cell' || parts.length < 2) return null;
  const hex = (h) => Buffer.from(h, 'hex').toString('utf8');
  const env = {};
  for (const kv of parts.slice(2)) {
    const i = kv.indexOf('=');
    if (i > 0) env[hex(kv.slice(0, i))] = hex(kv.slice(i + 1));
  }
  return { code: hex(parts[1]), env };
}

// stripTypes removes TypeScript's type syntax, leaving JavaScript, without
// a compiler: a tokenizer and a few rules. Supported: annotations on
// variables, parameters (optional ones too) and return types; interfaces
// and type aliases; `as` casts and `as const`; non-null `!`; generic
// parameters of functions and classes; `implements`; access modifiers and
// `readonly` on class members; `declare` statements. Not supported (the
// cell fails with the resulting SyntaxError): enums, namespaces,
// decorators, constructor parameter properties, and type arguments at
// call sites (f<number>(x)).
function stripTypes(code) {
  const toks = tokenize(code);
  const out = [];
  const sig = []; // indices into out of significant tokens
  const stack = []; // open brackets: {ch, q: pending '?' count, cls: class body}
  let pendingClass = false;
  let topQ = 0; // pending '?' outside any bracket
  const prevSig = (n = 1) => (sig.length >= n ? out[sig[sig.length - n]] : null);
  const isExprEnd = (t) => t && (t.kind === 'id' || t.kind === 'num' || t.kind === 'str' || t.v === ')' || t.v === ']');
  const push = (t) => {
    out.push(t);
    if (t.kind !== 'ws') sig.push(out.length - 1);
  };
  // next significant token index from i
  const nextSig = (i) => {
    while (i < toks.length && toks[i].kind === 'ws') i++;
    return i;
  };
  // skipType returns the index after a type starting at i; stops (at
  // bracket depth 0) at one of the stop tokens.
  const skipType = (i, stops) => {
    let depth = 0;
    let first = true;
    let sawArrowGroup = false;
    for (; i < toks.length; i++) {
      const t = toks[i];
      if (t.kind === 'ws') {
        if (depth === 0 && t.nl) {
          const j = nextSig(i);
          const prev = prevTypeTok;
          if (j < toks.length && !['|', '&', '.', '<', '=>', '[', '?', ':'].includes(toks[j].v) &&
              !(prev && ['|', '&', '.', '<', '=>', ':', ','].includes(prev.v))) return i;
        }
        continue;
      }
      if (depth === 0 && !first && stops.includes(t.v)) {
        if (t.v === '=>' && sawArrowGroup) {
          sawArrowGroup = false;
        } else if (t.v === '{' && prevTypeTok && ['|', '&', '=>'].includes(prevTypeTok.v)) {
          // an object type after an operator
        } else {
          return i;
        }
      }
      if ('([{<'.includes(t.v)) {
        if (depth === 0 && t.v === '(' && (first || (prevTypeTok && ['|', '&', ':', '=>'].includes(prevTypeTok.v)))) sawArrowGroup = true;
        depth++;
      } else if (t.v === '>>') {
        depth -= 2;
      } else if (')]}>'.includes(t.v)) {
        if (depth === 0) return i;
        depth--;
      }
      prevTypeTok = t;
      first = false;
    }
    return i;
  };
  let prevTypeTok = null;
  // skipDecl skips a declaration to its end: ';', an interface's closing
  // brace, or a newline at depth 0 not continued by an operator.
  const skipDecl = (i) => {
    let depth = 0;
    let last = null;
    for (; i < toks.length; i++) {
      const t = toks[i];
      if (t.kind === 'ws') {
        if (depth === 0 && t.nl && last && !['|', '&', '=', ',', '<', '=>', ':', '{', '('].includes(last.v)) {
          const j = nextSig(i);
          if (j >= toks.length || !['|', '&', '{', '=', '=>', '.', '?', ':'].includes(toks[j].v)) return i;
        }
        continue;
      }
      if ('([{<'.includes(t.v)) depth++;
      else if (')]}>'.includes(t.v)) {
        depth--;
        if (depth === 0 && t.v === '}' && last && last.kind !== 'op' && i > 0) {
          // an interface body ends the declaration
          const j = nextSig(i + 1);
          if (isInterface) return i + 1;
          if (j >= toks.length || toks[j].v !== '|' && toks[j].v !== '&') {
            last = t;
            continue;
          }
        }
      } else if (t.v === '>>') depth -= 2;
      else if (depth <= 0 && t.v === ';') return i + 1;
      last = t;
    }
    return i;
  };
  let isInterface = false;
  const atStatementStart = () => {
    const p = prevSig();
    return !p || [';', '{', '}'].includes(p.v) || (p.kind === 'id' && p.v === 'export') || lastWasNewline();
  };
  // lastWasNewline: a newline follows the last significant token, which
  // could end a statement (not an operator).
  const lastWasNewline = () => {
    for (let k = out.length - 1; k >= 0; k--) {
      if (out[k].kind !== 'ws') {
        const p = out[k];
        return p.kind !== 'op' || [')', ']', '}'].includes(p.v) ? sawNl(k) : false;
      }
    }
    return true;
  };
  const sawNl = (k) => out.slice(k + 1).some((t) => t.nl);

  for (let i = 0; i < toks.length; i++) {
    const t = toks[i];
    const top = stack[stack.length - 1];
    if (t.kind === 'ws' || t.kind === 'str' || t.kind === 'num') {
      push(t);
      continue;
    }
    if (t.kind === 'id') {
      const j = nextSig(i + 1);
      const nt = toks[j];
      if ((t.v === 'interface' || t.v === 'type') && nt && nt.kind === 'id' && atStatementStart()) {
        const k = nextSig(j + 1);
        if (t.v === 'interface' || (toks[k] && (toks[k].v === '=' || toks[k].v === '<'))) {
          isInterface = t.v === 'interface';
          if (prevSig() && prevSig().v === 'export') out.splice(sig.pop(), 1);
          i = skipDecl(i) - 1;
          isInterface = false;
          continue;
        }
      }
      if (t.v === 'declare' && nt && nt.kind === 'id' && atStatementStart()) {
        isInterface = false;
        i = skipDecl(i) - 1;
        continue;
      }
      if (t.v === 'as' && (isExprEnd(prevSig()) || (prevSig() && prevSig().v === '}'))) {
        prevTypeTok = null;
        i = skipType(j, [')', ',', ';', ']', '}', '=', '==', '===', '!=', '!==', '&&', '||', '??', '?', ':', '+', '-', '*', '/', '.']) - 1;
        continue;
      }
      if (t.v === 'implements' && pendingClass) {
        while (i + 1 < toks.length && toks[i + 1].v !== '{') i++;
        continue;
      }
      if (top && top.cls && ['public', 'private', 'protected', 'readonly', 'abstract', 'override'].includes(t.v) &&
          nt && (nt.kind === 'id' || nt.v === '[') && [';', '{', '}', null].includes(prevSig() ? prevSig().v : null)) {
        i = j - 1; // drop the modifier and the space after it
        continue;
      }
      if (t.v === 'class') pendingClass = true;
      push(t);
      // generic parameters after a function's or class's name
      const p2 = prevSig(2);
      if (nt && nt.v === '<' && p2 && (p2.v === 'function' || p2.v === 'class' || p2.v === 'new')) {
        prevTypeTok = null;
        let depth = 0;
        let k = j;
        for (; k < toks.length; k++) {
          if (toks[k].v === '<') depth++;
          else if (toks[k].v === '>') depth--;
          else if (toks[k].v === '>>') depth -= 2;
          if (depth <= 0) break;
        }
        i = k;
      }
      continue;
    }
    // punctuation
    const v = t.v;
    if (v === '{') {
      stack.push({ ch: '{', q: 0, cls: pendingClass });
      pendingClass = false;
      push(t);
      continue;
    }
    if (v === '(' || v === '[') {
      stack.push({ ch: v, q: 0 });
      push(t);
      continue;
    }
    if (v === ')' || v === ']' || v === '}') {
      stack.pop();
      push(t);
      // a return type: `): T {` or `): T =>`, not a ternary's `) :`
      if (v === ')') {
        const j = nextSig(i + 1);
        const cur = stack[stack.length - 1];
        if (toks[j] && toks[j].v === ':' && !(cur && cur.q > 0) && !(stack.length === 0 && topQ > 0)) {
          prevTypeTok = null;
          i = skipType(nextSig(j + 1), ['{', '=>', ';', ',', ')', '=']) - 1;
        }
      }
      continue;
    }
    if (v === '<' && isArrowGenerics(toks, i, prevSig())) {
      let depth = 0;
      let k = i;
      for (; k < toks.length; k++) {
        if (toks[k].v === '<') depth++;
        else if (toks[k].v === '>') depth--;
        if (depth <= 0) break;
      }
      i = k;
      continue;
    }
    if (v === '?') {
      const j = nextSig(i + 1);
      // an optional parameter or member: `x?: T`
      if (toks[j] && toks[j].v === ':' && (top && (top.ch === '(' || top.cls))) {
        continue;
      }
      if (top) top.q++;
      else topQ++;
      push(t);
      continue;
    }
    if (v === '!' && isExprEnd(prevSig())) {
      const j = nextSig(i + 1);
      if (toks[j] && ['.', ')', ';', ',', '[', ']', '}', '='].includes(toks[j].v)) continue; // non-null assertion
    }
    if (v === ':') {
      const p = prevSig();
      const p2 = prevSig(2);
      let annotation = false;
      if (top && top.ch === '(' && top.q === 0) annotation = true; // a parameter
      else if (top && top.ch === '(' && top.q > 0) top.q--; // a ternary's
      else if (p && p.kind === 'id' && p2 && ['let', 'const', 'var'].includes(p2.v)) annotation = true;
      else if (top && top.cls && p && (p.kind === 'id' || p.v === ']') && !(top.q > 0)) annotation = true; // a field
      else if (top && top.q > 0) top.q--;
      else if (!top && topQ > 0) topQ--;
      if (annotation) {
        prevTypeTok = null;
        i = skipType(nextSig(i + 1), top && top.ch === '(' ? [',', ')', '='] : ['=', ';', ',', ')', '}', 'in', 'of']) - 1;
        continue;
      }
    }
    push(t);
  }
  return out.map((t) => t.v).join('');
}


// isArrowGenerics: `<T>(x: T) => ...` or `<T,>(...)` where an expression
// starts.
function isArrowGenerics(toks, i, prev) {
  if (prev && (prev.kind === 'id' || prev.kind === 'num' || prev.v === ')' || prev.v === ']')) return false;
  let depth = 0;
  let k = i;
  for (; k < toks.length; k++) {
    const v = toks[k].v;
    if (v === '<') depth++;
    else if (v === '>') {
      depth--;
      if (depth === 0) break;
    } else if (toks[k].kind !== 'ws' && toks[k].kind !== 'id' && v !== ',' && v !== 'extends' && v !== '=') return false;
  }
  while (++k < toks.length && toks[k].kind === 'ws');
  return k < toks.length && toks[k].v === '(';
}

// tokenize splits source into tokens: whitespace and comments ('ws', nl
// when it holds a newline), strings and templates and regular expressions
// ('str'), numbers ('num'), identifiers ('id') and punctuation ('op').
function tokenize(src) {
  const toks = [];
  let i = 0;
  const n = src.length;
  const lastSig = () => {
    for (let k = toks.length - 1; k >= 0; k--) if (toks[k].kind !== 'ws') return toks[k];
    return null;
  };
  const regexAllowed = () => {
    const p = lastSig();
    if (!p) return true;
    if (p.kind === 'num' || p.kind === 'str') return false;
    if (p.kind === 'id') return ['return', 'typeof', 'case', 'do', 'else', 'in', 'of', 'new', 'delete', 'void', 'throw', 'yield', 'await'].includes(p.v);
    return ![')', ']', '}'].includes(p.v);
  };
  const puncts = ['>>>=', '...', '===', '!==', '**=', '<<=', '>>=', '&&=', '||=', '??=', '=>', '==', '!=', '<=', '>=', '&&', '||', '??', '?.', '++', '--', '+=', '-=', '*=', '/=', '%=', '&=', '|=', '^=', '**', '<<'];
  while (i < n) {
    const c = src[i];
    const start = i;
    if (/\s/.test(c)) {
      while (i < n && /\s/.test(src[i])) i++;
      const v = src.slice(start, i);
      toks.push({ kind: 'ws', v, nl: v.includes('\n') });
      continue;
    }
    if (c === '/' && src[i + 1] === '/') {
      while (i < n && src[i] !== '\n') i++;
      toks.push({ kind: 'ws', v: src.slice(start, i), nl: false });
      continue;
    }
    if (c === '/' && src[i + 1] === '*') {
      const e = src.indexOf('*/', i + 2);
      i = e < 0 ? n : e + 2;
      const v = src.slice(start, i);
      toks.push({ kind: 'ws', v, nl: v.includes('\n') });
      continue;
    }
    if (c === '"' || c === "'") {
      i++;
      while (i < n && src[i] !== c && src[i] !== '\n') i += src[i] === '\\' ? 2 : 1;
      i++;
      toks.push({ kind: 'str', v: src.slice(start, i) });
      continue;
    }
    if (c === '`') {
      i++;
      let depth = 0;
      while (i < n) {
        if (src[i] === '\\') {
          i += 2;
          continue;
        }
        if (depth === 0 && src[i] === '`') break;
        if (src[i] === '$' && src[i + 1] === '{') {
          depth++;
          i += 2;
          continue;
        }
        if (depth > 0 && src[i] === '}') depth--;
        else if (depth > 0 && src[i] === '{') depth++;
        i++;
      }
      i++;
      toks.push({ kind: 'str', v: src.slice(start, i) });
      continue;
    }
    if (c === '/' && regexAllowed()) {
      i++;
      let cls = false;
      while (i < n && src[i] !== '\n') {
        if (src[i] === '\\') {
          i += 2;
          continue;
        }
        if (src[i] === '[') cls = true;
        else if (src[i] === ']') cls = false;
        else if (src[i] === '/' && !cls) break;
        i++;
      }
      i++;
      while (i < n && /[a-z]/i.test(src[i])) i++;
      toks.push({ kind: 'str', v: src.slice(start, i) });
      continue;
    }
    if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(src[i + 1] || ''))) {
      while (i < n && /[0-9a-zA-Z_.]/.test(src[i])) i++;
      toks.push({ kind: 'num', v: src.slice(start, i) });
      continue;
    }
    if (/[\p{L}\p{Nl}$_\\]/u.test(c) || c === '#') {
      i++;
      while (i < n && /[\p{L}\p{Nl}\p{Mn}\p{Mc}\p{Nd}\p{Pc}$\u200c\u200d]/u.test(src[i])) i++;
      toks.push({ kind: 'id', v: src.slice(start, i) });
      continue;
    }
    const p = puncts.find((q) => src.startsWith(q, i));
    const v = p || c;
    i += v.length;
    toks.push({ kind: 'op', v });
  }
  return toks;
}

// The request pipe is read as a stream: between cells the event loop runs
// (timers and servers the cells started go on).
if (require.main === module && Number.isInteger(reqFd)) {
  const input = new net.Socket({ fd: reqFd, readable: true, writable: false });
  let buf = '';
  let queue = Promise.resolve();
  input.setEncoding('utf8');
  input.on('data', (chunk) => {
    buf += chunk;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      const req = parseRequest(line);
      if (req) queue = queue.then(() => runCell(req.code, req.env));
    }
  });
  input.on('end', () => process.exit(0));
  input.on('error', () => process.exit(0));
} else {
  module.exports = { stripTypes, rewriteImports, mimeBundle };
}
