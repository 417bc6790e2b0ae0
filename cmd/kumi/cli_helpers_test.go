package main

import "strconv"

// itoa is strconv.Itoa, for the tests' expected output.
func itoa(i int) string { return strconv.Itoa(i) }
