// gen.mjs writes testdata/keyhash_extra.json: ground truth from real
// JavaScript for the Go port of the TS original's deriveJobKey (jobkey.go,
// jsonpointer.go, jsformat.go). Rerun it from the repository root with
// node 18 or later after changing the cases below:
//
//	node internal/jsvectors/gen.mjs > testdata/keyhash_extra.json
//
// The output is deterministic: the random cases come from a seeded generator.
// The script re-implements only what the TS original does, in a few lines:
// JSON.parse of the payload (bytes go through TextDecoder first, as a message
// body would), resolveJsonPointer, String(v) for the display key,
// JSON.stringify({version: 1, segments}) and SHA-256 over its UTF-8 bytes.
//
// Output sections:
//   cases:   {name, service, jobType, payload (JSON text) or payloadHex
//            (bytes), template} and either {key, keyHex, keyHash, kvKey}
//            or {error: "json" | "pointer"}. keyHex is the display key in
//            WTF-8 (a lone surrogate as 3 bytes), which a JSON file cannot
//            carry through a UTF-8 decoder.
//   numbers: {bits, string}: a double (IEEE bits, hex) and String(x).
//   numberTexts: {text, bits, string}: JSON.parse(text) and its String().
//   strings: {json, valueHex, stringify}: a JSON string literal, its value
//            in WTF-8 and JSON.stringify of that value.

import { createHash } from "node:crypto";

// ---- the TS original's key derivation, re-implemented -------------------

function resolveJsonPointer(payload, pointer) {
  const tokens = pointer.slice(1).split("/").map((t) =>
    t.replaceAll("~1", "/").replaceAll("~0", "~")
  );
  let cur = payload;
  for (const t of tokens) {
    if (Array.isArray(cur)) {
      if (!/^0$|^[1-9][0-9]*$/.test(t)) return undefined;
      cur = cur[Number(t)];
      continue;
    }
    if (cur !== null && typeof cur === "object") {
      cur = cur[t];
      continue;
    }
    return undefined;
  }
  return cur;
}

function derive(service, jobType, payload, template) {
  const segments = template.map((s) => {
    if (!s.startsWith("/")) return s;
    const v = resolveJsonPointer(payload, s);
    const ok = typeof v === "string" ||
      (typeof v === "number" && Number.isFinite(v)) || typeof v === "boolean";
    if (!ok) throw new Error(`pointer ${s}`);
    return v;
  });
  const key = segments.map((s) => String(s)).join(":");
  const keyHash = createHash("sha256")
    .update(new TextEncoder().encode(JSON.stringify({ version: 1, segments })))
    .digest("hex");
  return { key, keyHash, kvKey: `${service}.${jobType}.${keyHash}` };
}

// ---- helpers ------------------------------------------------------------

// wtf8Hex encodes a JavaScript string (UTF-16, possibly with lone
// surrogates) as WTF-8 and returns it in hex.
function wtf8Hex(s) {
  const out = [];
  for (let i = 0; i < s.length; i++) {
    let c = s.charCodeAt(i);
    if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d < 0xe000) {
        c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        i++;
      }
    }
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) {
      out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    } else {
      out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63),
        0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    }
  }
  return Buffer.from(out).toString("hex");
}

function bitsHex(x) {
  const dv = new DataView(new ArrayBuffer(8));
  dv.setFloat64(0, x);
  return dv.getBigUint64(0).toString(16).padStart(16, "0");
}

function fromBits(hex) {
  const dv = new DataView(new ArrayBuffer(8));
  dv.setBigUint64(0, BigInt("0x" + hex));
  return dv.getFloat64(0);
}

// mulberry32: a small seeded PRNG, so the output does not change between runs.
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = rng(20240611);
const randInt = (n) => Math.floor(rand() * n);
const pick = (xs) => xs[randInt(xs.length)];

// ---- cases --------------------------------------------------------------

const cases = [];

