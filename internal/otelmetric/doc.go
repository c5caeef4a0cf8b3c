// Package otelmetric is the OpenTelemetry metrics set-up both of
// jobkeys' instrumented packages share: which MeterProvider means "no
// metrics" ([Provider]), the bucket boundaries of their latency
// histograms ([DurationBuckets]), and the bounded cache of the attribute
// sets their measurements carry ([AttrSets]), so that a measurement with
// a set already seen allocates nothing.
//
// It is not in nats.go, nor in the OpenTelemetry API, because it is
// jobkeys' own policy: which attribute sets to keep and how many, and
// which latencies a KV round trip has. The root package (the key layer's
// instruments) and package jobs (the job stores') use this one copy; each
// keeps its own instruments, attribute keys and error classes.
package otelmetric
