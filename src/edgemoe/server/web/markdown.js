// Markdown → DOM nodes, safely: model text only ever becomes text nodes (textContent),
// never HTML. Covers what chat answers use: fenced code blocks, headings, lists, quotes,
// rules, paragraphs; inline code, bold, italics and http(s) links.

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w#+.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;

function el(tag, cls, children) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  for (const c of children || []) node.append(c);
  return node;
}

// Inline spans, left to right; anything unmatched stays literal text.
const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*\n]+?)\*\*|__([^_\n]+?)__|\*([^*\s][^*\n]*?)\*|\b_([^_\s][^_\n]*?)_\b|\[([^\]\n]+)\]\((\S+?)\)|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/g;

export function inline(text) {
  const out = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) out.push(document.createTextNode(text.slice(last, m.index)));
    last = m.index + m[0].length;
    if (m[1]) out.push(el("code", null, [m[2].trim() || m[2]]));
    else if (m[3] || m[4]) out.push(el("strong", null, inline(m[3] || m[4])));
    else if (m[5] || m[6]) out.push(el("em", null, inline(m[5] || m[6])));
    else if (m[7]) out.push(link(m[8], inline(m[7]), m[0]));
    else if (m[9]) out.push(link(m[9], [m[9]], m[0]));
  }
  if (last < text.length) out.push(document.createTextNode(text.slice(last)));
  return out;
}

function link(href, children, literal) {
  // Only web links: javascript:, data: and the like stay plain text.
  if (!/^https?:\/\//i.test(href)) return document.createTextNode(literal);
  const a = el("a", null, children);
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  return a;
}

function paragraph(lines) {
  const p = el("p");
  lines.forEach((line, i) => {
    if (i) p.append(el("br"));
    p.append(...inline(line));
  });
  return p;
}

function codeBlock(lang, lines) {
  const code = el("code", lang ? "language-" + lang.replace(/[^\w-]/g, "") : null, [lines.join("\n")]);
  const pre = el("pre", "code", [code]);
  if (lang) pre.dataset.lang = lang;
  return pre;
}

function list(items) {
  const ordered = /\d/.test(items[0].marker);
  const node = el(ordered ? "ol" : "ul");
  if (ordered) node.start = parseInt(items[0].marker, 10) || 1;
  for (const item of items) node.append(el("li", null, inline(item.text)));
  return node;
}

// Blocks of `text` as an array of nodes.
export function blocks(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let para = [];
  const flush = () => { if (para.length) out.push(paragraph(para)); para = []; };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      flush();
      const body = [];
      const close = new RegExp("^\\s{0,3}" + fence[1][0] + "{" + fence[1].length + ",}\\s*$");
      while (++i < lines.length && !close.test(lines[i])) body.push(lines[i]);
      out.push(codeBlock(fence[2], body));  // an unclosed fence (still streaming) runs to the end
      continue;
    }
    let m;
    if (!line.trim()) { flush(); continue; }
    if (RULE.test(line)) { flush(); out.push(el("hr")); continue; }
    if ((m = HEADING.exec(line))) { flush(); out.push(el("h" + Math.min(m[1].length + 2, 6), null, inline(m[2]))); continue; }
    if ((m = QUOTE.exec(line))) {
      flush();
      const quoted = [m[1]];
      while (i + 1 < lines.length && (m = QUOTE.exec(lines[i + 1]))) { quoted.push(m[1]); i++; }
      out.push(el("blockquote", null, blocks(quoted.join("\n"))));
      continue;
    }
    if ((m = ITEM.exec(line))) {
      flush();
      const items = [{ marker: m[2], text: m[3] }];
      while (i + 1 < lines.length) {
        const next = ITEM.exec(lines[i + 1]);
        if (next && /\d/.test(next[2]) === /\d/.test(m[2])) { items.push({ marker: next[2], text: next[3] }); i++; }
        else if (lines[i + 1].trim() && /^\s{2,}/.test(lines[i + 1])) { items[items.length - 1].text += " " + lines[i + 1].trim(); i++; }
        else break;
      }
      out.push(list(items));
      continue;
    }
    para.push(line);
  }
  flush();
  return out;
}

export function renderMarkdown(container, text) {
  container.replaceChildren(...blocks(text));
}