function add(name, payload, template, opts = {}) {
  const service = opts.service ?? "svc";
  const jobType = opts.jobType ?? "job";
  const c = { name, service, jobType };
  let parsed;
  let text;
  if (payload instanceof Uint8Array) {
    c.payloadHex = Buffer.from(payload).toString("hex");
    text = new TextDecoder().decode(payload);
  } else {
    // The Go tests pass this text as bytes, so JavaScript reads it as bytes
    // too (TextDecoder drops a leading byte order mark).
    c.payload = payload;
    text = new TextDecoder().decode(new TextEncoder().encode(payload));
  }
  c.template = template;
  try {
    parsed = JSON.parse(text);
  } catch {
    c.error = "json";
    cases.push(c);
    return;
  }
  try {
    const d = derive(service, jobType, parsed, template);
    c.key = d.key;
    c.keyHex = wtf8Hex(d.key);
    c.keyHash = d.keyHash;
    c.kvKey = d.kvKey;
  } catch {
    c.error = "pointer";
  }
  cases.push(c);
}

const numberLiterals = [
  "0", "-0", "0.0", "-0.0", "0e10", "1", "-1", "100", "0.1", "0.2", "0.3",
  "0.30000000000000004", "4.35", "2.5", "-17", "1e20", "1e21", "1e+21",
  "1E21", "123456789012345678901", "999999999999999999999", "1e-6",
  "0.000001", "1e-7", "0.0000001", "1.5e-7", "123e-20", "1.2345e25",
  "12345678901234567890", "123456789012345678901234567890",
  "9007199254740992", "9007199254740993", "9007199254740995",
  "-9007199254740993", "5e-324", "4.9e-324", "2e-324", "3e-324", "1e-400",
  "-1e-400", "2.2250738585072011e-308", "2.2250738585072014e-308",
  "1.7976931348623157e308", "1.7976931348623158e308",
  "1.7976931348623159e308", "1e308", "1e309", "1e400", "-1e400",
  "0.1000000000000000055511151231257827021181583404541015625",
  "1" + "0".repeat(400), "0." + "0".repeat(400) + "1",
  "3." + "14159265358979323846".repeat(60), "1e-5", "1.1e-6", "1e100",
  "1.0", "1.50", "100e-2", "0.5e1", "1E+2", "1e-0", "-1e-7", "-1e21",
  "2.5e-5", "144115188075855877", "4294967296", "4294967295.5",
];
for (const lit of numberLiterals) {
  add(`number ${lit.length > 40 ? lit.slice(0, 37) + "..." : lit}`,
    `{"v":${lit}}`, ["/v"]);
}

const stringLiterals = [
  String.raw`"a\"b\\c\/d"`,
  String.raw`"\b\f\n\r\t"`,
  JSON.stringify(Array.from({ length: 32 }, (_, i) => String.fromCharCode(i)).join("")),
  String.raw`"\u0000\u001f\u001F\u007f\u0080\u009f"`,
  `"\u007f\u0080\u00ff"`,
  String.raw`"\u2028\u2029"`,
  `"\u2028\u2029"`,
  `"<>&'"`,
  String.raw`"\u003c\u003e\u0026"`,
  `"😀 ☕ café 日本語"`,
  String.raw`"\ud83d\ude00"`,
  String.raw`"\uD83D\uDE00"`,
  String.raw`"\ud800"`,
  String.raw`"\udc00"`,
  String.raw`"\udfff"`,
  String.raw`"\ud800\ud800"`,
  String.raw`"\udc00\ud800"`,
  String.raw`"\ud83d\u0041"`,
  String.raw`"x\ud83d"`,
  String.raw`"\ud83d\\ude00"`,
  String.raw`"\ud83d\ude00\ude00"`,
  String.raw`"\ud83d\ud83d\ude00"`,
  String.raw`"\u00e9 é"`,
  String.raw`"\ufeff\ufffe\uffff"`,
  `"\ufeff"`,
  String.raw`"\u0041\u00410\u0030"`,
  `"${"long ".repeat(200)}"`,
  `""`,
  `":"`,
  `" "`,
];
for (const lit of stringLiterals) {
  add(`string ${lit.length > 40 ? lit.slice(0, 37) + "..." : lit}`,
    `{"v":${lit}}`, ["/v"]);
  add(`string ${lit.length > 30 ? lit.slice(0, 27) + "..." : lit} with literals`,
    `{"v":${lit}}`, ["pre", "/v", "post"]);
}

