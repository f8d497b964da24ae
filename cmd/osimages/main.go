// Command osimages manages the OS images that bare-metal Kubernetes nodes
// boot from, for Cluster API Provider Metal3 fleets built with Sylva.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sylva-projects/osimages/internal/exitcode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	root := newRootCommand()
	flagErrorsAreInputErrors(root)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(exitcode.Of(err))
	}
}
