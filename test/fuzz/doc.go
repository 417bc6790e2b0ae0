// Package fuzz holds kumi's fuzz targets (run them with `make fuzz`, or
// `go test -fuzz FuzzParseStreamName ./test/fuzz/`); `go test` runs their
// committed seed corpora under testdata/fuzz/.
//
//   - FuzzParseStreamName: eventsource.ParseStreamName never panics, and a
//     name it accepts splits back into itself, with the cardinal id the
//     id's prefix before '+' and no control characters.
//   - FuzzHash: eventsource.Hash and BucketOfHash are deterministic, follow their
//     documented formula, and put every id in [0, n) for n in 1..1024. That
//     they equal the SQL cg_hash and cg_bucket is checked against a real
//     database by test/integration's TestHashMatchesSQL, to keep the fuzz
//     target pure.
//   - FuzzLeaseConfig: the group and lease option validation never panics
//     and, when it refuses, names the field.
//   - FuzzConnStringRedaction: a password put into a connection string,
//     broken or not, never appears in what dburl.Parse says of it
//     (the message every kumi command, the demo and the worker print), nor
//     in a failed connection's message passed through redact.Conn.
package fuzz