// Bytes that are not valid UTF-8, decoded as TextDecoder decodes them.
const bytes = (...parts) =>
  Buffer.concat(parts.map((p) =>
    typeof p === "string" ? Buffer.from(p, "utf8") : Buffer.from(p)
  ));
add("bom", bytes([0xef, 0xbb, 0xbf], `{"v":"x"}`), ["/v"]);
add("bom twice", bytes([0xef, 0xbb, 0xbf, 0xef, 0xbb, 0xbf], `{"v":"x"}`), ["/v"]);
add("bom inside string", bytes(`{"v":"`, [0xef, 0xbb, 0xbf], `"}`), ["/v"]);
const badSeqs = [
  [0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xc2], [0xc2, 0x41],
  [0xe0, 0x80, 0x80], [0xe0, 0xa0], [0xe0, 0xa0, 0x41], [0xe2, 0x82],
  [0xe2, 0x82, 0x41], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf],
  [0xed, 0xa0, 0x80, 0xed, 0xb0, 0x80], [0xed, 0x9f, 0xbf], [0xef, 0xbf, 0xbf],
  [0xf0, 0x80, 0x80, 0x80], [0xf0, 0x90], [0xf0, 0x9f, 0x98],
  [0xf0, 0x9f, 0x98, 0x41], [0xf4, 0x8f, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80],
  [0xf5, 0x80, 0x80, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfe], [0xff],
  [0xc3, 0xa9, 0xff, 0xc3, 0xa9],
];
for (const seq of badSeqs) {
  const hex = Buffer.from(seq).toString("hex");
  add(`utf8 ${hex} in value`, bytes(`{"v":"a`, seq, `b"}`), ["/v"]);
  add(`utf8 ${hex} at end of value`, bytes(`{"v":"a`, seq, `"}`), ["/v"]);
  add(`utf8 ${hex} in member name`, bytes(`{"k`, seq, `":"v"}`), ["/k\ufffd"]);
  add(`utf8 ${hex} in member name twice`, bytes(`{"k`, seq, `":"v"}`), ["/k\ufffd\ufffd"]);
  add(`utf8 ${hex} outside string`, bytes(`{"v":1}`, seq), ["/v"]);
}

