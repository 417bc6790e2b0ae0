// Command apisurface counts the exported identifiers of kumi's public
// packages: every package of the module outside internal/, cmd/,
// examples/, test/ and tools/. It counts what a user can name: exported
// constants, variables, functions and types, the exported methods of
// exported types, the exported fields of exported structs and the methods
// of exported interfaces. `make lint` runs it and prints the figures; with
// -max N it fails when the total is above N; -list PKG prints the names
// it counts in one package (Name, Type.Method, Type.Field), to find what to
// trim.
//
//	go run ./tools/apisurface [-max N] [dir]
//	go run ./tools/apisurface -list eventsource
package main
