package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/kumi-run/kumi/internal/worker"
)

func main() {
	cfg, err := worker.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "workerbin:", err)
		os.Exit(2)
	}
	if err := worker.Run(context.Background(), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "workerbin:", err)
		os.Exit(1)
	}
}