// Pointers.
add("pointer / is member ''", `{"":"empty name","a":1}`, ["/"]);
add("pointer // is '' in ''", `{"":{"":"deep"}}`, ["//"]);
add("pointer /a/ is '' in a", `{"a":{"":"x"}}`, ["/a/"]);
add("pointer / on array", `[1]`, ["/"]);
add("pointer ~0", `{"a~b":"tilde"}`, ["/a~0b"]);
add("pointer ~1", `{"a/b":"slash"}`, ["/a~1b"]);
add("pointer ~01 is ~1", `{"~1":"t1","/":"s"}`, ["/~01"]);
add("pointer ~10 is /0", `{"/0":"s0","~0":"t0"}`, ["/~10"]);
add("pointer ~0~1", `{"~/":"both"}`, ["/~0~1"]);
add("pointer name escaped in payload", String.raw`{"a\/b":"x","\u0063af\u00e9":"cafe"}`, ["/a~1b", "/café"]);
add("unicode names", `{"café":"c","日本":{"語":"j"},"😀":true,"\u2028":"ls"}`, ["/café", "/日本/語", "/😀", "/\u2028"]);
add("name with pair escape", String.raw`{"\ud83d\ude00":"smile"}`, ["/😀"]);
add("name differs only by nfc", `{"e\u0301":"decomposed","é":"composed"}`, ["/e\u0301", "/é"]);
add("name with quote and backslash", String.raw`{"a\"b\\c":"q"}`, ['/a"b\\c']);
add("name with control", String.raw`{"a\nb\u0000":"ctl"}`, ["/a\nb\u0000"]);
add("duplicate names last wins", `{"a":1,"a":2}`, ["/a"]);
add("duplicate names last wins deep", `{"a":{"b":1},"a":{"c":2}}`, ["/a/b"]);
add("duplicate names last wins deep 2", `{"a":{"b":1},"a":{"c":2}}`, ["/a/c"]);
add("duplicate names via escapes", String.raw`{"a":1,"\u0061":"escaped last"}`, ["/a"]);
add("array index 0", `{"a":[10,20,30]}`, ["/a/0", "/a/2"]);
add("array index 00", `{"a":[10,20]}`, ["/a/00"]);
add("array index -", `{"a":[10,20]}`, ["/a/-"]);
add("array index -1", `{"a":[10,20]}`, ["/a/-1"]);
add("array index +1", `{"a":[10,20]}`, ["/a/+1"]);
add("array index 1e0", `{"a":[10,20]}`, ["/a/1e0"]);
add("array index space", `{"a":[10,20]}`, ["/a/ 1"]);
add("array index huge", `{"a":[10,20]}`, ["/a/99999999999999999999"]);
add("array index length", `{"a":[10,20]}`, ["/a/length"]);
add("array index past end", `{"a":[]}`, ["/a/0"]);
add("array empty name", `{"a":[1]}`, ["/a/"]);
add("top-level array", `[[1,"x"],[true]]`, ["/0/1", "/1/0", "/0/0"]);
add("top-level string", `"str"`, ["/0"]);
add("top-level string length", `"str"`, ["/length"]);
add("top-level number", `42`, ["/"]);
add("top-level null", `null`, ["/a"]);
add("top-level true literal only", `true`, ["lit"]);
add("into string", `{"s":"abc"}`, ["/s/0"]);
add("into number", `{"n":5}`, ["/n/x"]);
add("into true", `{"b":true}`, ["/b/x"]);
add("object name that looks like index", `{"a":{"0":"zero","01":"oh-one"}}`, ["/a/0", "/a/01"]);
add("own __proto__", `{"__proto__":"own"}`, ["/__proto__"]);
add("inherited __proto__", `{}`, ["/__proto__"]);
add("inherited __proto__ deeper", `{}`, ["/__proto__/x"]);
add("inherited constructor", `{}`, ["/constructor"]);
add("inherited constructor name", `{}`, ["/constructor/name"]);
add("inherited toString", `{"a":{}}`, ["/a/toString"]);
add("own constructor", `{"constructor":"own"}`, ["/constructor"]);
add("own hasOwnProperty", `{"hasOwnProperty":false}`, ["/hasOwnProperty"]);
add("array own length never", `[1,2]`, ["/length"]);
add("whitespace", ` \t\r\n{ \t\r\n"a" \t\r\n: \t\r\n[ 1 , "two" , { "x" : null , "y" : false } ] \t\r\n} \t\r\n`, ["/a/1", "/a/2/y", "/a/0"]);
add("null value", `{"z":null}`, ["/z"]);
add("object value", `{"o":{"a":1}}`, ["/o"]);
add("array value", `{"o":[1]}`, ["/o"]);
add("empty template", `{}`, []);
add("empty literal", `{}`, [""]);
add("literal segments", `{}`, ["a\"b", "c\\d", "ü", "\n\u0001\u007f", "\u2028", "<>&", "😀", " ", ":"]);
add("literal and pointer look alike", `{"x":"/x"}`, ["x", "/x"]);
add("mixed", `{"t":"acme","n":-0.5,"b":false,"s":"\\u0000"}`, ["tenant", "/t", "/n", "/b", "/s"]);
add("other names", `{"a":"b"}`, ["/a"], { service: "Svc_1-x", jobType: "a=b/c-d_E" });
add("deep nesting", "[".repeat(3000) + `"bottom"` + "]".repeat(3000), Array.from({ length: 1 }, () => "/0".repeat(3000)));
add("deep nesting objects", `{"a":`.repeat(500) + `7` + "}".repeat(500), ["/a".repeat(500)]);
add("skip nested values", `{"a":{"x":[1,{"y":"}"},"]"],"z":"\\"}"},"b":"found"}`, ["/b"]);
add("skip strings with escapes", String.raw`{"x":"\"\\\"","y":"ok"}`, ["/y"]);

