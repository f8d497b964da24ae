//go:build nodemo

package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/exitcode"
)

// The production builds (the container image, make build) leave the demo
// and its in-process registry out: see demo.go.
func newDemoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Not in this build: run the demo from source with 'go run ./cmd/osimages demo'",
		Args:  cobra.ArbitraryArgs,
		RunE: func(*cobra.Command, []string) error {
			return exitcode.FailureError(errors.New("this osimages binary is built without the demo (-tags nodemo, as the container image and 'make build' are), so that no registry ships to management clusters; run the demo from a source checkout: go run ./cmd/osimages demo"))
		},
		DisableFlagParsing: true,
	}
}
