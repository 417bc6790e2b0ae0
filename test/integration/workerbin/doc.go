// Command workerbin is the worker process of the fault and scale tests in
// test/integration: internal/worker's complete worker (a subscription group
// whose handler records every delivery in an idempotent sink table), built
// once per test run and started, killed, paused and restarted by the
// harness. It takes internal/worker's flags; run it with -h to list them.
package main