// Payloads JSON.parse refuses.
const badJSON = [
  "", " ", "{", "}", "[", "{\"a\":1,}", "[1,]", "[,1]", "01", "-01", "00",
  "1.", ".5", "-", "+1", "1e", "1e+", "-.5", "0x10", "{'a':1}", "{a:1}",
  "NaN", "Infinity", "-Infinity", "undefined", "\u00a0{}", "{}\u00a0",
  "\ufeff{}", "\"\t\"", "\"\n\"", "\"\u0000\"", "{\"a\":1} x", "{\"a\":1}{}",
  "\"\\x\"", "\"\\u12\"", "\"\\u12g4\"", "\"\\U0041\"", "\"\\'\"", "tru",
  "nul", "nulll", "truex", "{\"a\" 1}", "{\"a\":}", "{,}", "[1 2]",
  "/*c*/{}", "{}//c", "\"abc", "{\"a\":\"b}", "\u2028{}", "\f{}", "\v{}",
  "[1]]", "{\"a\":1}}", "[\"a\":1]", "{\"a\",1}", "{1:1}", "{null:1}",
];
for (const t of badJSON) add(`bad json ${JSON.stringify(t)}`, t, ["lit"]);
add("bad json with pointer", "{\"a\":1,}", ["/a"]);

// Random string values: each code unit written raw or escaped at random.
const unitPool = () => {
  const r = rand();
  if (r < 0.3) return 0x20 + randInt(0x5f);
  if (r < 0.4) return randInt(0x20);
  if (r < 0.45) return pick([0x22, 0x5c, 0x2f, 0x7f, 0x2028, 0x2029, 0xfeff, 0xfffd, 0xffff]);
  if (r < 0.6) return 0xd800 + randInt(0x800);
  if (r < 0.8) return 0x80 + randInt(0xd800 - 0x80);
  return 0xe000 + randInt(0x2000);
};
function randomUnits(n) {
  const units = [];
  for (let i = 0; i < n; i++) {
    if (rand() < 0.15) {
      const cp = 0x10000 + randInt(0x100000);
      units.push(0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
    } else units.push(unitPool());
  }
  return units;
}
// quoteRandomly writes a JSON string literal for the code units, choosing per
// unit among raw (where JSON allows it and it is not a lone surrogate), short
// escapes and \u escapes in either case.
function quoteRandomly(units) {
  let out = '"';
  for (let i = 0; i < units.length; i++) {
    const u = units[i];
    const isHigh = u >= 0xd800 && u < 0xdc00;
    const pairNext = isHigh && i + 1 < units.length && units[i + 1] >= 0xdc00 && units[i + 1] < 0xe000;
    const isSur = u >= 0xd800 && u < 0xe000;
    const canRaw = u >= 0x20 && u !== 0x22 && u !== 0x5c && (!isSur || pairNext);
    const short = { 0x22: '\\"', 0x5c: "\\\\", 0x2f: "\\/", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t" }[u];
    const r = rand();
    if (canRaw && r < 0.5) {
      out += String.fromCharCode(u);
      if (pairNext) { out += String.fromCharCode(units[i + 1]); i++; }
    } else if (short && r < 0.8) {
      out += short;
    } else {
      let h = u.toString(16).padStart(4, "0");
      if (rand() < 0.5) h = h.toUpperCase();
      out += "\\u" + h;
    }
  }
  return out + '"';
}
for (let n = 0; n < 300; n++) {
  const lit = quoteRandomly(randomUnits(1 + randInt(12)));
  add(`random string ${n}`, `{"v":${lit}}`, ["/v"]);
}

// Random member names, found through escaped pointers.
const escapePointerToken = (s) => s.replaceAll("~", "~0").replaceAll("/", "~1");
for (let n = 0; n < 150; n++) {
  // Names must be well-formed (a Go template is UTF-8), so no lone surrogates.
  let units = randomUnits(1 + randInt(6)).filter((u) => u < 0xd800 || u >= 0xe000);
  if (rand() < 0.5) units.push(pick([0x7e, 0x2f]), pick([0x30, 0x31, 0x7e, 0x2f]));
  const name = String.fromCharCode(...units);
  const decoy = String.fromCharCode(...units.slice(0, -1));
  const value = pick([`"s${n}"`, `${n}.5`, "true", "false", `-${n}e-9`]);
  const payload = `{${quoteRandomly([...decoy].map((c) => c.charCodeAt(0)))}:"decoy",` +
    `${quoteRandomly(units)}:${value}}`;
  add(`random name ${n}`, payload, ["/" + escapePointerToken(name)]);
}

// Random number literals.
const digits = (n, first19 = false) => {
  let s = first19 ? String(1 + randInt(9)) : "";
  while (s.length < n) s += String(randInt(10));
  return s;
};
for (let n = 0; n < 400; n++) {
  let lit = rand() < 0.3 ? "-" : "";
  lit += rand() < 0.2 ? "0" : digits(1 + randInt(25), true);
  if (rand() < 0.6) lit += "." + digits(1 + randInt(25));
  if (rand() < 0.6) {
    lit += pick(["e", "E"]) + pick(["", "+", "-"]);
    lit += String(pick([randInt(10), randInt(30), randInt(400)]));
  }
  add(`random number ${n}`, `{"n":${lit}}`, ["/n", "n"]);
}

// ---- numbers: String(x) for doubles --------------------------------------

const numbers = [];
const addNumber = (x) => numbers.push({ bits: bitsHex(x), string: String(x) });
for (const x of [
  0, -0, 1, -1, 0.1, 0.2, 0.1 + 0.2, 1 / 3, 2 / 3, 100, 1e20, 1e21, 1e-6,
  1e-7, 1.5e-7, 123e-20, 1.2345e25, 5e-324, -5e-324, 2.2250738585072014e-308,
  2.225073858507201e-308, Number.MAX_VALUE, Number.MIN_VALUE,
  Number.MAX_SAFE_INTEGER, 2 ** 53, 2 ** 53 + 2, 2 ** 64, 2 ** 70, 2 ** 69,
  999999999999999900000, 999999999999999999999, 1e21 - 65536, 123456789012345680000,
  0.000001, 0.0000011, 0.00000099, 4.35, 0.5, 1.0000000000000002, 9.5367431640625e-7,
  NaN, Infinity, -Infinity, 1e308, 1e-308, 1e-323, 1.7976931348623157e308,
]) addNumber(x);
for (let n = 0; n < 3000; n++) {
  const hi = randInt(0x100000000), lo = randInt(0x100000000);
  const hex = hi.toString(16).padStart(8, "0") + lo.toString(16).padStart(8, "0");
  const x = fromBits(hex);
  if (Number.isNaN(x)) continue;
  addNumber(x);
}
for (let n = 0; n < 1000; n++) {
  // Around the notation thresholds and with few digits.
  const exp = pick([-8, -7, -6, -5, 19, 20, 21, 22]) + randInt(3) - 1;
  addNumber(Number(`${digits(1 + randInt(17), true)}e${exp - randInt(17)}`));
  addNumber(randInt(1000) / pick([1, 10, 100, 1000, 3, 7]));
}

const numberTexts = numberLiterals.map((text) => {
  const x = JSON.parse(text);
  return { text, bits: bitsHex(x), string: String(x) };
});

// ---- strings: JSON.parse and JSON.stringify of string literals ------------

const strings = [];
for (const json of [...stringLiterals, ...Array.from({ length: 300 }, () =>
  quoteRandomly(randomUnits(1 + randInt(10))))]) {
  const v = JSON.parse(json);
  strings.push({ json, valueHex: wtf8Hex(v), stringify: JSON.stringify(v) });
}

process.stdout.write(JSON.stringify({ cases, numbers, numberTexts, strings }, null, 1) + "\n");
