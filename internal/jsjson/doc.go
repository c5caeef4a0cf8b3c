// Package jsjson reads and writes JSON the way JavaScript does: strings as
// JSON.stringify quotes them, numbers as Number.prototype.toString prints
// them, times as Date#toISOString writes them, JSON text as
// JSON.parse(new TextDecoder().decode(bytes)) reads it, and RFC 6901
// pointers as the TypeScript original's resolveJsonPointer follows them.
//
// # Why it exists
//
// The key layer shares its bucket with workers written in TypeScript: a key
// hash is the SHA-256 of the bytes JSON.stringify writes for the key's
// segments, and a key state is a document both sides read and write. So
// the bytes must be JavaScript's, byte for byte, where encoding/json
// differs: it escapes '<', '>', '&', U+2028 and U+2029, writes numbers in
// Go's notation (1e+21 versus 1e21, -0), replaces a lone surrogate escape
// ("\ud800") with U+FFFD, matches member names case-insensitively, and
// reads the first of duplicate members where JSON.parse reads the last.
// This package is that one piece of JavaScript behaviour; the root
// package's key derivation (DeriveKey) and key state codec (ParseState,
// appendState) are built on it and know the schema, this package does not.
//
// It holds:
//
//   - [AppendString], [AppendStringBytes], [AppendNumber]: JSON.stringify's
//     strings and JavaScript's numbers (format.go);
//   - [TimeWriter] and [ParseTime]: toISOString's times, and the RFC 3339
//     times Date.parse reads (time.go);
//   - [CheckText], [TrimBOM], [AppendStringValue] and the readers of checked
//     text ([SkipWS], [ValueEnd], [NextMember], ...): JSON.parse's grammar,
//     strings and numbers, nested at most [MaxDepth] deep (text.go);
//   - [Scanner]: a one-pass reader that checks the grammar as it goes, for
//     a decoder that knows which members it wants (scanner.go);
//   - [CheckPointer] and [Resolve]: JSON pointers over JSON text
//     (pointer.go);
//   - [CheckValueDepth]: the same depth limit for a Go value before
//     encoding/json marshals it (depth.go).
//
// # Strings are WTF-8
//
// Go strings here are read as WTF-8: a UTF-16 surrogate code point U+D800
// to U+DFFF encoded like any other three-byte code point (ED A0 80 to ED BF
// BF) stands for a lone surrogate, which JavaScript strings can hold and
// which AppendStringValue produces from escapes such as "\ud800", so that a
// state read and written back keeps it. Other invalid UTF-8 is read as the
// WHATWG decoder (JavaScript's TextDecoder) reads it: each maximal invalid
// subsequence is one U+FFFD.
//
// # Tests and speed
//
// Every writer and reader is checked against vectors real JavaScript wrote
// (testdata/keyhash_extra.json and testdata/dateparse/vectors.json at the
// module root) and against a simpler reference implementation or
// encoding/json; FuzzJSNumber and FuzzJSString explore further, and the
// root package's FuzzDecodeStateDifferential, FuzzEncodeStateDifferential
// and FuzzDeriveKey drive it through the key state codec and the key
// derivation.
//
// The fast paths (eight bytes at a time in strings, the date of the last
// time kept, the toISOString form read without the general parser, the
// expected member recognised without decoding its name) are what the key
// state codec's speed rests on; the root package's BenchmarkStateCodec and
// BenchmarkDeriveKey measure them:
//
//	go test -run '^$' -bench 'StateCodec|DeriveKey' -benchmem .
//
// Being in a package of their own costs nothing there: the small helpers
// are still inlined into their callers (go build -gcflags=-m), and
// AppendString and AppendStringBytes are kept out of line so that a
// caller's stack buffer stays on the stack.
package jsjson
