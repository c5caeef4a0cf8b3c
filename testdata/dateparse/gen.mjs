// Writes testdata/dateparse/vectors.json: what JavaScript's Date.parse
// gives for timestamp strings (the TypeScript original validates state
// timestamps with Number.isFinite(Date.parse(s))), and what toISOString
// writes for instants across the whole range of Date.
//
// Regenerate from the repository root (node 18 or later; deterministic):
//
//   node testdata/dateparse/gen.mjs > testdata/dateparse/vectors.json
//
// Never edit the output by hand.

const inputs = new Set();
const years = ["2026", "0000", "9999", "1969", "1900", "2000", "2024", "+002026", "+010000", "-000001",
  "-000000", "+275760", "-271821", "+999999", "10000", "999", "+20260", "2026x"];
const dates = ["-01-01", "-02-28", "-02-29", "-02-30", "-04-31", "-12-31", "-13-01", "-00-10", "-01-00",
  "-09-13", "-04-20", "-04-19", "-1-01", ""];
const times = ["T00:00:00", "t00:00:00", " 00:00:00", "T23:59:59", "T23:59:60", "T24:00:00", "T00:60:00",
  "T00:00", "T0:00:00", "", "T12:34:56"];
const fracs = ["", ".5", ".123", ".123456789", ".", ",5"];
const zones = ["Z", "z", "+01:00", "-00:00", "+23:59", "+24:00", "+0100", "+01", "", " Z"];
for (const y of years) {
  for (const d of dates) {
    for (const tm of ["T00:00:00", "T12:34:56", ""]) {
      for (const z of ["Z", ""]) inputs.add(y + d + tm + z);
    }
  }
}
for (const y of ["2026", "+010000", "-000001"]) {
  for (const d of ["-01-01"]) {
    for (const tm of times) {
      for (const f of fracs) {
        for (const z of zones) inputs.add(y + d + tm + f + z);
      }
    }
  }
}
for (const s of ["", " ", "yesterday", "2026-11-30T10:00:02.000Z ", " 2026-11-30T10:00:02.000Z",
  "2026-11-30T10:00:02.000Z\n", "2026-11-30T10:00:02.-1Z", "+2026-01-01T00:00:00Z", "2026-11-30T10:00:02.000+01:00:00",
  "275760-09-13T00:00:00.000Z", "+275760-09-13T00:00:00.001Z", "-271821-04-19T23:59:59.999Z",
  "-271821-04-20T00:00:00.000Z", "+275760-09-13T00:00:00.000Z", "-271821-04-20T00:00:00.000+00:01",
  "+275760-09-12T23:59:59.999-00:01", "Mon, 30 Nov 2026 10:00:02 GMT", "2026/11/30", "1700000000000",
  "2026-11-30T10:00:02.000\u00a0Z", "２０２６-11-30T10:00:02.000Z"]) inputs.add(s);

const parse = [...inputs].sort().map((s) => {
  const ms = Date.parse(s);
  return { input: s, ms: Number.isFinite(ms) ? ms : null };
});

const isoMs = [-8.64e15, 8.64e15, 0, -1, 1, 253402300799999, 253402300800000, -62167219200000, -62167219200001,
  -62198755200000, 1764496802123, -2203891200000, 951782400000, -377705116800000, 4102444800000];
for (let i = 0; i < 64; i++) {
  // deterministic spread over the whole range
  isoMs.push(Math.round(-8.64e15 + (i * 2 * 8.64e15) / 63));
}
const iso = isoMs.map((ms) => ({ ms, iso: new Date(ms).toISOString() }));

// One vector a line, so that a regeneration diffs well.
const lines = (xs) => xs.map((x) => JSON.stringify(x)).join(",\n");
process.stdout.write(`{"parse":[\n${lines(parse)}\n],\n"toISOString":[\n${lines(iso)}\n]}\n`);
